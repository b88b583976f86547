//! The Leasehold lock table.
//!
//! A distributed lock is a lease plus a fencing token. This crate is the state
//! that every Leasehold server replicates: leases with TTLs, locks hanging off
//! them, FIFO queues of waiters, one strictly increasing fencing-token sequence,
//! checkpoints and lock-delay.
//!
//! It is pure: no clock, no I/O, no async. Time arrives in each command's
//! [`Stamp`], so every replica that applies the same log reaches the same state.
//!
//! ```
//! use leasehold_core::{Command, LockTable, Mode, Response, Stamp};
//!
//! let mut table = LockTable::new();
//! let mut events = Vec::new();
//! let at = |now| Stamp { now, epoch: 1 };
//!
//! let Ok(Response::LeaseGranted { lease, .. }) =
//!     table.apply(at(0), Command::Grant { ttl_ms: 1_000, holder: "worker-a".into(), request_id: 0 }, &mut events)
//! else { panic!() };
//! let acquire = Command::Acquire { lease, key: "nightly".into(), wait_ms: 0, lock_delay_ms: 0, request_id: 0, mode: Mode::Exclusive };
//! let Ok(Response::Acquired(grant)) = table.apply(at(10), acquire, &mut events) else { panic!() };
//! assert_eq!(grant.fence, 1);
//!
//! // Without a renewal the lease expires, and the key is free again.
//! table.apply(at(1_000), Command::Tick, &mut events).unwrap();
//! assert!(table.lock("nightly", 1_000).is_none());
//! ```
#![deny(missing_docs)]

pub mod auth;
mod command;
mod error;
pub mod limits;
#[cfg(feature = "planted-bugs")]
pub mod planted;
mod table;

pub use command::{Checkpoint, Command, Event, Grant, Mode, Response, Stamp, WaitEnd};
pub use error::LockError;
pub use table::{
    Growth, HolderView, LeaseView, LockTable, LockView, Outcome, Owned, WaiterView,
    DEDUPE_CAPACITY, DEDUPE_WINDOW_MS, REATTACH_MS, RESTORE_STRIDE,
};

/// Milliseconds on the leader's clock.
pub type Time = u64;
/// A lease id. Never reused.
pub type LeaseId = u64;
/// A fencing token. Strictly increasing over the life of a deployment.
pub type Fence = u64;
/// A client-chosen id that makes a retried request safe. 0 means none.
pub type RequestId = u64;
