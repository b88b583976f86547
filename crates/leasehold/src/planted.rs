//! Bugs planted on purpose in this client (feature `planted-bugs`), for a
//! test suite to show it catches a client that breaks a rule. Nothing is
//! planted unless [`plant`] is called; builds without the feature have no
//! switch at all.

use std::sync::atomic::{AtomicU8, Ordering};

/// A rule broken on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ClientBug {
    /// Each renewal's deadline counts from when its answer came back, not
    /// from when it was sent: a reply held up on the way back makes the
    /// client believe in its lease after the server has expired it.
    DeadlineFromReply = 1,
}

static PLANTED: AtomicU8 = AtomicU8::new(0);

/// Plants `bug` in every lease this process takes from now on.
pub fn plant(bug: ClientBug) {
    PLANTED.store(bug as u8, Ordering::SeqCst);
}

/// The bug planted by its name (`deadline-from-reply`), if it is one.
pub fn by_name(name: &str) -> Option<ClientBug> {
    match name {
        "deadline-from-reply" => Some(ClientBug::DeadlineFromReply),
        _ => None,
    }
}

pub(crate) fn planted(bug: ClientBug) -> bool {
    PLANTED.load(Ordering::SeqCst) == bug as u8
}
