//! The state machine's tests: snapshots when due, and work kept off the
//! runtime thread.

use std::sync::atomic::AtomicBool;

use leasehold_core::Stamp;

use super::*;
use crate::raft::storage::snapshot_store::{FileSnapshots, MemorySnapshots};
use crate::raft::{CommittedLeaderId, Request};

fn open(snapshots: Arc<dyn SnapshotStore>, snapshot_every: u64) -> StateMachine {
    StateMachine::open(snapshots, Arc::default(), snapshot_every, Arc::default()).expect("open")
}

/// One log entry at `index` carrying `commands`.
fn entry(index: u64, commands: Vec<Command>) -> Entry {
    let stamp = Stamp {
        now: 1_000 + index,
        epoch: 1,
    };
    Entry {
        log_id: LogId::new(
            CommittedLeaderId {
                term: 1,
                node_id: 1,
            },
            index,
        ),
        payload: EntryPayload::Normal(Request { stamp, commands }),
    }
}

fn grants(from: usize, n: usize) -> Vec<Command> {
    (from..from + n)
        .map(|i| Command::Grant {
            ttl_ms: 600_000,
            holder: format!("holder-{i:08}"),
            request_id: 0,
        })
        .collect()
}

fn ticks(n: usize) -> Vec<Command> {
    vec![Command::Tick; n]
}

fn due(sm: &StateMachine) -> bool {
    sm.shared.snapshot_requested.load(Ordering::Relaxed)
}

fn size_of(entry: &Entry) -> u64 {
    match &entry.payload {
        EntryPayload::Normal(request) => bincode::serialized_size(request).unwrap(),
        _ => 0,
    }
}

async fn snapshot(sm: &mut StateMachine) -> usize {
    let built = sm.get_snapshot_builder().await.build_snapshot().await;
    built.expect("build").snapshot.len()
}

#[tokio::test]
async fn a_big_table_is_snapshotted_once_the_log_since_is_as_large() {
    let mut sm = open(Arc::new(MemorySnapshots::default()), 100);
    // The first snapshot comes after `snapshot_every` commands...
    sm.apply_all(vec![entry(1, grants(0, 99))])
        .await
        .expect("apply");
    assert!(!due(&sm));
    sm.apply_all(vec![entry(2, grants(99, 1))])
        .await
        .expect("apply");
    assert!(due(&sm));
    let size = snapshot(&mut sm).await as u64;
    assert_eq!(sm.shared.last_snapshot_bytes.load(Ordering::Relaxed), size);
    // ... and after a small one, the next as many commands later.
    sm.apply_all(vec![entry(3, ticks(100))])
        .await
        .expect("apply");
    assert!(due(&sm), "100 ticks after a {size}-byte snapshot");
    snapshot(&mut sm).await;

    // After a big one, commands are not enough: their entries must be
    // as large as it.
    let big = 2 * SMALL_SNAPSHOT;
    sm.shared.last_snapshot_bytes.store(big, Ordering::Relaxed);
    let ticked = entry(4, ticks(1_000));
    let mut written = size_of(&ticked);
    sm.apply_all(vec![ticked]).await.expect("apply");
    assert!(!due(&sm), "1,000 ticks against a {big}-byte snapshot");
    let mut index = 5;
    while !due(&sm) {
        let granted = entry(index, grants(index as usize * 1_000, 1_000));
        written += size_of(&granted);
        sm.apply_all(vec![granted]).await.expect("apply");
        index += 1;
        assert!(written < 2 * big, "not due after {written} bytes");
    }
    assert!(written >= big, "due after {written} bytes against {big}");
}

#[tokio::test]
async fn a_snapshot_is_serialized_and_installed_off_the_runtime_thread() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut sm = open(Arc::new(FileSnapshots::in_dir(dir.path())), 1_000);
    for batch in 0..50 {
        let commands = grants(batch * 1_000, 1_000);
        sm.apply_all(vec![entry(batch as u64 + 1, commands)])
            .await
            .expect("apply");
    }
    // On this test's one runtime thread, another task runs while the
    // table is serialized and while a snapshot is installed: neither
    // holds the thread.
    let (ran, writer) = hold_until_a_task_runs(&sm.shared, true);
    let mut builder = sm.get_snapshot_builder().await;
    writer.join().expect("writer");
    assert!(
        ran.load(Ordering::Relaxed),
        "the runtime waited for the serialization"
    );
    let snapshot = builder.build_snapshot().await.expect("build");

    let other = tempfile::tempdir().expect("tempdir");
    let mut fresh = open(Arc::new(FileSnapshots::in_dir(other.path())), 1_000);
    let ran = Arc::new(AtomicBool::new(false));
    let flag = ran.clone();
    tokio::spawn(async move { flag.store(true, Ordering::Relaxed) });
    fresh
        .install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .expect("install");
    assert!(
        ran.load(Ordering::Relaxed),
        "the runtime waited for the install"
    );
    assert_eq!(fresh.shared.read().table.lease_count(), 50_000);
    assert_eq!(fresh.shared.read().last_applied, snapshot.meta.last_log_id);
    let (_, stored) = FileSnapshots::in_dir(other.path())
        .load()
        .expect("load")
        .expect("stored");
    assert_eq!(stored.lease_count(), 50_000);
}

