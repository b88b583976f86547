//! Where the state machine keeps its last snapshot.
//!
//! One snapshot is kept: the newest replaces the one before, whole, so a
//! crash while saving leaves the old one or the new one and never a mix.
//! [`FileSnapshots`] is the real store (one file in the data dir);
//! [`MemorySnapshots`] keeps it in memory, for tests and a simulation that
//! decides itself what a crash loses.

use parking_lot::Mutex;
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::raft::storage::disk::write_atomically;
use crate::raft::storage::format;
use leasehold_core::LockTable;

/// A snapshot's meta (the last log id and membership it covers).
pub type Meta = crate::raft::SnapshotMeta;

/// Keeps the state machine's last snapshot: the meta and the table's
/// encoding ([`format::encode_table`]: versioned and checksummed).
pub trait SnapshotStore: Send + Sync + 'static {
    /// Replaces the stored snapshot; returns once it is durable.
    fn save(&self, meta: &Meta, table: &[u8]) -> io::Result<()>;

    /// Whether [`save`](Self::save) waits on the disk, and so runs on a
    /// blocking thread rather than on the runtime. A store in memory saves
    /// inline: a simulation's runtime must never wait on another thread,
    /// whose timing would then decide the order of events in the run.
    fn save_blocks(&self) -> bool {
        true
    }

    /// The stored snapshot as bytes, to send to a peer.
    fn read(&self) -> io::Result<Option<(Meta, Vec<u8>)>>;

    /// The stored snapshot decoded, to start from. The default decodes
    /// [`read`](Self::read)'s bytes; a store may decode without holding them.
    fn load(&self) -> io::Result<Option<(Meta, LockTable)>> {
        self.read()?
            .map(|(meta, bytes)| Ok((meta, format::decode_table(&bytes)?)))
            .transpose()
    }
}

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// The snapshot file format this build writes. Release 0.1.0 wrote
/// version 1, which had no header: `[meta length: u32 LE][meta][table]`.
pub const SNAPSHOT_FILE_FORMAT: u32 = 2;

/// Starts a snapshot file of version 2 or later. As a version 1 file's
/// first four bytes it would be a meta of a gigabyte, so the two never mix.
const SNAPSHOT_MAGIC: [u8; 8] = *b"LHSNAP\0\xff";

/// Bytes of a snapshot file before its meta: magic, version, the meta's
/// length and its CRC-32.
const FILE_HEADER: usize = 20;

/// The snapshot in one file, written to a temporary file, synced and
/// renamed over the old one: `[magic][version: u32][meta length: u32][meta
/// CRC-32: u32][meta, bincode][the table's encoding]`, all integers little
/// endian. The table's encoding has its own version and checksum.
#[derive(Debug, Clone)]
pub struct FileSnapshots {
    path: PathBuf,
}

/// A snapshot file's meta, and where its table starts.
struct Opened {
    reader: io::BufReader<fs::File>,
    meta: Meta,
    table_at: u64,
    table_len: u64,
}

impl FileSnapshots {
    /// The snapshot file `snapshot` in `dir`.
    pub fn in_dir(dir: &Path) -> FileSnapshots {
        FileSnapshots::at(dir.join("snapshot"))
    }

    /// The snapshot file at `path`.
    pub fn at(path: PathBuf) -> FileSnapshots {
        FileSnapshots { path }
    }

