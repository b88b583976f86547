//! The Raft log on disk: append-only segments, each append written and
//! flushed (`fdatasync`) in the call that makes it.
//!
//! openraft's core waits for each `append` before it does anything else, and
//! `append` here returns once its records are flushed, so appends never
//! overlap and a writer thread of the log's own could not group them: it only cost two wake-ups between threads per flush (on
//! this kind of 2-core virtual machine ~20 µs of CPU each, beside 50-70 µs
//! of system time for the `fdatasync` itself). Commands are grouped above
//! openraft instead: one entry
//! carries every command that arrived while the previous one was flushed
//! (`raft::batch`).
//!
//! A segment is a sequence of records `[len: u32][crc32: u32][bincode payload]`.
//! Truncation and purging are themselves records, so nothing is ever rewritten
//! in place; whole segments below the purge point are deleted. On open, a torn
//! record at the tail of the last segment (a crash mid-write) is cut off: it was
//! never acknowledged, because acknowledgement waits for the fsync after it.
//!
//! Segments are allocated at full size when they are created, so an append
//! writes into space the file already has and its `fdatasync` need not commit
//! a new file size to the filesystem journal (measured here: ~0.13 ms instead
//! of ~0.2 ms per flush). The unwritten rest of a segment reads as zeros; a
//! zero record length marks where the records end.
//!
//! Each segment's span of records (its lowest and highest entry index, its
//! lowest truncation point, its highest purge) is kept in memory, so that a
//! read of entries no longer in memory (a lagging follower catching up, one
//! append's worth at a time) replays only the segments that can hold them or
//! change them, not the whole log.
//!
//! The files sit on a [`LogDisk`]: a real directory ([`FsDisk`]), or the
//! simulation's disk, which loses unsynced writes on a crash, so the seeds
//! run this format and its crash rules too.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::OptionalSend;
use prometheus_client::metrics::histogram::Histogram;
use serde::{Deserialize, Serialize};

use super::disk::{FsDisk, LogDisk, LogFile};
use super::{Entry, LogId, TypeConfig, Vote};

/// A new segment is started once the current one passes this size. Small
/// enough that a purge after a snapshot frees most of the log promptly.
const SEGMENT_BYTES: u64 = 8 * 1024 * 1024;

/// How a record is read back. Written through [`RecordRef`], which has the
/// same variants in the same order and so the same encoding.
#[derive(Deserialize)]
enum Record {
    Entry(Entry),
    /// Entries at and after this index are gone.
    Truncate(u64),
    /// Entries up to and including this log id are gone (they are in a snapshot).
    Purge(LogId),
}

#[derive(Serialize)]
enum RecordRef<'a> {
    Entry(&'a Entry),
    Truncate(u64),
    Purge(LogId),
}

/// Applied entries kept in memory below the newest applied one; older ones
/// are read back from disk if ever asked for.
const APPLIED_KEPT_IN_MEMORY: u64 = 64;

/// What the log holds in memory: every entry not yet purged, except applied
/// ones below `memory_floor`, which are only on disk. (Between snapshots a
/// busy server appends ~100k commands; keeping them all cost ~10 MiB.)
#[derive(Default)]
struct Entries {
    entries: BTreeMap<u64, Entry>,
    last_purged: Option<LogId>,
    /// Entries below this index (and above `last_purged`) are on disk only.
    memory_floor: u64,
}

/// The Raft log store, on a real directory ([`FsDisk`]) or any other
/// [`LogDisk`]. Cheap to clone; clones share one log.
pub struct LogStore<D: LogDisk = FsDisk> {
    entries: Arc<Mutex<Entries>>,
    /// Taken by each write for as long as it writes and syncs.
    writer: Arc<tokio::sync::Mutex<Writer<D>>>,
    disk: Arc<D>,
    /// What each segment holds, so a read from disk replays only some.
    spans: Spans,
    /// Segments replayed by reads from disk (tests check it stays small).
    #[cfg(test)]
    segments_read: Arc<AtomicU64>,
    /// The highest index the state machine has applied (0: none yet).
    applied: Arc<AtomicU64>,
}

/// Records to write to the open segment.
struct Records {
    bytes: Vec<u8>,
    /// What the records in `bytes` touch.
    span: Span,
    /// The highest entry index in `bytes`, if it holds entries.
    last_index: Option<u64>,
    /// Segments wholly at or below this index may be deleted after the write.
    purge_upto: Option<u64>,
}

