//! Lock-table benchmarks: commands applied per second. Run: `cargo bench -p
//! leasehold-core`. What a lock or a session costs of the heap is counted
//! in `tests/memory.rs`.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use leasehold_core::{Command, LockTable, Response, Stamp};

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

fn apply(c: &mut Criterion) {
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

/// A table of `n` leases holding a lock each, granted over `n / 40` ms.
fn sessions(n: u64) -> LockTable {
    let mut table = LockTable::new();
    let mut events = Vec::new();
    for i in 0..n {
        let at = Stamp {
            now: i / 40,
            epoch: 1,
        };
        let command = Command::GrantAndAcquire {
            ttl_ms: 30_000,
            holder: "bench".into(),
            key: format!("bench/session/{i:08}"),
            wait_ms: 0,
            lock_delay_ms: 0,
            request_id: 0,
            mode: leasehold_core::Mode::Exclusive,
        };
        table.apply(at, command, &mut events).unwrap();
        events.clear();
    }
    table
}

/// A new leader's first entry, and a snapshot (bincode, as a server writes
/// it) before a takeover, just after one, and once every lease was renewed
/// after it.
fn takeover(c: &mut Criterion) {
    let n = 100_000;
    let table = sessions(n);
    let takeover = Stamp {
        now: n / 40 + 1,
        epoch: 2,
    };
    let mut taken = table.clone();
    taken
        .apply(takeover, Command::Tick, &mut Vec::new())
        .unwrap();
    let mut renewed = taken.clone();
    for lease in 1..=n {
        let at = Stamp {
            now: takeover.now + 1,
            epoch: 2,
        };
        renewed
            .apply(at, Command::KeepAlive { lease }, &mut Vec::new())
            .unwrap();
    }
    let mut group = c.benchmark_group("takeover, 100k sessions");
    group.sample_size(20);
    group.bench_function("the new leader's first entry", |b| {
        b.iter_batched(
            || table.clone(),
            // The table is handed back, so its drop is not timed.
            |mut t| {
                let outcome = t.apply(takeover, Command::Tick, &mut Vec::new());
                (t, outcome)
            },
            BatchSize::LargeInput,
        );
    });
    for (name, t) in [
        ("snapshot before it", &table),
        ("snapshot just after it", &taken),
        ("snapshot, every lease renewed since", &renewed),
    ] {
        group.bench_function(name, |b| b.iter(|| bincode::serialize(t).unwrap()));
    }
    group.finish();
}

criterion_group!(benches, apply, takeover);
criterion_main!(benches);