/// Acquires of `n` keys under `prefix` for `lease`.
fn acquires(lease: u64, prefix: &str, n: usize) -> Vec<Command> {
    (0..n)
        .map(|i| Command::Acquire {
            lease,
            key: format!("{prefix}/{i:08}"),
            wait_ms: 0,
            lock_delay_ms: 0,
            request_id: 0,
            mode: leasehold_core::Mode::Exclusive,
        })
        .collect()
}

/// Holds the applied state on another thread (to write, or to read)
/// until a task spawned on this test's one runtime thread runs, or half
/// a second passes. Whether the task has run, and the holding thread.
///
/// Work that needs the state then cannot finish before the task runs
/// if it waits off the runtime; done inline, it holds this thread until
/// the holder gives up, and the task runs only after it. Without the
/// hold, a test thread preempted on two busy cores let the work finish
/// before its first poll.
fn hold_until_a_task_runs(
    shared: &Arc<Shared>,
    write: bool,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<()>) {
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn({
        let shared = shared.clone();
        move || {
            let (_read, _write) = if write {
                (None, Some(shared.write()))
            } else {
                (Some(shared.read()), None)
            };
            held_tx.send(()).expect("send");
            let _ = go_rx.recv_timeout(std::time::Duration::from_millis(500));
        }
    });
    held_rx.recv().expect("held");
    let ran = Arc::new(AtomicBool::new(false));
    let flag = ran.clone();
    tokio::spawn(async move {
        flag.store(true, Ordering::Relaxed);
        let _ = go_tx.send(());
    });
    (ran, holder)
}

/// Applies `command` as entry `index`, and says whether another task
/// on this test's one runtime thread ran meanwhile.
async fn apply_watched(sm: &mut StateMachine, index: u64, command: Command) -> (bool, Outcome) {
    let (ran, reader) = hold_until_a_task_runs(&sm.shared, false);
    let mut outcomes = sm
        .apply_all(vec![entry(index, vec![command])])
        .await
        .expect("apply");
    reader.join().expect("reader");
    let outcome = outcomes
        .pop()
        .and_then(|mut o| o.pop())
        .expect("an outcome");
    (ran.load(Ordering::Relaxed), outcome)
}

#[tokio::test]
async fn ending_a_lease_of_many_locks_leaves_the_runtime_thread_free() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut sm = open(Arc::new(FileSnapshots::in_dir(dir.path())), 1_000_000);
    let many = HEAVY_KEYS + 1;
    sm.apply_all(vec![entry(1, grants(0, 2))])
        .await
        .expect("apply");
    sm.apply_all(vec![entry(2, acquires(1, "many", many))])
        .await
        .expect("apply");
    assert_eq!(sm.shared.read().table.held_count(), many);

    // Lease 2 holds a few keys: ending it stays inline.
    sm.apply_all(vec![entry(3, acquires(2, "few", 3))])
        .await
        .expect("apply");
    let (ran, _) = apply_watched(&mut sm, 4, Command::Revoke { lease: 2 }).await;
    assert!(!ran, "a small entry went off the runtime");

    // Lease 1 holds more than HEAVY_KEYS: the runtime runs on meanwhile.
    let (ran, outcome) = apply_watched(&mut sm, 5, Command::Revoke { lease: 1 }).await;
    assert!(ran, "the runtime waited for the revoke of {many} locks");
    match outcome {
        Ok(leasehold_core::Response::Revoked { released }) => assert_eq!(released.len(), many),
        other => panic!("revoke: {other:?}"),
    }
    assert_eq!(sm.shared.read().table.held_count(), 0);
    assert_eq!(sm.shared.last_applied_index(), 5);
}

#[tokio::test]
async fn a_reader_on_the_runtime_waits_for_the_table_without_holding_the_thread() {
    let sm = open(Arc::new(MemorySnapshots::default()), 1_000);
    let shared = sm.shared.clone();
    let (taken_tx, taken_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let writer = std::thread::spawn({
        let shared = shared.clone();
        move || {
            let mut applied = shared.write();
            applied.last_applied = Some(LogId::new(
                CommittedLeaderId {
                    term: 1,
                    node_id: 1,
                },
                7,
            ));
            taken_tx.send(()).expect("send");
            go_rx.recv().expect("go");
        }
    });
    taken_rx.recv().expect("taken");
    let reader = tokio::spawn({
        let shared = shared.clone();
        async move { shared.read_async(|a| a.last_applied.map(|l| l.index)).await }
    });
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    // This thread runs: the reader waits as a task, not on the thread.
    assert!(!reader.is_finished(), "read while the table was taken");
    go_tx.send(()).expect("go");
    writer.join().expect("writer");
    let seen = tokio::time::timeout(std::time::Duration::from_secs(5), reader)
        .await
        .expect("the reader was woken when the table was let go")
        .expect("reader");
    assert_eq!(seen, Some(7));
}
