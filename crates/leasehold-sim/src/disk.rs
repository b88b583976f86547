//! A node's disk in memory, losing what was not synced when the node crashes.
//!
//! The node runs the real Raft log store (`leasehold_server::raft::LogStore`,
//! its segment format, torn-tail cut, preallocation and purge) over this
//! disk, as TigerBeetle's simulated storage sits under its real format.
//!
//! [`Disk`] outlives the node's process: the world keeps it across a crash
//! and calls [`Disk::crash`], which does what a power loss does to a page
//! cache. Of the writes made since a file's last completed sync, a seeded
//! number survive in order, the next one possibly torn part-way; the rest are
//! gone. A file deleted since the folder was last synced comes back with
//! what was synced of it. A process that only exits (its Raft stopped) keeps
//! everything, as the kernel does.
//!
//! A sync takes a seeded time, during which the node's runtime goes on (a
//! crash in the middle loses the writes it was syncing). With
//! [`Bug::AckBeforeFsync`](crate::Bug::AckBeforeFsync) planted the disk lies:
//! a sync returns at once having done nothing, and written data reaches the
//! disk only at the next periodic writeback (as the kernel's page cache
//! does), so a power loss can lose entries a majority counted as written.

use parking_lot::{Mutex, MutexGuard};
use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use leasehold_server::raft::{LogDisk, LogFile};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// How often written data reaches a lying disk without a sync.
const WRITEBACK: Duration = Duration::from_millis(500);

/// What survives a node's crash.
pub struct Disk {
    state: Mutex<DiskState>,
    sync_time: Duration,
    lies: bool,
}

struct DiskState {
    files: BTreeMap<String, File>,
    /// Files deleted since the folder was last synced: what a crash brings
    /// back.
    unlinked: BTreeMap<String, Vec<u8>>,
    vote: Option<Vec<u8>>,
    /// Draws which unsynced writes a crash keeps.
    rng: StdRng,
    /// Unsynced writes a crash has dropped or torn, in all.
    lost: u64,
}

#[derive(Default)]
struct File {
    /// What a reader sees: every write so far.
    content: Vec<u8>,
    /// What is on the disk.
    synced: Vec<u8>,
    /// Writes since the last sync, in order: `(offset, bytes)`.
    unsynced: Vec<(usize, Vec<u8>)>,
}

impl File {
    /// Makes the first `n` unsynced writes durable.
    fn sync(&mut self, n: usize) {
        let n = n.min(self.unsynced.len());
        for (at, bytes) in self.unsynced.drain(..n) {
            put(&mut self.synced, at, &bytes);
        }
    }

    fn sync_all(&mut self) {
        self.sync(self.unsynced.len());
        self.synced.clone_from(&self.content);
    }
}

/// Writes `bytes` at `at`, zero-filling any gap.
fn put(into: &mut Vec<u8>, at: usize, bytes: &[u8]) {
    let end = at + bytes.len();
    if into.len() < end {
        into.resize(end, 0);
    }
    into[at..end].copy_from_slice(bytes);
}

impl Disk {
    /// An empty disk whose syncs take `sync_time` (or, if it `lies`, no
    /// time and no effect), and whose crashes draw from `seed`.
    pub fn new(seed: u64, sync_time: Duration, lies: bool) -> Disk {
        Disk {
            state: Mutex::new(DiskState {
                files: BTreeMap::new(),
                unlinked: BTreeMap::new(),
                vote: None,
                rng: StdRng::seed_from_u64(seed),
                lost: 0,
            }),
            sync_time,
            lies,
        }
    }

    fn lock(&self) -> MutexGuard<'_, DiskState> {
        self.state.lock()
    }

    /// The power went: every file keeps what was synced, plus a seeded
    /// prefix of the writes since (the last of them possibly torn).
    /// Returns how many writes were dropped or torn.
    pub fn crash(&self) -> u64 {
        let mut guard = self.lock();
        let state = &mut *guard;
        let mut dropped = 0;
        for (name, synced) in std::mem::take(&mut state.unlinked) {
            state.files.insert(
                name,
                File {
                    content: synced.clone(),
                    synced,
                    unsynced: Vec::new(),
                },
            );
        }
        for file in state.files.values_mut() {
            let pending = file.unsynced.len();
            let kept = state.rng.gen_range(0..=pending);
            file.sync(kept);
            if let Some((at, bytes)) = file.unsynced.first() {
                if state.rng.gen_bool(0.5) {
                    let part = state.rng.gen_range(0..bytes.len().max(1));
                    put(&mut file.synced, *at, &bytes[..part.min(bytes.len())]);
                }
            }
            dropped += file.unsynced.len() as u64;
            file.unsynced.clear();
            file.content.clone_from(&file.synced);
        }
        state.lost += dropped;
        dropped
    }

    /// Unsynced writes dropped or torn by crashes so far.
    pub fn lost(&self) -> u64 {
        self.lock().lost
    }

    /// Writes everything back now and then, as a page cache does; only a
    /// lying disk needs it. Runs on the node's runtime, and dies with it.
    pub async fn write_back(self: Arc<Disk>) {
        if !self.lies {
            return;
        }
        loop {
            tokio::time::sleep(WRITEBACK).await;
            for file in self.lock().files.values_mut() {
                file.sync_all();
            }
        }
    }
}

