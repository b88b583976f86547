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

use super::disk::write_atomically;
use leasehold_core::LockTable;

/// A snapshot's meta (the last log id and membership it covers).
pub type Meta = super::SnapshotMeta;

/// Keeps the state machine's last snapshot: the meta and the table encoded
/// with bincode.
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
            .map(|(meta, bytes)| Ok((meta, bincode::deserialize(&bytes).map_err(io_err)?)))
            .transpose()
    }
}

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// The snapshot in one file: `[meta length: u32 LE][meta][table]`, bincode,
/// written to a temporary file, synced and renamed over the old one.
#[derive(Debug, Clone)]
pub struct FileSnapshots {
    path: PathBuf,
}

impl FileSnapshots {
    /// The snapshot file `snapshot` in `dir`.
    pub fn in_dir(dir: &Path) -> FileSnapshots {
        FileSnapshots {
            path: dir.join("snapshot"),
        }
    }

    fn open(&self) -> io::Result<Option<io::BufReader<fs::File>>> {
        match fs::File::open(&self.path) {
            Ok(f) => Ok(Some(io::BufReader::with_capacity(1 << 20, f))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn read_meta(&self, reader: &mut impl Read) -> io::Result<Meta> {
        let corrupt =
            |e: io::Error| io_err(format!("{} is not a snapshot: {e}", self.path.display()));
        let mut len = [0u8; 4];
        reader.read_exact(&mut len).map_err(corrupt)?;
        let mut meta = vec![0u8; u32::from_le_bytes(len) as usize];
        reader.read_exact(&mut meta).map_err(corrupt)?;
        bincode::deserialize(&meta).map_err(|e| corrupt(io_err(e)))
    }
}

impl SnapshotStore for FileSnapshots {
    fn save(&self, meta: &Meta, table: &[u8]) -> io::Result<()> {
        // Written in parts, so the table's bytes are never copied.
        let meta = bincode::serialize(meta).map_err(io_err)?;
        let len = u32::try_from(meta.len()).map_err(io_err)?.to_le_bytes();
        write_atomically(&self.path, &[&len, &meta, table])
    }

    fn read(&self) -> io::Result<Option<(Meta, Vec<u8>)>> {
        let Some(mut reader) = self.open()? else {
            return Ok(None);
        };
        let meta = self.read_meta(&mut reader)?;
        let mut table = Vec::new();
        reader.read_to_end(&mut table)?;
        Ok(Some((meta, table)))
    }

    /// Decodes the table straight from the file, without holding its bytes
    /// in memory next to the table they decode to.
    fn load(&self) -> io::Result<Option<(Meta, LockTable)>> {
        let Some(mut reader) = self.open()? else {
            return Ok(None);
        };
        let meta = self.read_meta(&mut reader)?;
        let table = bincode::deserialize_from(&mut reader).map_err(io_err)?;
        Ok(Some((meta, table)))
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
        let bytes = bincode::serialize(&table).unwrap();
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
    fn a_file_that_is_not_a_snapshot_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("snapshot"), b"\xff\xff").unwrap();
        let err = FileSnapshots::in_dir(dir.path()).load().unwrap_err();
        assert!(err.to_string().contains("is not a snapshot"), "{err}");
    }
}
