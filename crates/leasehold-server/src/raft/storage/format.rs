//! Format versions: of a data dir, of the table's encoding (a snapshot's
//! content) and of the messages between peers.
//!
//! Each kind has its own number, raised when its encoding changes. A build
//! reads every version a release wrote (migrating on read where needed) and
//! refuses a newer one with a line naming both versions and what to do.
//! The rules, and which release wrote which version, are in
//! `docs/operations.md` (Upgrades) and `RELEASES.md`.
//!
//! - The data dir's version is in its `format` file. It covers the files
//!   read only where they were written: the log segments and the vote. A
//!   data dir written by release 0.1.0 has no such file; it holds version 1,
//!   and the file is added when it is opened.
//! - The table's encoding carries its version and a CRC-32 of its bytes in
//!   a header of its own, since it travels: to peers in snapshots, and to
//!   backups. An encoding without the header is one 0.1.0 wrote (version 1).
//! - A message between peers starts with its version.

use std::fs;
use std::io::{self, Read};
use std::path::Path;

use leasehold_core::LockTable;

/// The data dir format this build writes (log records and the vote).
pub const DATA_FORMAT: u32 = 1;

/// The table encoding this build writes.
pub const TABLE_FORMAT: u32 = 1;

/// The peer message format this build speaks. Release 0.1.0 (openraft 0.9)
/// sent its messages without a version, and they are not read.
pub const PEER_FORMAT: u16 = 2;

/// The version of this build, as releases are named.
pub const BUILD: &str = env!("CARGO_PKG_VERSION");

/// The name of the data dir's format file.
pub const FORMAT_FILE: &str = "format";

/// Starts an encoded table (and names it in a hex dump). As the first eight
/// bytes of an encoding without the header it would be a table time past
/// the year 10^8, so an encoding 0.1.0 wrote is never taken for one.
const TABLE_MAGIC: [u8; 8] = *b"LHTABLE\xff";

/// Bytes before the table's bincode: magic, version, CRC-32.
pub const TABLE_HEADER: usize = 16;

/// Starts a message between peers.
const PEER_MAGIC: [u8; 2] = *b"LH";

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// What a data dir's `format` file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirFormat {
    /// The data dir format of its files.
    pub format: u32,
    /// The build that last opened it (`None`: one from before the file,
    /// release 0.1.0).
    pub written_by: Option<String>,
}

/// Reads the format of the data dir `dir`: `None` when it is empty (or
/// absent), version 1 of release 0.1.0 when it holds a log, vote or
/// snapshot but no `format` file.
pub fn read_dir_format(dir: &Path) -> io::Result<Option<DirFormat>> {
    let path = dir.join(FORMAT_FILE);
    match fs::read_to_string(&path) {
        Ok(text) => parse_dir_format(&text)
            .map(Some)
            .map_err(|e| io_err(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let written = ["log", "vote", "snapshot"]
                .iter()
                .any(|name| dir.join(name).exists());
            Ok(written.then_some(DirFormat {
                format: 1,
                written_by: None,
            }))
        }
        Err(e) => Err(io_err(format!("read {}: {e}", path.display()))),
    }
}

pub(in crate::raft) fn parse_dir_format(text: &str) -> Result<DirFormat, String> {
    let mut format = None;
    let mut written_by = None;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match line.split_once(' ') {
            Some(("format", n)) => {
                format = Some(
                    n.trim()
                        .parse()
                        .map_err(|_| format!("`{line}` is not a format version"))?,
                )
            }
            Some(("written-by", v)) => written_by = Some(v.trim().to_string()),
            // A key a later build of the same format added: not ours to read.
            Some(_) => {}
            None => return Err(format!("`{line}` is not a line of a format file")),
        }
    }
    let format = format.ok_or_else(|| format!("no `format N` line in {:?}", text.trim()))?;
    Ok(DirFormat { format, written_by })
}

