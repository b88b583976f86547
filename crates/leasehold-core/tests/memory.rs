//! What a session and a held lock cost in the table, counted by the
//! allocator: the sizing in docs/operations.md rests on these figures, and a
//! change that makes them grow should be a choice, not an accident. Run
//! with `--nocapture` to see them.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Mutex;

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

/// Held by each test while it counts: the count is of the whole process.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

fn stamp(now: u64) -> Stamp {
    Stamp { now, epoch: 1 }
}

/// Grants a lease of `ttl_ms` to `holder` at time 1.
fn grant(table: &mut LockTable, ttl_ms: u64, holder: String) -> u64 {
    let grant = Command::Grant {
        ttl_ms,
        holder,
        request_id: 0,
    };
    match table.apply(stamp(1), grant, &mut Vec::new()) {
        Ok(Response::LeaseGranted { lease, .. }) => lease,
        other => panic!("grant: {other:?}"),
    }
}

/// Takes `key` for `lease` at time 1.
fn take(table: &mut LockTable, lease: u64, key: String) {
    let acquire = Command::Acquire {
        lease,
        key,
        wait_ms: 0,
        lock_delay_ms: 0,
        request_id: 0,
        mode: Mode::Exclusive,
    };
    if let Err(e) = table.apply(stamp(1), acquire, &mut Vec::new()) {
        panic!("acquire: {e}");
    }
}

/// `SESSIONS` leases as `leasehold bench --workload sessions` makes them:
/// each granted, then taking one key of its own, then renewed once a third
/// of its TTL later, in the order they came. Returns the table and the
/// live heap bytes it holds.
fn sessions() -> (LockTable, isize) {
    let before = live();
    let mut table = LockTable::new();
    for g in 0..SESSIONS {
        let lease = grant(&mut table, 30_000, format!("bench-session-{g}"));
        take(&mut table, lease, format!("bench/sessions/0badcafe/{g}"));
    }
    let mut events = Vec::new();
    for lease in 1..=SESSIONS {
        let renew = Command::KeepAlive { lease };
        table.apply(stamp(10_000), renew, &mut events).unwrap();
    }
    drop(events);
    table.check_invariants().unwrap();
    (table, live() - before)
}

#[test]
fn a_session_with_one_lock_stays_small() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
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

/// The most a lock held on a lease with many others may take of the
/// table's heap, with some room above what it takes (196 bytes, on
/// 2026-12-08).
const MAX_BYTES_PER_HELD_LOCK: isize = 230;

const HELD: u64 = 100_000;

#[test]
fn a_held_lock_stays_small() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let before = live();
    let mut table = LockTable::new();
    let lease = grant(&mut table, 60_000, "bench".into());
    for i in 0..HELD {
        take(&mut table, lease, format!("bench/hold/{i:08}"));
    }
    let per_lock = (live() - before) / HELD as isize;
    println!("heap bytes per held lock (keys of 19 bytes, {HELD} on one lease): {per_lock}");
    assert!(
        per_lock <= MAX_BYTES_PER_HELD_LOCK,
        "a held lock takes {per_lock} bytes of the table's heap, \
         more than {MAX_BYTES_PER_HELD_LOCK}: see what a lock gained"
    );
    drop(table);
}
