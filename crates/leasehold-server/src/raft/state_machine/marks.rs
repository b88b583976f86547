//! Marks of the applied table: its hash at every `--hash-check-every`th
//! log index, which members compare (`operations::hash_check`), and the
//! alarm raised when they differ.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use leasehold_core::LockTable;

/// A member's table hash at a log index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    /// The index of the entry after which the table was hashed.
    pub index: u64,
    /// The CRC-32 of the table's encoding.
    pub hash: u32,
}

/// A node's latest mark, when to take the next, and the alarm.
#[derive(Debug, Default)]
pub struct TableMarks {
    every: AtomicU64,
    latest: Mutex<Option<Mark>>,
    alarm: Mutex<Option<String>>,
}

impl TableMarks {
    /// Marks every `every` entries (0: never).
    pub fn set_every(&self, every: u64) {
        self.every.store(every, Ordering::Relaxed);
    }

    /// Whether the table is hashed after applying entry `index`.
    pub fn due(&self, index: u64) -> bool {
        let every = self.every.load(Ordering::Relaxed);
        every > 0 && index > 0 && index.is_multiple_of(every)
    }

    /// Records the table as of entry `index`.
    pub fn record(&self, index: u64, table: &LockTable) {
        match table_hash(table) {
            Ok(hash) => *self.latest.lock() = Some(Mark { index, hash }),
            Err(e) => tracing::warn!(index, error = %e, "cannot hash the table"),
        }
    }

    /// The latest mark.
    pub fn latest(&self) -> Option<Mark> {
        *self.latest.lock()
    }

    /// Whether marks are taken at all.
    pub fn enabled(&self) -> bool {
        self.every.load(Ordering::Relaxed) > 0
    }

    /// Raises the alarm: members were found to differ. It stays until the
    /// node restarts.
    pub fn raise_alarm(&self, alarm: String) {
        *self.alarm.lock() = Some(alarm);
    }

    /// The alarm, once members were found to differ.
    pub fn alarm(&self) -> Option<String> {
        self.alarm.lock().clone()
    }
}

/// A CRC-32 of the table's encoding, written through the hasher without
/// holding the bytes.
fn table_hash(table: &LockTable) -> io::Result<u32> {
    struct Crc(crc32fast::Hasher);
    impl io::Write for Crc {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.update(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut crc = Crc(crc32fast::Hasher::new());
    bincode::serialize_into(&mut crc, table).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(crc.0.finalize())
}