/// Checks that this build reads the data dir `dir`, and marks it with this
/// build's format (creating `dir` if needed). Fails, naming both versions,
/// on a data dir of a newer format.
pub fn open_data_dir(dir: &Path) -> io::Result<()> {
    fs::create_dir_all(dir)
        .map_err(|e| io_err(format!("create data dir {}: {e}", dir.display())))?;
    let found = read_dir_format(dir)?;
    if let Some(found) = &found {
        if found.format > DATA_FORMAT {
            return Err(io_err(format!(
                "data dir {} holds data dir format {} (written by leaseholdd {}); this build \
                 ({BUILD}) reads formats up to {DATA_FORMAT}: run that release or a later one on it",
                dir.display(),
                found.format,
                found.written_by.as_deref().unwrap_or("0.1.0"),
            )));
        }
    }
    let ours = DirFormat {
        format: DATA_FORMAT,
        written_by: Some(BUILD.to_string()),
    };
    if found.as_ref() != Some(&ours) || !dir.join(FORMAT_FILE).exists() {
        let text = format!("format {DATA_FORMAT}\nwritten-by {BUILD}\n");
        crate::raft::storage::disk::write_atomically(&dir.join(FORMAT_FILE), &[text.as_bytes()])
            .map_err(|e| io_err(format!("write {}: {e}", dir.join(FORMAT_FILE).display())))?;
    }
    Ok(())
}

/// Encodes `table` with its header: magic, [`TABLE_FORMAT`] and the CRC-32
/// of the bincode after it.
pub fn encode_table(table: &LockTable) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(TABLE_HEADER + 4096);
    out.extend_from_slice(&[0; TABLE_HEADER]);
    bincode::serialize_into(&mut out, table).map_err(io_err)?;
    let crc = crc32fast::hash(&out[TABLE_HEADER..]);
    out[..8].copy_from_slice(&TABLE_MAGIC);
    out[8..12].copy_from_slice(&TABLE_FORMAT.to_le_bytes());
    out[12..16].copy_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// Decodes a table that [`encode_table`] wrote, or one that 0.1.0 wrote
/// (bincode alone), checking the version and the checksum.
pub fn decode_table(bytes: &[u8]) -> io::Result<LockTable> {
    decode_table_from(bytes, bytes.len() as u64)
}

/// [`decode_table`] from a reader, without holding the bytes; the reader
/// must end where the table does, `len` bytes on. The table is decoded as
/// it streams, before its checksum can be known: no length inside it may
/// reach past `len`, so a damaged length is an error, never a huge
/// allocation.
pub fn decode_table_from(mut reader: impl Read, len: u64) -> io::Result<LockTable> {
    use bincode::Options;
    let bounded = || {
        bincode::DefaultOptions::new()
            .with_fixint_encoding()
            .allow_trailing_bytes()
            .with_limit(len)
    };
    let mut head = [0u8; TABLE_HEADER];
    let got = read_up_to(&mut reader, &mut head)?;
    if got < 8 || head[..8] != TABLE_MAGIC {
        // Written by 0.1.0: bincode alone.
        let table = bounded()
            .deserialize_from(io::Cursor::new(&head[..got]).chain(reader))
            .map_err(|e| io_err(format!("not a lock table: {e}")))?;
        return Ok(table);
    }
    if got < TABLE_HEADER {
        return Err(io_err("a lock table cut short in its header"));
    }
    let expected = header_checksum(&head)?;
    let mut hashing = Hashing {
        inner: reader,
        crc: crc32fast::Hasher::new(),
        read: 0,
    };
    let decoded: Result<LockTable, _> = bounded().deserialize_from(&mut hashing);
    // Whatever follows the table is checked too: it must be nothing.
    let mut rest = Vec::new();
    hashing.read_to_end(&mut rest)?;
    let (read, crc) = (hashing.read, hashing.crc.finalize());
    if crc != expected {
        return Err(checksum_failed(TABLE_HEADER as u64 + read, crc, expected));
    }
    let table = decoded.map_err(|e| io_err(format!("not a lock table: {e}")))?;
    if !rest.is_empty() {
        return Err(io_err(format!(
            "{} bytes follow the lock table: the data is corrupt",
            rest.len()
        )));
    }
    Ok(table)
}

