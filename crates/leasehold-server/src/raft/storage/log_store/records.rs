//! A segment's records: `[len: u32 LE][crc32: u32 LE][bincode payload]`,
//! one after another, then zeros (the preallocated rest of the file).
//!
//! Reading them back tells a torn tail from damage. A crash can leave the
//! last segment's last write cut short: part of a record (the rest of its
//! bytes zeros), or whole sectors of it missing, possibly with later
//! records of the same write on the disk. None of that was acknowledged,
//! since an acknowledgement waits for the flush after it, so it is cut
//! off. A damaged record with an intact record after it and no zeroed
//! sector in between is not a write cut short: the disk changed data that
//! was flushed (and perhaps acknowledged), and the log refuses to open,
//! naming the segment and the byte, rather than drop what follows it.

use std::io;

use serde::{Deserialize, Serialize};

use crate::raft::storage::disk::LogDisk;
use crate::raft::{Entry, LogId};

/// How a record is read back. Written through [`RecordRef`], which has the
/// same variants in the same order and so the same encoding.
#[derive(Deserialize)]
pub(crate) enum Record {
    Entry(Entry),
    /// Entries at and after this index are gone.
    Truncate(u64),
    /// Entries up to and including this log id are gone (they are in a snapshot).
    Purge(LogId),
}

#[derive(Serialize)]
pub(super) enum RecordRef<'a> {
    Entry(&'a Entry),
    Truncate(u64),
    Purge(LogId),
}

/// The unit a disk writes whole: a crash never leaves one half written.
const SECTOR: usize = 512;

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

pub(super) fn encode(record: &RecordRef<'_>, out: &mut Vec<u8>) -> io::Result<()> {
    let payload = bincode::serialize(record).map_err(io_err)?;
    let len = u32::try_from(payload.len()).map_err(io_err)?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(())
}

pub(crate) fn segment_name(number: u64) -> String {
    format!("{number:020}.seg")
}

/// The numbers of the segment files on `disk`, in order.
pub(crate) fn segment_numbers(disk: &impl LogDisk) -> io::Result<Vec<u64>> {
    let mut numbers: Vec<u64> = disk
        .list()?
        .iter()
        .filter_map(|name| name.strip_suffix(".seg")?.parse().ok())
        .collect();
    numbers.sort_unstable();
    Ok(numbers)
}

/// How a damaged record in the last segment is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tail {
    /// At open and in `check`: a torn tail is cut, other damage is an error
    /// (see the module doc).
    Strict,
    /// A read while the writer appends: the records end at the first one
    /// not yet whole (it is being written, past every flushed entry).
    Growing,
}

/// Where a segment's intact records end, and whether only zeros follow.
pub(crate) struct Replayed {
    pub records_end: u64,
    pub zeros_after: bool,
}

/// Reads a segment's records in order.
pub(crate) fn replay_segment(
    disk: &impl LogDisk,
    name: &str,
    is_last: bool,
    tail: Tail,
    f: impl FnMut(Record),
) -> io::Result<Replayed> {
    let bytes = disk.read(name)?;
    let end = replay_records(name, &bytes, is_last, tail, f)?;
    Ok(Replayed {
        records_end: end,
        zeros_after: bytes[end as usize..].iter().all(|&b| b == 0),
    })
}

