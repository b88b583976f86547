//! Lock-table benchmarks: commands applied per second, and heap bytes per held
//! lock (measured with a counting allocator). Run: `cargo bench -p leasehold-core`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use leasehold_core::{Command, LockTable, Response, Stamp};

/// Counts live heap bytes, to report what a held lock costs.
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

const STAMP: Stamp = Stamp { now: 1, epoch: 1 };

fn lease(table: &mut LockTable) -> u64 {
    match table.apply(
        STAMP,
        Command::Grant {
            ttl_ms: 60_000,
            holder: "bench".into(),
            request_id: 0,
        },
        &mut Vec::new(),
    ) {
        Ok(Response::LeaseGranted { lease, .. }) => lease,
        other => panic!("{other:?}"),
    }
}

fn acquire(lease: u64, key: String) -> Command {
    Command::Acquire {
        lease,
        key,
        wait_ms: 0,
        lock_delay_ms: 0,
        request_id: 0,
        mode: leasehold_core::Mode::Exclusive,
    }
}

/// A table holding `n` locks on one lease.
fn holding(n: usize) -> LockTable {
    let mut table = LockTable::new();
    let l = lease(&mut table);
    let mut events = Vec::new();
    for i in 0..n {
        table
            .apply(STAMP, acquire(l, format!("bench/hold/{i:08}")), &mut events)
            .unwrap();
        events.clear();
    }
    table
}

fn bytes_per_held_lock() {
    let n = 100_000;
    let before = LIVE.load(Ordering::Relaxed);
    let table = holding(n);
    let after = LIVE.load(Ordering::Relaxed);
    println!(
        "heap bytes per held lock: {:.0} (keys of 19 bytes, {n} locks on one lease)",
        (after - before) as f64 / n as f64
    );
    drop(table);
}

fn apply(c: &mut Criterion) {
    bytes_per_held_lock();
    let mut group = c.benchmark_group("apply");
    group.throughput(Throughput::Elements(2));
    group.bench_function("acquire+release, 10k held", |b| {
        let mut table = holding(10_000);
        let l = lease(&mut table);
        let mut events = Vec::new();
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            let key = format!("bench/cycle/{}", i % 1024);
            let Ok(Response::Acquired(g)) =
                table.apply(STAMP, acquire(l, key.clone()), &mut events)
            else {
                panic!()
            };
            table
                .apply(
                    STAMP,
                    Command::Release {
                        key,
                        fence: g.fence,
                        request_id: 0,
                    },
                    &mut events,
                )
                .unwrap();
            events.clear();
        });
    });
    group.throughput(Throughput::Elements(1));
    group.bench_function("keepalive, 10k leases", |b| {
        let mut table = LockTable::new();
        let leases: Vec<u64> = (0..10_000).map(|_| lease(&mut table)).collect();
        let mut events = Vec::new();
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % leases.len();
            table
                .apply(STAMP, Command::KeepAlive { lease: leases[i] }, &mut events)
                .unwrap();
        });
    });
    group.bench_function("snapshot clone, 100k held", |b| {
        let table = holding(100_000);
        b.iter_batched(|| (), |_| table.clone(), BatchSize::SmallInput);
    });
    group.finish();
}

criterion_group!(benches, apply);
criterion_main!(benches);