/// What a segment's records touch: the segment can matter to a read of
/// entries `[start, end]` only if it overlaps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    /// Lowest and highest entry index (`first > last`: no entries).
    first: u64,
    last: u64,
    /// Lowest truncation point (entries at and after it are gone).
    truncate_from: u64,
    /// Highest purge point (entries up to it are gone).
    purge_upto: Option<u64>,
}

impl Default for Span {
    fn default() -> Self {
        Span {
            first: u64::MAX,
            last: 0,
            truncate_from: u64::MAX,
            purge_upto: None,
        }
    }
}

impl Span {
    fn entry(&mut self, index: u64) {
        self.first = self.first.min(index);
        self.last = self.last.max(index);
    }

    fn truncate(&mut self, since: u64) {
        self.truncate_from = self.truncate_from.min(since);
    }

    fn purge(&mut self, upto: u64) {
        self.purge_upto = self.purge_upto.max(Some(upto));
    }

    fn record(&mut self, record: &Record) {
        match record {
            Record::Entry(e) => self.entry(e.log_id.index),
            Record::Truncate(since) => self.truncate(*since),
            Record::Purge(id) => self.purge(id.index),
        }
    }

    fn merge(&mut self, other: Span) {
        self.first = self.first.min(other.first);
        self.last = self.last.max(other.last);
        self.truncate_from = self.truncate_from.min(other.truncate_from);
        self.purge_upto = self.purge_upto.max(other.purge_upto);
    }

    /// Whether a read of entries `start..=end` must replay this segment.
    fn matters(&self, start: u64, end: u64) -> bool {
        (self.first <= end && self.last >= start)
            || self.truncate_from <= end
            || self.purge_upto.is_some_and(|p| p >= start)
    }
}

impl<D: LogDisk> Clone for LogStore<D> {
    fn clone(&self) -> Self {
        LogStore {
            entries: self.entries.clone(),
            writer: self.writer.clone(),
            disk: self.disk.clone(),
            spans: self.spans.clone(),
            #[cfg(test)]
            segments_read: self.segments_read.clone(),
            applied: self.applied.clone(),
        }
    }
}

/// Every segment's span, by segment number; shared by the writer (which
/// extends it) and readers.
type Spans = Arc<Mutex<BTreeMap<u64, Span>>>;

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

fn encode(record: &RecordRef<'_>, out: &mut Vec<u8>) -> io::Result<()> {
    let payload = bincode::serialize(record).map_err(io_err)?;
    let len = u32::try_from(payload.len()).map_err(io_err)?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(())
}

fn segment_name(number: u64) -> String {
    format!("{number:020}.seg")
}

/// The numbers of the segment files on `disk`, in order.
fn segment_numbers(disk: &impl LogDisk) -> io::Result<Vec<u64>> {
    let mut numbers: Vec<u64> = disk
        .list()?
        .iter()
        .filter_map(|name| name.strip_suffix(".seg")?.parse().ok())
        .collect();
    numbers.sort_unstable();
    Ok(numbers)
}

/// Applies one record to `entries`, keeping only entries whose index is
/// `wanted`. Returns the log id of a purge.
fn replay_into(
    entries: &mut BTreeMap<u64, Entry>,
    record: Record,
    wanted: impl Fn(u64) -> bool,
) -> Option<LogId> {
    match record {
        Record::Entry(entry) => {
            if wanted(entry.log_id.index) {
                entries.insert(entry.log_id.index, entry);
            }
            None
        }
        Record::Truncate(since) => {
            entries.split_off(&since);
            None
        }
        Record::Purge(log_id) => {
            *entries = entries.split_off(&(log_id.index + 1));
            Some(log_id)
        }
    }
}

impl LogStore<FsDisk> {
    /// Opens (or creates) the log under the data dir `dir`, replaying what
    /// is there.
    pub fn open(dir: &Path) -> io::Result<LogStore<FsDisk>> {
        LogStore::open_observed(dir, Histogram::new(std::iter::empty()))
    }

    /// [`LogStore::open`], recording the time of each fsync in `fsync`.
    pub fn open_observed(dir: &Path, fsync: Histogram) -> io::Result<LogStore<FsDisk>> {
        LogStore::open_with(FsDisk::open(dir)?, fsync)
    }
}

