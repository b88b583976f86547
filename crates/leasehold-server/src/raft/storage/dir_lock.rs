//! One process per data dir.
//!
//! Two processes on one log would each take the other's entries for their
//! own and hand out the same fencing token twice, so every process that
//! writes a data dir (the server, `restore`, `force-new-cluster`) first
//! takes an exclusive `flock(2)` on its `lock` file, as etcd, ZooKeeper and
//! Consul lock theirs, and keeps it until it is done.
//!
//! - **Held by the kernel, not by the file.** A process that dies, `kill -9`
//!   included, lets go of its lock at once; the file it leaves behind
//!   (with its pid) means nothing by itself, so no stale lock ever needs
//!   clearing by hand.
//! - **The pid is a hint.** The holder writes its pid into the file after it
//!   has the lock, for the refusal to name; one refused in between is told
//!   "another process".
//! - **Readers take it shared.** `leaseholdd check` changes nothing, but a
//!   log being written under it reads as damage: it takes the lock shared
//!   and, refused, says that a node is running there. It never creates the
//!   file (a data dir without one was never opened by a build that locks).
//! - **In one process too.** A second open of the file in the same process
//!   is refused like another process's (flock locks belong to the open
//!   file), so a test that starts a server twice on one dir sees it as well.
//! - **The file locked is the file named.** A lock is held on an open file,
//!   and the name may have moved to another file meanwhile (a refused
//!   restore removes what it made, its lock file too): after locking, the
//!   file must still be the one at the path, or it is opened and locked
//!   again.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// The lock file's name in a data dir.
pub const LOCK_FILE: &str = "lock";

/// Why a data dir could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum DirLockError {
    /// Another process holds the lock: it is serving, restoring or
    /// rebuilding this data dir.
    #[error(
        "data dir {dir} is in use by {holder}: stop it first, or give this one a data dir of its own",
        dir = dir.display(),
        holder = holder(*pid)
    )]
    InUse {
        /// The data dir.
        dir: PathBuf,
        /// The holder's pid, as it wrote it into the lock file.
        pid: Option<u32>,
    },
    /// The lock file could not be created, opened or locked.
    #[error("lock data dir {dir}: {source}", dir = dir.display())]
    Io {
        /// The data dir.
        dir: PathBuf,
        /// What the system said.
        #[source]
        source: io::Error,
    },
}

fn holder(pid: Option<u32>) -> String {
    match pid {
        Some(pid) => format!("another process (pid {pid})"),
        None => "another process".to_string(),
    }
}

/// A data dir locked by this process; the lock is let go when this is
/// dropped.
#[derive(Debug)]
pub struct DirLock {
    /// Holding the open file is holding the lock.
    _file: File,
    dir: PathBuf,
    /// Whether locking created the dir, and the lock file in it.
    created: (bool, bool),
}

impl DirLock {
    /// Locks `dir` exclusively for a process that writes it, creating the
    /// dir and its lock file if needed, and writes this process's pid into
    /// the file.
    pub fn exclusive(dir: &Path) -> Result<DirLock, DirLockError> {
        let io = |source| DirLockError::Io {
            dir: dir.to_path_buf(),
            source,
        };
        let created_dir = !dir.exists();
        fs::create_dir_all(dir).map_err(io)?;
        let path = dir.join(LOCK_FILE);
        loop {
            let created_file = !path.exists();
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(io)?;
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => return Err(in_use(dir, &mut file)),
                Err(TryLockError::Error(e)) => return Err(io(e)),
            }
            if !same_file(&file, &path).map_err(io)? {
                continue;
            }
            file.set_len(0).map_err(io)?;
            file.write_all(format!("{}\n", std::process::id()).as_bytes())
                .map_err(io)?;
            return Ok(DirLock {
                _file: file,
                dir: dir.to_path_buf(),
                created: (created_dir, created_file),
            });
        }
    }

    /// Lets go of a dir this process locked only to find it may not use
    /// it: removes the lock file if locking made it, and the dir too if
    /// locking made that and it is empty again, so a refused command leaves
    /// the dir as it found it.
    pub fn undo(self) {
        let (created_dir, created_file) = self.created;
        // Removed while still locked: whoever opens the old file next finds
        // it gone from its path (see `same_file`).
        if created_file {
            let _ = fs::remove_file(self.dir.join(LOCK_FILE));
        }
        if created_dir {
            let _ = fs::remove_dir(&self.dir);
        }
    }

    /// Locks `dir` shared, for a process that only reads it. `None` when
    /// the dir has no lock file (nothing that locks ever opened it), which
    /// is left as it is.
    pub fn shared(dir: &Path) -> Result<Option<DirLock>, DirLockError> {
        let mut file = match File::open(dir.join(LOCK_FILE)) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(DirLockError::Io {
                    dir: dir.to_path_buf(),
                    source,
                })
            }
        };
        match file.try_lock_shared() {
            Ok(()) => Ok(Some(DirLock {
                _file: file,
                dir: dir.to_path_buf(),
                created: (false, false),
            })),
            Err(TryLockError::WouldBlock) => Err(in_use(dir, &mut file)),
            Err(TryLockError::Error(source)) => Err(DirLockError::Io {
                dir: dir.to_path_buf(),
                source,
            }),
        }
    }

    /// The locked data dir.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Whether `file` is the file at `path` now (not one removed from there).