    /// The file's snapshot file format (1: written by 0.1.0, without
    /// checksums), if there is a file.
    pub fn file_format(&self) -> io::Result<Option<u32>> {
        let mut head = [0u8; 12];
        match fs::File::open(&self.path) {
            Ok(mut f) => match f.read_exact(&mut head) {
                Ok(()) if head[..8] == SNAPSHOT_MAGIC => Ok(Some(u32::from_le_bytes([
                    head[8], head[9], head[10], head[11],
                ]))),
                _ => Ok(Some(1)),
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Opens the file and reads its meta, checking its version and checksum.
    fn open(&self) -> io::Result<Option<Opened>> {
        let file = match fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut reader = io::BufReader::with_capacity(1 << 20, file);
        let corrupt = |what: String| io_err(format!("{}: {what}", self.path.display()));
        let cut = |e: io::Error| corrupt(format!("not a snapshot (cut short: {e})"));
        let mut head = [0u8; 8];
        reader.read_exact(&mut head).map_err(cut)?;
        let (meta_len, expected, header) = if head == SNAPSHOT_MAGIC {
            let mut rest = [0u8; FILE_HEADER - 8];
            reader.read_exact(&mut rest).map_err(cut)?;
            let word =
                |i: usize| u32::from_le_bytes([rest[i], rest[i + 1], rest[i + 2], rest[i + 3]]);
            if word(0) > SNAPSHOT_FILE_FORMAT {
                return Err(corrupt(format!(
                    "a snapshot of snapshot file format {}; this build ({}) reads formats up \
                     to {SNAPSHOT_FILE_FORMAT}: run the release that wrote it, or a later one",
                    word(0),
                    format::BUILD
                )));
            }
            // Format 1 had no header: a header naming it (or 0) is damage.
            if word(0) < 2 {
                return Err(corrupt(format!(
                    "a snapshot header naming format {} at byte 8, which no build wrote: the \
                     file is corrupt",
                    word(0)
                )));
            }
            (word(4) as usize, Some(word(8)), FILE_HEADER)
        } else {
            // Version 1: the meta's length, then the meta, whose first four
            // bytes were read with it.
            (
                u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize,
                None,
                4,
            )
        };
        if meta_len > MAX_META {
            return Err(corrupt(format!(
                "not a snapshot (a meta of {meta_len} bytes at byte {}; the file is corrupt)",
                header - 4
            )));
        }
        let mut meta = vec![0u8; meta_len];
        let mut filled = 0;
        if header == 4 {
            // A meta of under four bytes cannot be: it holds a membership.
            if meta_len < 4 {
                return Err(corrupt(
                    "not a snapshot (a meta of under four bytes)".into(),
                ));
            }
            meta[..4].copy_from_slice(&head[4..]);
            filled = 4;
        }
        reader.read_exact(&mut meta[filled..]).map_err(cut)?;
        if let Some(expected) = expected {
            let crc = crc32fast::hash(&meta);
            if crc != expected {
                return Err(corrupt(format!(
                    "the meta (bytes {header}..{}) fails its checksum: the file is corrupt; \
                     restore it from a member or a backup",
                    header + meta_len
                )));
            }
        }
        let meta = bincode::deserialize(&meta)
            .map_err(|e| corrupt(format!("not a snapshot (its meta: {e})")))?;
        let table_at = (header + meta_len) as u64;
        let file_len = reader.get_ref().metadata()?.len();
        Ok(Some(Opened {
            reader,
            meta,
            table_at,
            table_len: file_len.saturating_sub(table_at),
        }))
    }
}

/// The longest meta a snapshot file may have (a membership of a few
/// members takes a few hundred bytes).
const MAX_META: usize = 16 << 20;

/// What a snapshot file holds before the table's encoding: its header and
/// its meta. A backup is the same file.
pub(crate) fn file_head(meta: &Meta) -> io::Result<Vec<u8>> {
    let meta = bincode::serialize(meta).map_err(io_err)?;
    let mut head = Vec::with_capacity(FILE_HEADER + meta.len());
    head.extend_from_slice(&SNAPSHOT_MAGIC);
    head.extend_from_slice(&SNAPSHOT_FILE_FORMAT.to_le_bytes());
    head.extend_from_slice(&u32::try_from(meta.len()).map_err(io_err)?.to_le_bytes());
    head.extend_from_slice(&crc32fast::hash(&meta).to_le_bytes());
    head.extend_from_slice(&meta);
    Ok(head)
}

impl SnapshotStore for FileSnapshots {
    fn save(&self, meta: &Meta, table: &[u8]) -> io::Result<()> {
        // Written in parts, so the table's bytes are never copied.
        write_atomically(&self.path, &[&file_head(meta)?, table])
    }

    fn read(&self) -> io::Result<Option<(Meta, Vec<u8>)>> {
        let Some(mut opened) = self.open()? else {
            return Ok(None);
        };
        let mut table = Vec::new();
        opened.reader.read_to_end(&mut table)?;
        Ok(Some((opened.meta, table)))
    }

    /// Decodes the table straight from the file, without holding its bytes
    /// in memory next to the table they decode to.
    fn load(&self) -> io::Result<Option<(Meta, LockTable)>> {
        let Some(opened) = self.open()? else {
            return Ok(None);
        };
        let table = format::decode_table_from(opened.reader, opened.table_len).map_err(|e| {
            io_err(format!(
                "{}: the lock table at byte {}: {e}",
                self.path.display(),
                opened.table_at
            ))
        })?;
        Ok(Some((opened.meta, table)))
    }
}

/// The snapshot in memory. Clones share it, so a node "restarted" on a clone
/// starts from what the one before saved.
#[derive(Debug, Clone, Default)]
pub struct MemorySnapshots {
    saved: Arc<Mutex<Option<Saved>>>,
}

/// A snapshot kept in memory: its meta and the table's bytes.
type Saved = (Meta, Arc<Vec<u8>>);

impl MemorySnapshots {
    fn saved(&self) -> parking_lot::MutexGuard<'_, Option<Saved>> {
        self.saved.lock()
    }
}

impl SnapshotStore for MemorySnapshots {
    fn save(&self, meta: &Meta, table: &[u8]) -> io::Result<()> {
        *self.saved() = Some((meta.clone(), Arc::new(table.to_vec())));
        Ok(())
    }

    fn save_blocks(&self) -> bool {
        false
    }

    fn read(&self) -> io::Result<Option<(Meta, Vec<u8>)>> {
        Ok(self
            .saved()
            .as_ref()
            .map(|(meta, bytes)| (meta.clone(), bytes.to_vec())))
    }
}

#[cfg(test)]
mod tests {
    use crate::raft::{CommittedLeaderId, LogId, StoredMembership};
    use leasehold_core::{Command, Stamp};

    use super::*;

    fn sample() -> (Meta, LockTable) {
        let mut table = LockTable::default();
        let stamp = Stamp {
            now: 1_000,
            epoch: 1,
        };
        let mut events = Vec::new();
        let grant = Command::Grant {
            ttl_ms: 10_000,
            holder: "a".into(),
            request_id: 0,
        };
        table.apply(stamp, grant, &mut events).expect("grant");
        let meta = Meta {
            last_log_id: Some(LogId::new(
                CommittedLeaderId {
                    term: 3,
                    node_id: 1,
                },
                42,
            )),
            last_membership: StoredMembership::default(),
        };
        (meta, table)
    }

    fn round_trip(store: &dyn SnapshotStore) {
        assert!(store.read().unwrap().is_none());
        assert!(store.load().unwrap().is_none());
        let (meta, table) = sample();
        let bytes = format::encode_table(&table).unwrap();
        store.save(&meta, &bytes).unwrap();
        let (read_meta, read_bytes) = store.read().unwrap().unwrap();
        assert_eq!(read_meta, meta);
        assert_eq!(read_bytes, bytes);
        let (loaded_meta, loaded) = store.load().unwrap().unwrap();
        assert_eq!(loaded_meta, meta);
        assert_eq!(loaded.lease_count(), 1);
    }

    #[test]
    fn both_stores_keep_what_was_saved() {
        let dir = tempfile::tempdir().unwrap();
        round_trip(&FileSnapshots::in_dir(dir.path()));
        round_trip(&MemorySnapshots::default());
    }

    #[test]
    fn a_flipped_byte_is_found_and_named_wherever_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileSnapshots::in_dir(dir.path());
        let (meta, table) = sample();
        store
            .save(&meta, &format::encode_table(&table).unwrap())
            .unwrap();
        let path = dir.path().join("snapshot");
        let good = std::fs::read(&path).unwrap();
        let meta_len = u32::from_le_bytes(good[12..16].try_into().unwrap()) as usize;
        let table_at = FILE_HEADER + meta_len;
        for (at, says) in [
            (FILE_HEADER + 1, "the meta (bytes 20.."),
            (table_at + format::TABLE_HEADER + 2, "fails its checksum"),
            (good.len() - 1, "fails its checksum"),
        ] {
            let mut bad = good.clone();
            bad[at] ^= 0x01;
            std::fs::write(&path, &bad).unwrap();
            let err = store.load().unwrap_err().to_string();
            assert!(
                err.contains(&path.display().to_string()) && err.contains(says),
                "byte {at}: {err}"
            );
            if at > table_at {
                assert!(err.contains(&format!("at byte {table_at}")), "{err}");
            }
        }
        for cut in [5, FILE_HEADER + 3, good.len() - 1] {
            std::fs::write(&path, &good[..cut]).unwrap();
            assert!(store.load().is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn a_file_0_1_0_wrote_loads_and_a_newer_format_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snapshot");
        let store = FileSnapshots::in_dir(dir.path());
        let (meta, table) = sample();
        // Version 1: the meta's length, the meta and the table, bincode.
        let meta_bytes = bincode::serialize(&meta).unwrap();
        let mut v1 = (meta_bytes.len() as u32).to_le_bytes().to_vec();
        v1.extend_from_slice(&meta_bytes);
        v1.extend_from_slice(&bincode::serialize(&table).unwrap());
        std::fs::write(&path, &v1).unwrap();
        let (read_meta, read_table) = store.load().unwrap().unwrap();
        assert_eq!((read_meta, read_table), (meta.clone(), table.clone()));

        store
            .save(&meta, &format::encode_table(&table).unwrap())
            .unwrap();
        let mut newer = std::fs::read(&path).unwrap();
        newer[8..12].copy_from_slice(&(SNAPSHOT_FILE_FORMAT + 1).to_le_bytes());
        std::fs::write(&path, &newer).unwrap();
        let err = store.load().unwrap_err().to_string();
        assert!(
            err.contains(&format!(
                "snapshot file format {}",
                SNAPSHOT_FILE_FORMAT + 1
            )) && err.contains(&format!("up to {SNAPSHOT_FILE_FORMAT}")),
            "{err}"
        );

        // A header naming a format that never had one is damage.
        for version in [0u32, 1] {
            newer[8..12].copy_from_slice(&version.to_le_bytes());
            std::fs::write(&path, &newer).unwrap();
            let err = store.load().unwrap_err().to_string();
            assert!(err.contains("no build wrote"), "{err}");
        }
    }

    #[test]
    fn a_file_that_is_not_a_snapshot_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("snapshot"), b"\xff\xff").unwrap();
        let err = FileSnapshots::in_dir(dir.path()).load().unwrap_err();
        assert!(err.to_string().contains("not a snapshot"), "{err}");
    }
}
