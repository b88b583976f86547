//! Files: write-then-rename with the token recorded beside the file.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::{Fence, FenceGate, GateError, Stale};

/// Fenced writes to files under a directory, for jobs that produce files.
///
/// `write(resource, fence, bytes)` replaces `DIR/RESOURCE` only if `fence` is at
/// least the token in `DIR/RESOURCE.fence`. Writers (in any process) take an
/// exclusive `flock` on `DIR/RESOURCE.lock` first. The new token is renamed
/// into place before the data, so a crash between the two leaves the token
/// raised: a stale writer stays refused, and the holder simply writes again.
#[derive(Debug, Clone)]
pub struct FileGate {
    dir: PathBuf,
}

fn store(e: io::Error) -> GateError {
    GateError::Store(e.to_string())
}

fn write_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path)
}

struct Flock(File);

impl Flock {
    fn exclusive(path: &Path) -> io::Result<Flock> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        // SAFETY: flock(2) on a descriptor we own for the life of `Flock`.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Flock(file))
    }
}

impl Drop for Flock {
    fn drop(&mut self) {
        // SAFETY: unlocking the descriptor locked in `exclusive`.
        unsafe {
            libc::flock(self.0.as_raw_fd(), libc::LOCK_UN);
        }
    }
}

impl FileGate {
    /// A gate over files in `dir` (created if missing).
    pub fn new(dir: impl Into<PathBuf>) -> io::Result<FileGate> {
        let dir = dir.into();
        fs::create_dir_all(&dir)?;
        Ok(FileGate { dir })
    }

    fn paths(&self, resource: &str) -> Result<(PathBuf, PathBuf, PathBuf), GateError> {
        if resource.is_empty() || resource.contains('/') || resource.starts_with('.') {
            return Err(GateError::Store(format!(
                "{resource:?} is not a plain file name"
            )));
        }
        let data = self.dir.join(resource);
        Ok((
            data.clone(),
            self.dir.join(format!("{resource}.fence")),
            self.dir.join(format!("{resource}.lock")),
        ))
    }

    fn highest_at(path: &Path) -> io::Result<Fence> {
        match fs::read_to_string(path) {
            Ok(s) => s
                .trim()
                .parse()
                .map_err(|e| io::Error::other(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Admits `fence` and, if admitted and `bytes` is given, replaces the file.
    fn admit_blocking(
        &self,
        resource: &str,
        fence: Fence,
        bytes: Option<&[u8]>,
    ) -> Result<(), GateError> {
        let (data, fence_path, lock) = self.paths(resource)?;
        let _lock = Flock::exclusive(&lock).map_err(store)?;
        let highest = Self::highest_at(&fence_path).map_err(store)?;
        if fence < highest {
            return Err(Stale {
                resource: resource.to_string(),
                presented: fence,
                highest,
            }
            .into());
        }
        if fence > highest {
            write_file(&fence_path, fence.to_string().as_bytes()).map_err(store)?;
        }
        if let Some(bytes) = bytes {
            write_file(&data, bytes).map_err(store)?;
        }
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(store)
    }

    /// Replaces `DIR/RESOURCE` with `bytes` if `fence` is not stale.
    pub async fn write(
        &self,
        resource: &str,
        fence: Fence,
        bytes: Vec<u8>,
    ) -> Result<(), GateError> {
        let (gate, resource) = (self.clone(), resource.to_string());
        tokio::task::spawn_blocking(move || gate.admit_blocking(&resource, fence, Some(&bytes)))
            .await
            .map_err(|e| GateError::Store(e.to_string()))?
    }
}

#[async_trait::async_trait]
impl FenceGate for FileGate {
    async fn admit(&self, resource: &str, fence: Fence) -> Result<(), GateError> {
        let (gate, resource) = (self.clone(), resource.to_string());
        tokio::task::spawn_blocking(move || gate.admit_blocking(&resource, fence, None))
            .await
            .map_err(|e| GateError::Store(e.to_string()))?
    }

    async fn highest(&self, resource: &str) -> Result<Fence, GateError> {
        let (_, fence_path, _) = self.paths(resource)?;
        Self::highest_at(&fence_path).map_err(store)
    }
}