/// Checks an encoded table's version and checksum without decoding it. An
/// encoding 0.1.0 wrote has neither, and passes: decoding it checks it.
pub fn check_table(bytes: &[u8]) -> io::Result<()> {
    if bytes.len() < 8 || bytes[..8] != TABLE_MAGIC {
        return Ok(());
    }
    let Some(head) = bytes.first_chunk::<TABLE_HEADER>() else {
        return Err(io_err("a lock table cut short in its header"));
    };
    let expected = header_checksum(head)?;
    let crc = crc32fast::hash(&bytes[TABLE_HEADER..]);
    if crc != expected {
        return Err(checksum_failed(bytes.len() as u64, crc, expected));
    }
    Ok(())
}

/// The checksum a table's header gives, once its version is one this build
/// reads.
fn header_checksum(head: &[u8; TABLE_HEADER]) -> io::Result<u32> {
    let format = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
    if format > TABLE_FORMAT {
        return Err(io_err(format!(
            "a lock table of table format {format}; this build ({BUILD}) reads formats up to \
             {TABLE_FORMAT}: upgrade this node to the release that wrote it"
        )));
    }
    Ok(u32::from_le_bytes([head[12], head[13], head[14], head[15]]))
}

/// A table whose bytes up to `end` hash to `crc`, not to `expected`.
fn checksum_failed(end: u64, crc: u32, expected: u32) -> io::Error {
    io_err(format!(
        "the lock table fails its checksum (bytes {TABLE_HEADER}..{end} hash to {crc:08x}, the \
         header says {expected:08x}): the data is corrupt"
    ))
}

/// Reads until `buf` is full or the reader ends: how much was read.
fn read_up_to(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// A reader that hashes what passes through it.
struct Hashing<R> {
    inner: R,
    crc: crc32fast::Hasher,
    read: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.crc.update(&buf[..n]);
        self.read += n as u64;
        Ok(n)
    }
}

/// What starts every message between peers: magic and [`PEER_FORMAT`].
pub fn peer_header() -> [u8; 4] {
    let [lo, hi] = PEER_FORMAT.to_le_bytes();
    [PEER_MAGIC[0], PEER_MAGIC[1], lo, hi]
}