/// Returns the length of the intact prefix of `bytes`; fails on a damaged
/// record that is not a torn tail (see the module doc).
pub(crate) fn replay_records(
    name: &str,
    bytes: &[u8],
    is_last: bool,
    tail: Tail,
    mut f: impl FnMut(Record),
) -> io::Result<u64> {
    let mut at = 0usize;
    loop {
        let rest = &bytes[at..];
        if rest.is_empty() {
            return Ok(at as u64);
        }
        let torn = || -> io::Result<u64> {
            if !is_last {
                return Err(io_err(format!(
                    "log segment {name} has a damaged record at byte {at}, and it is not the \
                     last segment: {}",
                    WHAT_TO_DO
                )));
            }
            if tail == Tail::Growing {
                return Ok(at as u64);
            }
            match intact_record_after(bytes, at) {
                Some(next) if !zeroed_sector_within(bytes, at, next) => Err(io_err(format!(
                    "log segment {name} has a damaged record at byte {at} and an intact one at \
                     byte {next} after it: {WHAT_TO_DO}"
                ))),
                _ => Ok(at as u64),
            }
        };
        if rest.len() < 8 {
            return torn();
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if len == 0 {
            // The preallocated, never written part of the segment (no record
            // is empty: each starts with its variant tag).
            return Ok(at as u64);
        }
        let Some(payload) = intact_payload(rest) else {
            return torn();
        };
        match bincode::deserialize::<Record>(payload) {
            Ok(record) => f(record),
            Err(_) => return torn(),
        }
        at += 8 + len;
    }
}

/// Every entry in the log of the data dir `dir`, read without opening the
/// log for writing: nothing is cut, moved or deleted, so a data dir that
/// must stay as it was (a survivor being recovered) can be read. The same
/// rules as an open: a damaged record is an error naming its segment and
/// byte, and a torn tail of the last segment ends the log.
pub(crate) fn read_log(
    dir: &std::path::Path,
) -> io::Result<std::collections::BTreeMap<u64, Entry>> {
    let log_dir = dir.join("log");
    let mut numbers = Vec::new();
    match std::fs::read_dir(&log_dir) {
        Ok(list) => {
            for item in list {
                let name = item?.file_name();
                let number = name
                    .to_str()
                    .and_then(|n| n.strip_suffix(".seg"))
                    .and_then(|n| n.parse::<u64>().ok());
                numbers.extend(number);
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    numbers.sort_unstable();
    let mut entries = std::collections::BTreeMap::new();
    for (i, number) in numbers.iter().enumerate() {
        let name = segment_name(*number);
        let bytes = std::fs::read(log_dir.join(&name))?;
        let is_last = i + 1 == numbers.len();
        replay_records(
            &name,
            &bytes,
            is_last,
            Tail::Strict,
            |record| match record {
                Record::Entry(entry) => {
                    entries.insert(entry.log_id.index, entry);
                }
                Record::Truncate(since) => {
                    entries.split_off(&since);
                }
                Record::Purge(log_id) => {
                    entries = entries.split_off(&(log_id.index + 1));
                }
            },
        )?;
    }
    Ok(entries)
}

/// What an operator does about a damaged log.
const WHAT_TO_DO: &str = "the disk changed data the log had flushed; if the other members \
     still form a majority, move this data dir aside and start the node empty to have the \
     leader rebuild it, or else restore a backup or recover from a survivor \
     (docs/operations.md), and check the disk";

/// The payload of the record at the start of `rest`, if its length fits
/// and its checksum matches.
fn intact_payload(rest: &[u8]) -> Option<&[u8]> {
    let len = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(rest.get(4..8)?.try_into().ok()?);
    let payload = rest.get(8..8usize.checked_add(len)?)?;
    (len > 0 && crc32fast::hash(payload) == crc).then_some(payload)
}

/// Where the first intact record after the damaged one at `at` starts.
fn intact_record_after(bytes: &[u8], at: usize) -> Option<usize> {
    (at + 1..bytes.len().saturating_sub(8)).find(|&p| {
        intact_payload(&bytes[p..])
            .is_some_and(|payload| bincode::deserialize::<Record>(payload).is_ok())
    })
}

/// Whether a whole sector of zeros lies in `bytes[from..to]`.
fn zeroed_sector_within(bytes: &[u8], from: usize, to: usize) -> bool {
    let first = from.div_ceil(SECTOR) * SECTOR;
    (first..to)
        .step_by(SECTOR)
        .take_while(|s| s + SECTOR <= to)
        .any(|s| bytes[s..s + SECTOR].iter().all(|&b| b == 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damage_before_an_intact_record_stops_an_open_but_only_ends_a_read() {
        let mut bytes = Vec::new();
        for n in 1..=3 {
            encode(&RecordRef::Truncate(n), &mut bytes).unwrap();
        }
        let second = bytes.len() / 3;
        bytes[second + 9] ^= 0x01;
        let err = replay_records("s", &bytes, true, Tail::Strict, |_| {}).unwrap_err();
        assert!(err.to_string().contains(&format!("byte {second}")), "{err}");
        let mut read = 0;
        let end = replay_records("s", &bytes, true, Tail::Growing, |_| read += 1).unwrap();
        assert_eq!((end as usize, read), (second, 1));
    }

    #[test]
    fn a_zeroed_sector_is_found_only_when_whole_and_inside() {
        let mut bytes = vec![1u8; 4 * SECTOR];
        bytes[SECTOR..2 * SECTOR].fill(0);
        assert!(zeroed_sector_within(&bytes, 0, 2 * SECTOR));
        assert!(!zeroed_sector_within(&bytes, 0, 2 * SECTOR - 1));
        assert!(!zeroed_sector_within(&bytes, SECTOR + 1, 4 * SECTOR));
    }
}
