//! The data dir: what a node keeps on disk, and the checks on it.
//!
//! - `log_store`: the log on disk, its segments indexed by entry range.
//! - `disk`: what the log needs of a disk ([`LogDisk`](crate::raft::LogDisk)), and the real one.
//! - [`snapshot_store`]: where the snapshot is kept (a file, or memory).
//! - [`format`](mod@format): format versions of the data dir, the table's encoding and
//!   peer messages.
//! - [`cluster_id`]: the id of the cluster a data dir belongs to.
//! - [`dir_lock`]: one process per data dir (an exclusive `flock`).
//! - [`check`]: `leaseholdd check`, a data dir verified offline.

pub mod check;
pub mod cluster_id;
pub mod dir_lock;
pub(in crate::raft) mod disk;
pub mod format;
pub(in crate::raft) mod log_store;
pub mod snapshot_store;

#[cfg(test)]
mod golden_tests;