impl<D: LogDisk> LogStore<D> {
    /// Opens (or creates) the log on `disk`, replaying what is there.
    pub fn open_on(disk: D) -> io::Result<LogStore<D>> {
        LogStore::open_with(disk, Histogram::new(std::iter::empty()))
    }

    /// [`LogStore::open_on`], recording the time of each fsync in `fsync`.
    fn open_with(disk: D, fsync: Histogram) -> io::Result<LogStore<D>> {
        let disk = Arc::new(disk);
        let numbers = segment_numbers(&*disk)?;
        let mut state = Entries::default();
        // (segment number, highest entry index written to it, bytes of records)
        let mut segments: Vec<(u64, u64, u64)> = Vec::new();
        let mut spans = BTreeMap::new();
        for (i, &number) in numbers.iter().enumerate() {
            let name = segment_name(number);
            let is_last = i + 1 == numbers.len();
            let mut highest = 0;
            let mut span = Span::default();
            let replayed = replay_segment(&*disk, &name, is_last, |record| {
                span.record(&record);
                if let Record::Entry(entry) = &record {
                    highest = highest.max(entry.log_id.index);
                }
                if let Some(purged) = replay_into(&mut state.entries, record, |_| true) {
                    state.last_purged = Some(purged);
                }
            })?;
            if is_last && !replayed.zeros_after {
                // A torn write, or parts of an unacknowledged one: cut it
                // all, so nothing of it can be read as a record once new
                // records are written over the start of it.
                tracing::warn!(segment = %name, at = replayed.records_end, "cutting a torn record off the log tail");
                disk.open(&name, 0)?.cut(replayed.records_end)?;
            }
            segments.push((number, highest, replayed.records_end));
            spans.insert(number, span);
        }

        // Segments wholly covered by the purge point (a snapshot) are dead
        // weight for the next start: delete them now, never the last one.
        if let Some(purged) = state.last_purged {
            while segments.len() > 1 && segments[0].1 <= purged.index {
                let (number, _, _) = segments.remove(0);
                disk.remove(&segment_name(number))?;
                spans.remove(&number);
            }
        }

        let (number, file, size) = match segments.last() {
            Some(&(number, _, size)) => {
                let file = disk.open(&segment_name(number), SEGMENT_BYTES)?;
                (number, file, size)
            }
            None => {
                let file = disk.create(&segment_name(1), SEGMENT_BYTES)?;
                segments.push((1, 0, 0));
                spans.insert(1, Span::default());
                (1, file, 0)
            }
        };
        let spans: Spans = Arc::new(Mutex::new(spans));
        let writer = Writer {
            disk: disk.clone(),
            file,
            number,
            size,
            segments: segments.into_iter().map(|(n, h, _)| (n, h)).collect(),
            spans: spans.clone(),
            fsync,
            failed: None,
        };

        Ok(LogStore {
            entries: Arc::new(Mutex::new(state)),
            writer: Arc::new(tokio::sync::Mutex::new(writer)),
            disk,
            spans,
            #[cfg(test)]
            segments_read: Arc::new(AtomicU64::new(0)),
            applied: Arc::new(AtomicU64::new(0)),
        })
    }

    /// How many entries the log holds in memory.
    #[cfg(test)]
    pub fn entries_in_memory(&self) -> usize {
        self.lock().entries.len()
    }

    /// Where the state machine reports the highest index it has applied, so
    /// that applied entries can leave memory.
    pub fn applied_index(&self) -> Arc<AtomicU64> {
        self.applied.clone()
    }

