//! Bugs planted on purpose, for a simulation to show its checker catches
//! them (feature `planted-bugs`, turned on only by the simulation).
//!
//! The switch is per thread: a simulation runs a whole cluster on one
//! thread, and runs beside it (tests, other seeds) are not touched.

use std::cell::Cell;

/// A bug in the lock table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableBug {
    /// A new waiter goes to the front of its key's queue, not the back.
    LifoQueue,
    /// An expiry never starts the hold's lock-delay.
    NoLockDelay,
    /// A new leader forgets the renewals of each lease's last TTL, as one
    /// that kept renewals only in memory would: instead of a full TTL from
    /// its takeover, a lease's deadline goes back a TTL, and a lease renewed
    /// on time expires at the takeover.
    ForgetRenewals,
}

thread_local! {
    static PLANTED: Cell<Option<TableBug>> = const { Cell::new(None) };
}

/// Plants `bug` in every table used on this thread (`None` removes it).
pub fn plant(bug: Option<TableBug>) {
    PLANTED.with(|p| p.set(bug));
}

pub(crate) fn is(bug: TableBug) -> bool {
    PLANTED.with(|p| p.get()) == Some(bug)
}
