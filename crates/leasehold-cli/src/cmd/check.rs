//! The lease state `leasehold run` keeps for its command, and `leasehold
//! check`, which reads it.
//!
//! SIGTERM is not instant: a command may still write after its lease is lost.
//! So `leasehold run` keeps a small file current (its path is in the
//! command's `LEASEHOLD_STATE`): the fencing token and the lease's client-side
//! deadline on the system-wide monotonic clock (`CLOCK_MONOTONIC`, the same
//! for every process on the machine), rewritten after each renewal, and
//! `lost` the moment the lease is lost. `leasehold check` exits 0 (printing
//! the token) only while that deadline is ahead, so a command can ask right
//! before each write:
//!
//! ```sh
//! while leasehold check >/dev/null; do write-one-batch; done
//! ```
//!
//! If `leasehold run` is frozen, it stops rewriting the file, the deadline
//! passes, and `check` fails on its own, whatever the frozen supervisor
//! would have said. The write itself must still go through a fence gate with
//! `LEASEHOLD_FENCE`: between a `check` and the write, the command may pause
//! too.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use tokio::time::Instant;

use crate::EXIT_LOST;

/// Milliseconds on `CLOCK_MONOTONIC`.
fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only the struct passed.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    (ts.tv_sec as u64) * 1_000 + (ts.tv_nsec as u64) / 1_000_000
}

/// The state file of one `leasehold run`; removed when dropped.
pub struct StateFile {
    path: PathBuf,
}

impl StateFile {
    /// A new file in the temporary directory.
    pub fn create() -> anyhow::Result<StateFile> {
        let path = std::env::temp_dir().join(format!(
            "leasehold-run-{}-{:016x}.state",
            std::process::id(),
            rand::random::<u64>()
        ));
        let file = StateFile { path };
        file.write("lost 0 0")?;
        Ok(file)
    }

    /// Its path, for the command's `LEASEHOLD_STATE`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whole or not at all: written beside and renamed over.
    fn write(&self, line: &str) -> anyhow::Result<()> {
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, format!("{line}\n"))
            .with_context(|| format!("write {}", tmp.display()))?;
        std::fs::rename(&tmp, &self.path)
            .with_context(|| format!("rename to {}", self.path.display()))
    }

    /// The lease with `fence` is good until `deadline`.
    pub fn live(&self, fence: u64, deadline: Instant) -> anyhow::Result<()> {
        let left = deadline.saturating_duration_since(Instant::now());
        let until = monotonic_ms() + left.as_millis() as u64;
        self.write(&format!("live {fence} {until}"))
    }

    /// The lease is lost.
    pub fn lost(&self, fence: u64) -> anyhow::Result<()> {
        self.write(&format!("lost {fence} 0"))
    }
}

impl Drop for StateFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// How often `leasehold run` looks at its lease's deadline to rewrite the file.
pub const REFRESH: Duration = Duration::from_millis(100);

/// `leasehold check`: 0 and the token while the lease is good, otherwise
/// `EXIT_LOST` and why on stderr.
pub fn check(state: Option<PathBuf>) -> anyhow::Result<i32> {
    let Some(path) = state else {
        eprintln!("leasehold: check: no LEASEHOLD_STATE (run it under `leasehold run`)");
        return Ok(EXIT_LOST);
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("leasehold: check: {}: {e}", path.display());
            return Ok(EXIT_LOST);
        }
    };
    let fields: Vec<&str> = text.split_whitespace().collect();
    let parsed = match fields.as_slice() {
        [state, fence, until] => fence
            .parse::<u64>()
            .ok()
            .zip(until.parse::<u64>().ok())
            .map(|(f, u)| (*state, f, u)),
        _ => None,
    };
    let Some((state, fence, until)) = parsed else {
        eprintln!("leasehold: check: {} is not a lease state", path.display());
        return Ok(EXIT_LOST);
    };
    let now = monotonic_ms();
    match state {
        "live" if now < until => {
            println!("{fence}");
            Ok(0)
        }
        "live" => {
            eprintln!(
                "leasehold: check: the lease with fence {fence} is past its deadline by {} ms",
                now - until
            );
            Ok(EXIT_LOST)
        }
        _ => {
            eprintln!("leasehold: check: the lease with fence {fence} is lost");
            Ok(EXIT_LOST)
        }
    }
}
