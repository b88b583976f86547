//! What an operator asks of a group, beside serving locks.
//!
//! - `membership`: status, add, remove, and leadership transfer.
//! - [`backup`]: backups of the applied table, and restores from them.
//! - [`hash_check`]: members' tables hashed at the same log indexes, and
//!   compared by the leader.

pub mod backup;
pub mod hash_check;
pub(in crate::raft) mod membership;