    /// Reads the entries of `range` from the segment files, for the rare
    /// reader that wants applied entries no longer in memory. Replays only
    /// the segments whose span can hold or change those entries.
    fn read_from_disk(&self, range: impl RangeBounds<u64>) -> io::Result<Vec<Entry>> {
        use std::ops::Bound;
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&0) => return Ok(Vec::new()),
            Bound::Excluded(&i) => i - 1,
            Bound::Unbounded => u64::MAX,
        };
        let numbers: Vec<u64> = {
            let spans = self.spans.lock();
            spans
                .iter()
                .filter(|(_, span)| span.matters(start, end))
                .map(|(&n, _)| n)
                .collect()
        };
        let last = segment_numbers(&*self.disk)?.last().copied();
        let mut found = BTreeMap::new();
        for number in numbers {
            #[cfg(test)]
            self.segments_read.fetch_add(1, Ordering::Relaxed);
            let replayed = replay_segment(
                &*self.disk,
                &segment_name(number),
                Some(number) == last,
                |record| {
                    replay_into(&mut found, record, |index| range.contains(&index));
                },
            );
            match replayed {
                Ok(_) => {}
                // Purged (deleted) while we listed: its entries are gone anyway.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(found.into_values().collect())
    }

    /// How many segments reads from disk have replayed so far.
    #[cfg(test)]
    pub fn segments_read(&self) -> u64 {
        self.segments_read.load(Ordering::Relaxed)
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Entries> {
        self.entries.lock()
    }

    /// Writes records and flushes them: durable when this returns `Ok`.
    async fn write(&self, write: Records) -> io::Result<()> {
        self.writer.lock().await.write(write).await
    }
}

/// Where a segment's intact records end, and whether only zeros follow.
struct Replayed {
    records_end: u64,
    zeros_after: bool,
}

/// Reads a segment's records in order.
fn replay_segment(
    disk: &impl LogDisk,
    name: &str,
    is_last: bool,
    f: impl FnMut(Record),
) -> io::Result<Replayed> {
    let bytes = disk.read(name)?;
    let end = replay_records(name, &bytes, is_last, f)?;
    Ok(Replayed {
        records_end: end,
        zeros_after: bytes[end as usize..].iter().all(|&b| b == 0),
    })
}

/// Returns the length of the intact prefix of `bytes`.
fn replay_records(
    name: &str,
    bytes: &[u8],
    is_last: bool,
    mut f: impl FnMut(Record),
) -> io::Result<u64> {
    let mut at = 0usize;
    loop {
        let rest = &bytes[at..];
        if rest.is_empty() {
            return Ok(at as u64);
        }
        let torn = || -> io::Result<u64> {
            if is_last {
                Ok(at as u64)
            } else {
                Err(io_err(format!(
                    "corrupt record in log segment {name} at byte {at}"
                )))
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
        let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        let Some(payload) = rest.get(8..8 + len) else {
            return torn();
        };
        if crc32fast::hash(payload) != crc {
            return torn();
        }
        match bincode::deserialize::<Record>(payload) {
            Ok(record) => f(record),
            Err(_) => return torn(),
        }
        at += 8 + len;
    }
}

/// Owns the open segment.
struct Writer<D: LogDisk> {
    disk: Arc<D>,
    file: D::File,
    number: u64,
    size: u64,
    segments: Vec<(u64, u64)>,
    spans: Spans,
    fsync: Histogram,
    /// Why a write failed, once one has: nothing is written after it.
    failed: Option<String>,
}

impl<D: LogDisk> Writer<D> {
    async fn write(&mut self, write: Records) -> io::Result<()> {
        if let Some(why) = &self.failed {
            return Err(io_err(format!(
                "the raft log is read-only after a failed write: {why}"
            )));
        }
        let result = self.write_and_flush(write).await;
        if let Err(e) = &result {
            // After a failed fsync the kernel may have dropped dirty pages;
            // nothing written after it can be trusted. Stop accepting writes.
            tracing::error!(error = %e, "writing the raft log failed; the log is now read-only");
            self.failed = Some(e.to_string());
        }
        result
    }

    async fn write_and_flush(&mut self, write: Records) -> io::Result<()> {
        let Records {
            bytes,
            span,
            last_index,
            purge_upto,
        } = write;
        if !bytes.is_empty() {
            self.file.write_at(self.size, &bytes)?;
            let syncing = std::time::Instant::now();
            self.file.sync().await?;
            self.fsync.observe(syncing.elapsed().as_secs_f64());
            self.size += bytes.len() as u64;
            if let (Some(h), Some(last)) = (last_index, self.segments.last_mut()) {
                last.1 = last.1.max(h);
            }
            self.spans().entry(self.number).or_default().merge(span);
        }
        if let Some(upto) = purge_upto {
            // Delete whole segments that hold nothing above the purge point,
            // never the open one.
            while self.segments.len() > 1 && self.segments[0].1 <= upto {
                let (number, _) = self.segments.remove(0);
                self.disk.remove(&segment_name(number))?;
                self.spans().remove(&number);
            }
        }
        if self.size >= SEGMENT_BYTES {
            let number = self.number + 1;
            self.file = self.disk.create(&segment_name(number), SEGMENT_BYTES)?;
            self.number = number;
            self.size = 0;
            self.segments.push((number, 0));
            self.spans().insert(number, Span::default());
        }
        Ok(())
    }

    fn spans(&self) -> parking_lot::MutexGuard<'_, BTreeMap<u64, Span>> {
        self.spans.lock()
    }
}

impl<D: LogDisk> RaftLogReader<TypeConfig> for LogStore<D> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<Entry>> {
        let (from_memory, floor) = {
            let state = self.lock();
            let entries: Vec<_> = state
                .entries
                .range(range.clone())
                .map(|(_, e)| e.clone())
                .collect();
            (entries, state.memory_floor)
        };
        let starts_below_floor = match range.start_bound() {
            std::ops::Bound::Included(&i) => i < floor,
            std::ops::Bound::Excluded(&i) => i.saturating_add(1) < floor,
            std::ops::Bound::Unbounded => floor > 0,
        };
        if !starts_below_floor {
            return Ok(from_memory);
        }
        // Only what the range asks for, below the floor.
        use std::ops::Bound;
        let end = match range.end_bound() {
            Bound::Included(&i) if i < floor => Bound::Included(i),
            Bound::Excluded(&i) if i < floor => Bound::Excluded(i),
            _ => Bound::Excluded(floor),
        };
        let below = (range.start_bound().cloned(), end);
        let mut entries = self.read_from_disk(below)?;
        entries.retain(|e| range.contains(&e.log_id.index));
        entries.extend(from_memory.into_iter().filter(|e| e.log_id.index >= floor));
        Ok(entries)
    }

    async fn read_vote(&mut self) -> io::Result<Option<Vote>> {
        match self.disk.read_vote()? {
            Some(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| io_err(format!("the vote file is not a vote: {e}"))),
            None => Ok(None),
        }
    }
}

impl<D: LogDisk> RaftLogStorage<TypeConfig> for LogStore<D> {
    type LogReader = LogStore<D>;

    async fn get_log_state(&mut self) -> io::Result<LogState<TypeConfig>> {
        let state = self.lock();
        let last = state.entries.last_key_value().map(|(_, e)| e.log_id);
        Ok(LogState {
            last_purged_log_id: state.last_purged,
            last_log_id: last.or_else(|| state.last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    /// Durable when it returns, and so is every write before it: each write
    /// is flushed before the next one starts.
    async fn save_vote(&mut self, vote: &Vote) -> io::Result<()> {
        let bytes = serde_json::to_vec(vote).map_err(io_err)?;
        // Taken so that no log write is in flight beside the vote's.
        let writer = self.writer.lock().await;
        if let Some(why) = &writer.failed {
            return Err(io_err(format!(
                "the raft log is read-only after a failed write: {why}"
            )));
        }
        self.disk.write_vote(&bytes)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut bytes = Vec::new();
        let mut last_index = None;
        let mut span = Span::default();
        {
            let mut state = self.lock();
            for entry in entries {
                encode(&RecordRef::Entry(&entry), &mut bytes)?;
                last_index = Some(entry.log_id.index);
                span.entry(entry.log_id.index);
                state.entries.insert(entry.log_id.index, entry);
            }
            // Applied entries are durable and in the state machine: let all
            // but the newest few leave memory.
            let floor = self
                .applied
                .load(Ordering::Relaxed)
                .saturating_sub(APPLIED_KEPT_IN_MEMORY);
            if floor > state.memory_floor
                && state
                    .entries
                    .first_key_value()
                    .is_some_and(|(&i, _)| i < floor)
            {
                state.entries = state.entries.split_off(&floor);
                state.memory_floor = floor;
            }
        }
        let written = self
            .write(Records {
                bytes,
                span,
                last_index,
                purge_upto: None,
            })
            .await;
        let answer = written
            .as_ref()
            .map(|_| ())
            .map_err(|e| io::Error::new(e.kind(), e.to_string()));
        callback.io_completed(answer);
        written
    }

    async fn truncate_after(&mut self, last_kept: Option<LogId>) -> io::Result<()> {
        let from = last_kept.map_or(0, |l| l.index + 1);
        self.lock().entries.split_off(&from);
        let mut bytes = Vec::new();
        encode(&RecordRef::Truncate(from), &mut bytes)?;
        let mut span = Span::default();
        span.truncate(from);
        self.write(Records {
            bytes,
            span,
            last_index: None,
            purge_upto: None,
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId) -> io::Result<()> {
        let index = log_id.index;
        let mut bytes = Vec::new();
        encode(&RecordRef::Purge(log_id), &mut bytes)?;
        {
            let mut state = self.lock();
            state.entries = state.entries.split_off(&(index + 1));
            state.last_purged = Some(log_id);
        }
        let mut span = Span::default();
        span.purge(index);
        self.write(Records {
            bytes,
            span,
            last_index: None,
            purge_upto: Some(index),
        })
        .await
    }
}

/// openraft's storage conformance suite, run against our log store and state
/// machine, plus the crash cases specific to our on-disk format.
#[cfg(test)]
mod storage_tests {
    use std::sync::Arc;

    use openraft::storage::{RaftLogReader, RaftLogStorage, RaftLogStorageExt};
    use openraft::testing::log::{StoreBuilder, Suite};
    use openraft::{EntryPayload, StorageError};

    use super::LogStore;
    use crate::raft::snapshot_store::{FileSnapshots, MemorySnapshots, SnapshotStore};
    use crate::raft::state_machine::StateMachine;
    use crate::raft::{CommittedLeaderId, Entry, LogId, TypeConfig};

    /// The log on disk, with the snapshot in a file or in memory.
    struct Builder {
        snapshots_in_memory: bool,
    }

    impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
        async fn build(
            &self,
        ) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<TypeConfig>> {
            let dir = tempfile::tempdir().expect("tempdir");
            let log = LogStore::open(dir.path()).expect("open log");
            let snapshots: Arc<dyn SnapshotStore> = if self.snapshots_in_memory {
                Arc::new(MemorySnapshots::default())
            } else {
                Arc::new(FileSnapshots::in_dir(dir.path()))
            };
            let sm = StateMachine::open(snapshots, Arc::default(), 1_000, log.applied_index())
                .expect("open state machine");
            Ok((dir, log, sm))
        }
    }

    #[tokio::test]
    async fn openraft_storage_suite() {
        Suite::test_all(Builder {
            snapshots_in_memory: false,
        })
        .await
        .expect("storage suite, snapshots in a file");
        Suite::test_all(Builder {
            snapshots_in_memory: true,
        })
        .await
        .expect("storage suite, snapshots in memory");
    }

    fn blank(index: u64) -> Entry {
        Entry {
            log_id: LogId::new(
                CommittedLeaderId {
                    term: 1,
                    node_id: 1,
                },
                index,
            ),
            payload: EntryPayload::Blank,
        }
    }

    async fn append(log: &mut LogStore, entries: Vec<Entry>) {
        log.blocking_append(entries)
            .await
            .expect("append and flush");
    }

    fn only_segment(dir: &std::path::Path) -> std::path::PathBuf {
        std::fs::read_dir(dir.join("log"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path()
    }

    /// The byte ranges of the records at the start of a segment (it is
    /// preallocated, so the file is longer than its records).
    fn record_spans(bytes: &[u8]) -> Vec<std::ops::Range<usize>> {
        let mut spans = Vec::new();
        let mut at = 0;
        while at + 8 <= bytes.len() {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            if len == 0 {
                break;
            }
            spans.push(at..at + 8 + len);
            at += 8 + len;
        }
        spans
    }

    async fn indexes(log: &mut LogStore) -> Vec<u64> {
        let entries = log.try_get_log_entries(..).await.unwrap();
        entries.iter().map(|e| e.log_id.index).collect()
    }

    #[tokio::test]
    async fn a_torn_tail_is_cut_and_everything_before_it_survives() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let mut log = LogStore::open(dir.path()).expect("open");
            append(&mut log, (1..=10).map(blank).collect()).await;
        }
        // A crash mid-write leaves half a record after the last whole one.
        let seg = only_segment(dir.path());
        let mut bytes = std::fs::read(&seg).unwrap();
        let whole = record_spans(&bytes).last().unwrap().end;
        bytes[whole..whole + 7].copy_from_slice(&[200, 0, 0, 0, 1, 2, 3]);
        std::fs::write(&seg, &bytes).unwrap();

        let mut log = LogStore::open(dir.path()).expect("reopen");
        let after = std::fs::read(&seg).unwrap();
        assert_eq!(&after[..whole], &bytes[..whole]);
        assert!(
            after[whole..].iter().all(|&b| b == 0),
            "the torn record is cut"
        );
        assert_eq!(indexes(&mut log).await, (1..=10).collect::<Vec<_>>());
        // And the log keeps working after the cut.
        append(&mut log, vec![blank(11)]).await;
        drop(log);
        let mut log = LogStore::open(dir.path()).expect("reopen again");
        assert_eq!(indexes(&mut log).await, (1..=11).collect::<Vec<_>>());
    }

    /// A crash can persist the end of an unacknowledged write but not its
    /// start. Records written later over that start must not join up with
    /// the stale remainder.
    #[tokio::test]
    async fn a_stale_record_behind_a_gap_is_never_replayed() {
        let donor = tempfile::tempdir().expect("tempdir");
        {
            let mut log = LogStore::open(donor.path()).expect("open");
            append(&mut log, (1..=12).map(blank).collect()).await;
        }
        let donor_bytes = std::fs::read(only_segment(donor.path())).unwrap();
        let donor_spans = record_spans(&donor_bytes);
        let (eleven, twelve) = (donor_spans[10].clone(), donor_spans[11].clone());

        let dir = tempfile::tempdir().expect("tempdir");
        {
            let mut log = LogStore::open(dir.path()).expect("open");
            append(&mut log, (1..=10).map(blank).collect()).await;
        }
        let seg = only_segment(dir.path());
        let mut bytes = std::fs::read(&seg).unwrap();
        let end = record_spans(&bytes).last().unwrap().end;
        // Entry 11's bytes never reached the disk; entry 12's did.
        let twelve_at = end + eleven.len();
        bytes[twelve_at..twelve_at + twelve.len()].copy_from_slice(&donor_bytes[twelve]);
        std::fs::write(&seg, &bytes).unwrap();

        let mut log = LogStore::open(dir.path()).expect("reopen");
        assert_eq!(indexes(&mut log).await, (1..=10).collect::<Vec<_>>());
        append(&mut log, vec![blank(11)]).await;
        drop(log);
        let mut log = LogStore::open(dir.path()).expect("reopen again");
        assert_eq!(indexes(&mut log).await, (1..=11).collect::<Vec<_>>());
    }

    fn big(index: u64) -> Entry {
        let command = leasehold_core::Command::SaveCheckpoint {
            key: format!("k{index}"),
            fence: index,
            data: vec![index as u8; 64 * 1024],
        };
        Entry {
            log_id: LogId::new(
                CommittedLeaderId {
                    term: 1,
                    node_id: 1,
                },
                index,
            ),
            payload: EntryPayload::Normal(crate::raft::Request {
                stamp: leasehold_core::Stamp { now: 0, epoch: 1 },
                commands: vec![command],
            }),
        }
    }

    fn segment_count(dir: &std::path::Path) -> usize {
        std::fs::read_dir(dir.join("log")).unwrap().count()
    }

    #[tokio::test]
    async fn segments_roll_over_and_purged_ones_are_deleted() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let mut log = LogStore::open(dir.path()).expect("open");
            // 300 x 64 KiB: more than two 8 MiB segments.
            for chunk in (1..=300).collect::<Vec<u64>>().chunks(20) {
                append(&mut log, chunk.iter().map(|&i| big(i)).collect()).await;
            }
            assert_eq!(segment_count(dir.path()), 3);
            log.purge(big(280).log_id).await.unwrap();
            // Flushed after the purge, so the purge is done when it returns.
            append(&mut log, vec![big(301)]).await;
        }
        assert_eq!(
            segment_count(dir.path()),
            1,
            "segments below the purge point are deleted"
        );
        let mut log = LogStore::open(dir.path()).expect("reopen");
        assert_eq!(indexes(&mut log).await, (281..=301).collect::<Vec<_>>());
        let entries = log.try_get_log_entries(300..301).await.unwrap();
        assert_eq!(
            format!("{:?}", entries[0].payload),
            format!("{:?}", big(300).payload)
        );
        append(&mut log, vec![big(302)]).await;
        drop(log);
        let mut log = LogStore::open(dir.path()).expect("reopen again");
        assert_eq!(indexes(&mut log).await, (281..=302).collect::<Vec<_>>());
    }

    /// A lagging follower reads applied entries back one append at a time:
    /// each read replays the segments that hold them, not the whole log.
    #[tokio::test]
    async fn a_read_from_disk_replays_only_the_segments_it_needs() {
        use std::sync::atomic::Ordering;
        let dir = tempfile::tempdir().expect("tempdir");
        let mut log = LogStore::open(dir.path()).expect("open");
        for chunk in (1..=300).collect::<Vec<u64>>().chunks(20) {
            append(&mut log, chunk.iter().map(|&i| big(i)).collect()).await;
        }
        assert_eq!(segment_count(dir.path()), 3);
        log.applied_index().store(300, Ordering::Relaxed);
        append(&mut log, vec![big(301)]).await;
        assert!(log.entries_in_memory() < 100, "applied entries left memory");

        let before = log.segments_read();
        let got = log.try_get_log_entries(10..12).await.unwrap();
        assert_eq!(
            got.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
            vec![10, 11]
        );
        assert_eq!(
            format!("{:?}", got[0].payload),
            format!("{:?}", big(10).payload)
        );
        assert_eq!(log.segments_read() - before, 1, "one segment holds them");

        let before = log.segments_read();
        let got = log.try_get_log_entries(120..140).await.unwrap();
        assert_eq!(got.len(), 20);
        assert!(log.segments_read() - before <= 2);

        // Reopened, the spans are rebuilt from the files.
        drop(log);
        let mut log = LogStore::open(dir.path()).expect("reopen");
        log.applied_index().store(301, Ordering::Relaxed);
        append(&mut log, vec![big(302)]).await;
        let got = log.try_get_log_entries(150..152).await.unwrap();
        assert_eq!(
            got.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
            vec![150, 151]
        );
        assert_eq!(log.segments_read(), 1);
    }

    #[tokio::test]
    async fn applied_entries_leave_memory_and_are_read_back_from_disk() {
        use std::sync::atomic::Ordering;
        let dir = tempfile::tempdir().expect("tempdir");
        let mut log = LogStore::open(dir.path()).expect("open");
        append(&mut log, (1..=200).map(blank).collect()).await;
        log.truncate_after(Some(blank(189).log_id)).await.unwrap();
        log.purge(blank(5).log_id).await.unwrap();
        log.applied_index().store(180, Ordering::Relaxed);
        append(&mut log, (190..=210).map(blank).collect()).await;
        let in_memory = log.entries_in_memory();
        assert!(
            in_memory < 100,
            "applied entries stay in memory: {in_memory}"
        );
        // Every entry not purged is still there, from disk or from memory,
        // with the truncation and the purge applied.
        assert_eq!(indexes(&mut log).await, (6..=210).collect::<Vec<_>>());
        let some = log.try_get_log_entries(10..20).await.unwrap();
        assert_eq!(
            some.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
            (10..20).collect::<Vec<_>>()
        );
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id.map(|l| l.index), Some(210));
    }

    /// A write that fails (here: the segment swapped for a read-only handle)
    /// is reported, and the log then refuses every later write, even once
    /// the disk would take it: after a failed fsync the page cache cannot be
    /// trusted to hold what was written before.
    #[tokio::test]
    async fn after_a_failed_write_the_log_takes_no_more() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut log = LogStore::open(dir.path()).expect("open");
        append(&mut log, vec![blank(1)]).await;
        let read_only = std::fs::File::open(only_segment(dir.path())).unwrap();
        let good = std::mem::replace(
            &mut log.writer.lock().await.file,
            crate::raft::disk::FsFile(read_only),
        );
        assert!(log.blocking_append(vec![blank(2)]).await.is_err());
        log.writer.lock().await.file = good;
        assert!(
            log.blocking_append(vec![blank(2)]).await.is_err(),
            "a write after a failed one was taken"
        );
        assert!(log.purge(blank(1).log_id).await.is_err());
    }

    #[tokio::test]
    async fn truncate_and_purge_survive_a_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let mut log = LogStore::open(dir.path()).expect("open");
            append(&mut log, (1..=10).map(blank).collect()).await;
            log.truncate_after(Some(blank(7).log_id)).await.unwrap();
            log.purge(blank(3).log_id).await.unwrap();
            append(&mut log, vec![blank(8)]).await;
        }
        let mut log = LogStore::open(dir.path()).expect("reopen");
        let indexes: Vec<u64> = log
            .try_get_log_entries(0..100)
            .await
            .unwrap()
            .iter()
            .map(|e| e.log_id.index)
            .collect();
        assert_eq!(indexes, vec![4, 5, 6, 7, 8]);
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id.map(|l| l.index), Some(3));
    }
}
