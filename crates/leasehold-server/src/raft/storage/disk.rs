//! What the Raft log needs of a disk: a folder of files it writes at an
//! offset, syncs, cuts and deletes, and a vote it replaces atomically.
//!
//! [`FsDisk`] is a directory of a real filesystem. The simulation implements
//! the same two traits over memory that loses every write not yet synced when
//! its node crashes, so the log's own format (segments, the torn-tail cut,
//! preallocation, purge) runs under every seed.
//!
//! What each call promises, which is all the log relies on:
//! - [`LogFile::write_at`] may reach the disk at any time, in part or not at
//!   all, until a [`LogFile::sync`] that began after it completes;
//! - [`LogDisk::create`], [`LogFile::cut`] and [`LogDisk::write_vote`] are
//!   durable when they return;
//! - [`LogDisk::remove`] may be undone by a crash (the file comes back with
//!   what was synced), so what a deleted segment held must already be dead
//!   in a later record.

use std::fs::{self, File, OpenOptions};
use std::future::Future;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The log's folder and vote.
pub trait LogDisk: Send + Sync + 'static {
    /// An open file of the folder.
    type File: LogFile;

    /// The names of the files in the folder.
    fn list(&self) -> io::Result<Vec<String>>;

    /// The whole content of `name` (`NotFound` if there is no such file).
    /// A file that was given a size reads as zeros past what was written.
    fn read(&self, name: &str) -> io::Result<Vec<u8>>;

    /// Creates `name` empty (replacing any file of that name) with room for
    /// `size` bytes reserved; the new name is durable when this returns.
    fn create(&self, name: &str, size: u64) -> io::Result<Self::File>;

    /// Opens `name` for writing, reserving room for `size` bytes.
    fn open(&self, name: &str, size: u64) -> io::Result<Self::File>;

    /// Deletes `name`.
    fn remove(&self, name: &str) -> io::Result<()>;

    /// The vote last written, if any.
    fn read_vote(&self) -> io::Result<Option<Vec<u8>>>;

    /// Replaces the vote, atomically and durably.
    fn write_vote(&self, bytes: &[u8]) -> io::Result<()>;
}

/// A file of a [`LogDisk`], open for writing.
pub trait LogFile: Send + Sync + 'static {
    /// Writes `bytes` at `offset`.
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()>;

    /// Waits until everything written before the call is on the disk.
    fn sync(&mut self) -> impl Future<Output = io::Result<()>> + Send;

    /// Cuts the file to `len` bytes, durably.
    fn cut(&mut self, len: u64) -> io::Result<()>;
}

/// The log in `root/log`, its vote in `root/vote`.
#[derive(Debug, Clone)]
pub struct FsDisk {
    log_dir: PathBuf,
    vote: PathBuf,
}

impl FsDisk {
    /// The log of the data dir `root`, creating its folder if needed.
    pub fn open(root: &Path) -> io::Result<FsDisk> {
        let log_dir = root.join("log");
        fs::create_dir_all(&log_dir)?;
        Ok(FsDisk {
            log_dir,
            vote: root.join("vote"),
        })
    }
}

/// A file of an [`FsDisk`].
#[derive(Debug)]
pub struct FsFile(pub(crate) Arc<File>);

impl LogDisk for FsDisk {
    type File = FsFile;

    fn list(&self) -> io::Result<Vec<String>> {
        Ok(fs::read_dir(&self.log_dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect())
    }

    fn read(&self, name: &str) -> io::Result<Vec<u8>> {
        fs::read(self.log_dir.join(name))
    }

    fn create(&self, name: &str, size: u64) -> io::Result<FsFile> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(self.log_dir.join(name))?;
        preallocate(&file, size);
        file.sync_all()?;
        sync_dir(&self.log_dir)?;
        Ok(FsFile(Arc::new(file)))
    }