fn same_file(file: &File, path: &Path) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let open = file.metadata()?;
    match fs::metadata(path) {
        Ok(named) => Ok(open.dev() == named.dev() && open.ino() == named.ino()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// The refusal, with the pid the holder wrote if it has written one yet.
fn in_use(dir: &Path, file: &mut File) -> DirLockError {
    let mut text = String::new();
    let pid = file
        .read_to_string(&mut text)
        .ok()
        .and_then(|_| text.trim().parse().ok());
    DirLockError::InUse {
        dir: dir.to_path_buf(),
        pid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_naming_the_holder_until_the_first_is_dropped() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("data");
        let first = DirLock::exclusive(&dir).expect("the first lock");
        assert_eq!(first.dir(), dir);
        let refused = DirLock::exclusive(&dir).expect_err("a second exclusive lock");
        let message = refused.to_string();
        assert!(
            matches!(refused, DirLockError::InUse { pid: Some(p), .. } if p == std::process::id()),
            "{refused:?}"
        );
        assert!(message.contains(&dir.display().to_string()), "{message}");
        assert!(
            message.contains(&format!("pid {}", std::process::id())),
            "{message}"
        );
        assert!(!message.contains('\n'), "one line: {message}");
        assert!(DirLock::shared(&dir).is_err(), "a reader is refused too");
        drop(first);
        let second = DirLock::exclusive(&dir).expect("free again once dropped");
        drop(second);
        let reader = DirLock::shared(&dir).expect("a reader of a free dir");
        assert!(reader.is_some());
        assert!(
            DirLock::shared(&dir).expect("readers share").is_some(),
            "two readers at once"
        );
        assert!(
            DirLock::exclusive(&dir).is_err(),
            "a writer waits for the readers"
        );
    }

    #[test]
    fn undoing_a_lock_leaves_the_dir_as_it_was_found() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let fresh = tmp.path().join("fresh");
        DirLock::exclusive(&fresh).expect("lock").undo();
        assert!(!fresh.exists(), "a dir the lock made is gone again");
        let kept = tmp.path().join("kept");
        fs::create_dir_all(&kept).expect("mkdir");
        fs::write(kept.join("data"), "x").expect("write");
        DirLock::exclusive(&kept).expect("lock").undo();
        let left: Vec<_> = fs::read_dir(&kept).expect("read").collect();
        assert_eq!(left.len(), 1, "only what was there before");
        // A lock file that was there stays.
        fs::write(kept.join(LOCK_FILE), "1\n").expect("write");
        DirLock::exclusive(&kept).expect("lock").undo();
        assert!(kept.join(LOCK_FILE).exists());
    }

    #[test]
    fn a_lock_on_a_file_removed_from_its_path_is_taken_again() {
        let tmp = tempfile::tempdir().expect("tempdir");
        // Another process opened the file, then lost the race: the file it
        // holds open was removed, and locking it would lock nothing.
        fs::write(tmp.path().join(LOCK_FILE), "").expect("write");
        let stale = File::open(tmp.path().join(LOCK_FILE)).expect("open");
        fs::remove_file(tmp.path().join(LOCK_FILE)).expect("remove");
        assert!(!same_file(&stale, &tmp.path().join(LOCK_FILE)).expect("stat"));
        let lock = DirLock::exclusive(tmp.path()).expect("lock");
        assert!(tmp.path().join(LOCK_FILE).exists());
        assert!(DirLock::exclusive(tmp.path()).is_err());
        drop(lock);
    }

    #[test]
    fn a_reader_creates_nothing_in_a_dir_never_locked() {
        let tmp = tempfile::tempdir().expect("tempdir");
        assert!(DirLock::shared(tmp.path()).expect("no lock file").is_none());
        assert!(!tmp.path().join(LOCK_FILE).exists());
    }

    #[test]
    fn a_lock_file_left_by_a_dead_holder_binds_nothing() {
        let tmp = tempfile::tempdir().expect("tempdir");
        fs::write(tmp.path().join(LOCK_FILE), "4242\n").expect("write");
        let lock = DirLock::exclusive(tmp.path()).expect("no process holds it");
        let pid = fs::read_to_string(tmp.path().join(LOCK_FILE)).expect("read");
        assert_eq!(pid, format!("{}\n", std::process::id()));
        drop(lock);
    }
}
