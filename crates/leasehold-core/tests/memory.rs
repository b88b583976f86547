//! What a session and a held lock cost in the table, counted by the
//! allocator: the sizing in docs/operations.md rests on these figures, and a
//! change that makes them grow should be a choice, not an accident.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use leasehold_core::{Command, LockTable, Mode, Response, Stamp};

/// Counts live heap bytes.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const SESSIONS: u64 = 100_000;

/// The most a session holding one lock may take of the table's heap, with
/// some room above what it takes (431 bytes, on 2026-12-08).
const MAX_BYTES_PER_SESSION: isize = 450;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

fn stamp(now: u64) -> Stamp {
    Stamp { now, epoch: 1 }
}

/// `SESSIONS` leases as `leasehold bench --workload sessions` makes them:
/// each granted, then taking one key of its own, then renewed once a third
/// of its TTL later, in the order they came. Returns the table and the live heap bytes it holds.
fn sessions() -> (LockTable, isize) {
    let before = live();
    let mut table = LockTable::new();
    let mut events = Vec::new();
    for g in 0..SESSIONS {
        let grant = Command::Grant {
            ttl_ms: 30_000,
            holder: format!("bench-session-{g}"),
            request_id: 0,
        };
        let lease = match table.apply(stamp(1), grant, &mut events) {
            Ok(Response::LeaseGranted { lease, .. }) => lease,
            other => panic!("grant: {other:?}"),
        };
        let acquire = Command::Acquire {
            lease,
            key: format!("bench/sessions/0badcafe/{g}"),
            wait_ms: 0,
            lock_delay_ms: 0,
            request_id: 0,
            mode: Mode::Exclusive,
        };
        table.apply(stamp(1), acquire, &mut events).unwrap();
        events.clear();
    }
    for lease in 1..=SESSIONS {
        let renew = Command::KeepAlive { lease };
        table.apply(stamp(10_000), renew, &mut events).unwrap();
    }
    table.check_invariants().unwrap();
    (table, live() - before)
}

#[test]
fn a_session_with_one_lock_stays_small() {
    let (table, bytes) = sessions();
    let per_session = bytes / SESSIONS as isize;
    println!("heap bytes per session holding one lock: {per_session}");
    assert!(
        per_session <= MAX_BYTES_PER_SESSION,
        "a session with one lock takes {per_session} bytes of the table's heap, \
         more than {MAX_BYTES_PER_SESSION}: see what a lease or a lock gained"
    );
    drop(table);
}