    fn open(&self, name: &str, size: u64) -> io::Result<FsFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.log_dir.join(name))?;
        preallocate(&file, size);
        Ok(FsFile(Arc::new(file)))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        fs::remove_file(self.log_dir.join(name))
    }

    fn read_vote(&self) -> io::Result<Option<Vec<u8>>> {
        match fs::read(&self.vote) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn write_vote(&self, bytes: &[u8]) -> io::Result<()> {
        write_atomically(&self.vote, &[bytes])
    }
}

impl LogFile for FsFile {
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.0.write_all_at(bytes, offset)
    }

    /// `fdatasync` on one of tokio's blocking threads, so that the runtime
    /// threads go on answering peers and applying the log meanwhile.
    fn sync(&mut self) -> impl Future<Output = io::Result<()>> + Send {
        let file = self.0.clone();
        async move {
            tokio::task::spawn_blocking(move || file.sync_data())
                .await
                .map_err(|e| io::Error::other(format!("the flush did not finish: {e}")))?
        }
    }

    fn cut(&mut self, len: u64) -> io::Result<()> {
        self.0.set_len(len)?;
        self.0.sync_all()
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Reserves `size` bytes for the file, so appends do not grow it. Only a
/// speed-up: where the filesystem cannot, appends grow the file as before.
fn preallocate(file: &File, size: u64) {
    let Ok(size) = libc::off_t::try_from(size) else {
        return;
    };
    if size == 0 {
        return;
    }
    // SAFETY: fallocate only reads its integer arguments; the descriptor is
    // owned by `file`, which outlives the call.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, size) };
    if rc != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "cannot preallocate a log segment");
    }
}

/// Writes bytes `from..to` of `file` to the disk and waits for them (not a
/// flush of the disk's cache: only `fsync` makes them durable).
fn write_back(file: &File, from: usize, to: usize) -> io::Result<()> {
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    let offset = |n: usize| libc::off64_t::try_from(n).map_err(io::Error::other);
    // SAFETY: sync_file_range only reads its integer arguments; the
    // descriptor is owned by `file`, which outlives the call.
    let rc = unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset(from)?, offset(to - from)?, flags)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A big file is written back this much at a time (see [`write_atomically`]).
const WRITEBACK_STEP: usize = 1 << 20;

/// Writes a file so that a crash leaves either the old or the new content.
///
/// A big file (a snapshot) is written back a MiB at a time, each MiB on the
/// disk before the next is written: the disk's queue then never holds more
/// than that ahead of the log's next `fdatasync`. Written whole and synced
/// once, the 83 MB snapshot of a million held locks put the log's flushes
/// behind all of it (up to 400 ms each, on three nodes snapshotting at
/// once), and a node that cannot flush its log cannot send heartbeats.
pub(crate) fn write_atomically(path: &Path, parts: &[&[u8]]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut file = File::create(&tmp)?;
        let (mut written, mut on_disk, mut paced) = (0usize, 0usize, true);
        for part in parts {
            for piece in part.chunks(WRITEBACK_STEP) {
                file.write_all(piece)?;
                written += piece.len();
                if paced && written - on_disk >= WRITEBACK_STEP {
                    // Only pacing: the `sync_all` below makes the file durable.
                    if let Err(e) = write_back(&file, on_disk, written) {
                        tracing::debug!(error = %e, "cannot write a file back in steps");
                        paced = false;
                    }
                    on_disk = written;
                }
            }
        }
        file.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        sync_dir(dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_big_file_written_back_in_steps_holds_every_part_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("snapshot");
        std::fs::write(&path, b"old").unwrap();
        // Parts that end short of, on and past a step's boundary.
        let step = super::WRITEBACK_STEP;
        let parts: Vec<Vec<u8>> = [7, step - 7, 3 * step + 5, 1]
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|b| (b * 31 + i) as u8).collect())
            .collect();
        let slices: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        super::write_atomically(&path, &slices).expect("write");
        assert_eq!(std::fs::read(&path).unwrap(), parts.concat());
        assert!(!path.with_extension("tmp").exists());
    }
}
