//! When mimalloc (the binary's global allocator) gives freed memory back to
//! the operating system.
//!
//! While a node loads its state it frees in bulk (the snapshot file's bytes,
//! once decoded into the table), and that memory should go back at once:
//! mimalloc otherwise returns it only once it has been free for a while
//! (1 s in mimalloc 3) and a later allocation gets round to it, which for an
//! idle node after a restart may be never (bench/memory.py: 271 MiB after a
//! restart of a million held locks, 160-180 MiB when purged at once).
//!
//! Once the node serves, purging at once costs every request: a request's
//! buffers are freed and their pages handed back (`madvise`, with a TLB
//! shoot-down across threads), then faulted in and zeroed again by the next
//! request. A single node under `cycle` x1 took ~9 page faults and ~4
//! `madvise` calls per cycle that way, against under one page fault per 100
//! cycles with mimalloc's own delay. So the delay is 0 while the node
//! starts, and mimalloc's default from then on.
//!
//! What a serving node frees in bulk (a snapshot installed from the leader
//! replacing its table, a snapshot's bytes once written) then follows that
//! delay too: it goes back as later allocations get round to it, and a
//! node that stays idle may keep it resident until it next takes a
//! snapshot or restarts.

use std::ffi::c_long;

use parking_lot::Mutex;

/// mimalloc's `mi_option_purge_delay` (its place in `mi_option_e`, the same
/// in mimalloc 2 and 3; the Rust bindings do not name it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// The delays mimalloc 2 and 3 start with. A mimalloc whose options moved
/// (another value here) is left as it is.
const KNOWN_DEFAULTS: [c_long; 2] = [10, 1000];

/// The delay mimalloc started with, read before [`purge_at_once`] changed it.
static DEFAULT_DELAY: Mutex<Option<c_long>> = Mutex::new(None);

/// Freed memory goes back at once, from now until [`purge_when_settled`].
pub fn purge_at_once() {
    // SAFETY: reading and setting an option; both take plain integers.
    unsafe {
        let default = libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY);
        if KNOWN_DEFAULTS.contains(&default) {
            *DEFAULT_DELAY.lock() = Some(default);
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0);
        }
    }
}

/// Gives back what is free now, and from then on leaves freed memory to
/// mimalloc's own delay. Does nothing unless [`purge_at_once`] changed it.
pub fn purge_when_settled() {
    if let Some(default) = DEFAULT_DELAY.lock().take() {
        // SAFETY: a collection of this thread's heap, and an option set to
        // the value mimalloc started with.
        unsafe {
            libmimalloc_sys::mi_collect(true);
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, default);
        }
    }
}