/// The bincode of a peer message, once its version is one this build reads.
pub fn unframe_peer_message(bytes: &[u8]) -> Result<&[u8], String> {
    match bytes {
        [b'L', b'H', lo, hi, rest @ ..] => {
            let format = u16::from_le_bytes([*lo, *hi]);
            if format > PEER_FORMAT {
                Err(format!(
                    "the peer speaks peer format {format}, this node ({BUILD}) up to \
                     {PEER_FORMAT}: upgrade this node to the peer's release"
                ))
            } else if format < PEER_FORMAT {
                Err(format!(
                    "the peer speaks peer format {format}, which this node ({BUILD}) no longer \
                     reads: upgrade the peer"
                ))
            } else {
                Ok(rest)
            }
        }
        _ => Err(format!(
            "not a peer message of leaseholdd 0.2.0 or later (a node of release 0.1.0 speaks \
             openraft 0.9): upgrade every node of the cluster to {BUILD} (its data dir opens as it is)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_core::{Command, Stamp};

    fn table() -> LockTable {
        let mut table = LockTable::new();
        let grant = Command::Grant {
            ttl_ms: 10_000,
            holder: "a".into(),
            request_id: 0,
        };
        let stamp = Stamp {
            now: 1_000,
            epoch: 1,
        };
        table.apply(stamp, grant, &mut Vec::new()).expect("grant");
        table
    }

    #[test]
    fn a_table_reads_back_from_its_encoding_and_from_0_1_0s() {
        let encoded = encode_table(&table()).unwrap();
        assert_eq!(&encoded[..8], &TABLE_MAGIC);
        assert_eq!(decode_table(&encoded).unwrap(), table());
        // Release 0.1.0 wrote bincode alone.
        let legacy = bincode::serialize(&table()).unwrap();
        assert_eq!(decode_table(&legacy).unwrap(), table());
    }

    #[test]
    fn a_flipped_byte_in_a_table_fails_its_checksum() {
        let encoded = encode_table(&table()).unwrap();
        for at in [TABLE_HEADER, encoded.len() / 2, encoded.len() - 1] {
            let mut flipped = encoded.clone();
            flipped[at] ^= 0x20;
            let err = decode_table(&flipped).unwrap_err().to_string();
            assert!(err.contains("fails its checksum"), "byte {at}: {err}");
        }
        let mut flipped = encoded.clone();
        flipped[TABLE_HEADER + 3] ^= 0x01;
        assert!(check_table(&encoded).is_ok());
        assert!(check_table(&flipped).is_err());
        let mut longer = encoded.clone();
        longer.push(0);
        assert!(decode_table(&longer).is_err());
        let err = decode_table(&encoded[..10]).unwrap_err().to_string();
        assert!(err.contains("cut short"), "{err}");
        assert!(decode_table(&encoded[..encoded.len() - 3]).is_err());
    }

    #[test]
    fn a_format_file_with_a_key_added_later_still_reads() {
        let read = parse_dir_format("format 1\nwritten-by 0.3.0\ncluster-id 7f3a\n").unwrap();
        assert_eq!(read.format, 1);
        assert!(parse_dir_format("format 1\ngarbage\n").is_err());
        assert!(parse_dir_format("written-by 0.3.0\n").is_err());
    }

    #[test]
    fn a_damaged_length_is_an_error_not_a_huge_allocation() {
        // Every byte in turn made 0xff: where it is part of a length, the
        // length reaches far past the end. Each decode must fail cleanly.
        let encoded = encode_table(&table()).unwrap();
        let legacy = bincode::serialize(&table()).unwrap();
        for bytes in [&encoded, &legacy] {
            for at in 0..bytes.len() {
                let mut damaged = bytes.clone();
                if damaged[at] == 0xff {
                    continue;
                }
                damaged[at] = 0xff;
                let _ = decode_table(&damaged);
            }
        }
    }

    #[test]
    fn a_table_of_a_newer_format_is_refused_naming_both_versions() {
        let mut encoded = encode_table(&table()).unwrap();
        encoded[8..12].copy_from_slice(&(TABLE_FORMAT + 1).to_le_bytes());
        let err = decode_table(&encoded).unwrap_err().to_string();
        assert!(
            err.contains(&format!("table format {}", TABLE_FORMAT + 1))
                && err.contains(&format!("up to {TABLE_FORMAT}")),
            "{err}"
        );
    }

    #[test]
    fn a_data_dir_is_marked_with_its_format_and_a_newer_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        assert_eq!(read_dir_format(&data).unwrap(), None);
        open_data_dir(&data).unwrap();
        let ours = DirFormat {
            format: DATA_FORMAT,
            written_by: Some(BUILD.into()),
        };
        assert_eq!(read_dir_format(&data).unwrap(), Some(ours.clone()));

        // 0.1.0 wrote no format file: its data dirs hold version 1.
        let old = dir.path().join("old");
        std::fs::create_dir_all(old.join("log")).unwrap();
        assert_eq!(read_dir_format(&old).unwrap().unwrap().format, 1);
        open_data_dir(&old).unwrap();
        assert_eq!(read_dir_format(&old).unwrap(), Some(ours));

        let newer = format!("format {}\nwritten-by 9.0.0\n", DATA_FORMAT + 1);
        std::fs::write(data.join(FORMAT_FILE), &newer).unwrap();
        let err = open_data_dir(&data).unwrap_err().to_string();
        assert!(
            err.contains(&format!("data dir format {}", DATA_FORMAT + 1))
                && err.contains("9.0.0")
                && err.contains(&format!("up to {DATA_FORMAT}")),
            "{err}"
        );
        // Refused, and left as it was.
        assert_eq!(
            std::fs::read_to_string(data.join(FORMAT_FILE)).unwrap(),
            newer
        );

        std::fs::write(data.join(FORMAT_FILE), "formt 1\n").unwrap();
        let err = open_data_dir(&data).unwrap_err().to_string();
        assert!(err.contains("format") && err.contains("formt 1"), "{err}");
    }
}