/// The node's handle on its [`Disk`].
#[derive(Clone)]
pub struct SimDisk(pub Arc<Disk>);

/// A file of a [`SimDisk`], open for writing.
pub struct SimFile {
    disk: Arc<Disk>,
    name: String,
}

impl SimFile {
    fn with<T>(&self, f: impl FnOnce(&mut File) -> T) -> io::Result<T> {
        let mut state = self.disk.lock();
        let file = state.files.get_mut(&self.name).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("{} is gone", self.name))
        })?;
        Ok(f(file))
    }
}

fn not_found(name: &str) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("no file {name}"))
}

impl LogDisk for SimDisk {
    type File = SimFile;

    fn list(&self) -> io::Result<Vec<String>> {
        Ok(self.0.lock().files.keys().cloned().collect())
    }

    /// Reads what was written; the reserved rest reads as zeros, which is
    /// what a record reader sees past the end here.
    fn read(&self, name: &str) -> io::Result<Vec<u8>> {
        let state = self.0.lock();
        let file = state.files.get(name).ok_or_else(|| not_found(name))?;
        Ok(file.content.clone())
    }

    fn create(&self, name: &str, _size: u64) -> io::Result<SimFile> {
        let mut state = self.0.lock();
        state.files.insert(name.to_string(), File::default());
        // The folder is synced with the new name: deletions before it stay.
        state.unlinked.clear();
        Ok(SimFile {
            disk: self.0.clone(),
            name: name.to_string(),
        })
    }

    fn open(&self, name: &str, _size: u64) -> io::Result<SimFile> {
        if !self.0.lock().files.contains_key(name) {
            return Err(not_found(name));
        }
        Ok(SimFile {
            disk: self.0.clone(),
            name: name.to_string(),
        })
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        let mut state = self.0.lock();
        let file = state.files.remove(name).ok_or_else(|| not_found(name))?;
        state.unlinked.insert(name.to_string(), file.synced);
        Ok(())
    }

    fn read_vote(&self) -> io::Result<Option<Vec<u8>>> {
        Ok(self.0.lock().vote.clone())
    }

    fn write_vote(&self, bytes: &[u8]) -> io::Result<()> {
        self.0.lock().vote = Some(bytes.to_vec());
        Ok(())
    }
}

impl LogFile for SimFile {
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let at = usize::try_from(offset).map_err(io::Error::other)?;
        self.with(|file| {
            put(&mut file.content, at, bytes);
            file.unsynced.push((at, bytes.to_vec()));
        })
    }

    fn sync(&mut self) -> impl Future<Output = io::Result<()>> + Send {
        let (disk, name) = (self.disk.clone(), self.name.clone());
        async move {
            if disk.lies {
                return Ok(());
            }
            let file = SimFile { disk, name };
            // What the sync covers: the writes made before it began.
            let pending = file.with(|f| f.unsynced.len())?;
            tokio::time::sleep(file.disk.sync_time).await;
            file.with(|f| f.sync(pending))
        }
    }

    fn cut(&mut self, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(io::Error::other)?;
        self.with(|file| {
            file.content.truncate(len);
            file.unsynced.clear();
            file.synced.clone_from(&file.content);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(seed: u64) -> (Arc<Disk>, SimDisk) {
        let disk = Arc::new(Disk::new(seed, Duration::from_millis(1), false));
        (disk.clone(), SimDisk(disk))
    }

    #[tokio::test(start_paused = true)]
    async fn a_crash_keeps_what_was_synced_and_at_most_a_prefix_of_the_rest() {
        for seed in 0..50 {
            let (disk, sim) = disk(seed);
            let mut file = sim.create("a", 0).unwrap();
            file.write_at(0, b"synced").unwrap();
            file.sync().await.unwrap();
            file.write_at(6, b"-one").unwrap();
            file.write_at(10, b"-two").unwrap();
            disk.crash();
            let after = sim.read("a").unwrap();
            assert!(after.starts_with(b"synced"), "seed {seed}: {after:?}");
            assert!(
                b"synced-one-two".starts_with(&after),
                "seed {seed}: not a prefix: {after:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_deleted_file_comes_back_until_the_folder_is_synced() {
        let (disk, sim) = disk(1);
        let mut file = sim.create("old", 0).unwrap();
        file.write_at(0, b"kept").unwrap();
        file.sync().await.unwrap();
        sim.remove("old").unwrap();
        disk.crash();
        assert_eq!(sim.read("old").unwrap(), b"kept");
        sim.remove("old").unwrap();
        sim.create("new", 0).unwrap();
        disk.crash();
        assert!(sim.read("old").is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lying_disk_syncs_nothing_until_its_writeback() {
        let disk = Arc::new(Disk::new(0, Duration::from_millis(1), true));
        let sim = SimDisk(disk.clone());
        let mut file = sim.create("a", 0).unwrap();
        file.write_at(0, b"acknowledged").unwrap();
        file.sync().await.unwrap();
        let synced = |disk: &Disk| disk.lock().files["a"].synced.clone();
        assert!(synced(&disk).is_empty(), "the sync did nothing");
        tokio::spawn(disk.clone().write_back());
        tokio::time::sleep(WRITEBACK * 2).await;
        assert_eq!(synced(&disk), b"acknowledged");
    }
}
