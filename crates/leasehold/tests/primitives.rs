//! Semaphores and read/write locks against a real `leaseholdd` process.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::{Client, Error, LockOptions};
use leasehold_testkit::Leaseholdd;

/// A client of `url` named `holder`.
async fn client(url: &str, holder: &str) -> Client {
    Client::builder(url)
        .holder(holder)
        .connect()
        .await
        .expect("connect")
}

fn opts() -> LockOptions {
    LockOptions::default()
        .ttl(Duration::from_secs(5))
        .wait(Duration::from_secs(20))
}

/// 12 workers on a semaphore of 3: never more than 3 inside at once, all of
/// them get through, each permit with its own token, in grant order.
#[tokio::test]
async fn a_semaphore_never_admits_more_than_its_permits() {
    let server = Leaseholdd::start();
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut workers = Vec::new();
    for i in 0..12 {
        let url = server.url();
        let (inside, most, tokens) = (inside.clone(), most.clone(), tokens.clone());
        workers.push(tokio::spawn(async move {
            let client = client(&url, &format!("w{i}")).await;
            for _ in 0..3 {
                let lease = client
                    .acquire("api", opts().permits(3))
                    .await
                    .expect("a permit");
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokens
                    .lock()
                    .expect("tokens")
                    .push(lease.token().expect("live"));
                tokio::time::sleep(Duration::from_millis(20)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                lease.release().await.expect("release");
            }
        }));
    }
    for w in workers {
        w.await.expect("worker");
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 3, "{most} held permits of 3 at once");
    assert_eq!(most, 3, "the permits were never all in use");
    let mut tokens = tokens.lock().expect("tokens").clone();
    assert_eq!(tokens.len(), 36);
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 36, "two permits shared a token");
}

#[tokio::test]
async fn a_semaphore_of_another_size_is_refused_and_status_shows_its_holders() {
    let server = Leaseholdd::start();
    let a = client(&server.url(), "a").await;
    let b = client(&server.url(), "b").await;
    let la = a
        .try_acquire("pool", opts().permits(2))
        .await
        .expect("permit");
    let lb = b
        .try_acquire("pool", opts().permits(2))
        .await
        .expect("permit");
    assert!(lb.token().expect("live") > la.token().expect("live"));
    match b.try_acquire("pool", opts().permits(2)).await {
        Err(Error::Held { .. }) => {}
        other => panic!("a third permit of 2: {:?}", other.map(|l| l.fence())),
    }
    match a.try_acquire("pool", opts().permits(5)).await {
        Err(Error::InvalidArgument(why)) => assert!(why.contains("2 permits"), "{why}"),
        other => panic!("another size: {:?}", other.map(|l| l.fence())),
    }
    match a.try_acquire("pool", opts()).await {
        Err(Error::InvalidArgument(why)) => assert!(why.contains("semaphore"), "{why}"),
        other => panic!("a lock on a semaphore: {:?}", other.map(|l| l.fence())),
    }
    match a.try_acquire("pool", opts().permits(0)).await {
        Err(Error::InvalidArgument(why)) => assert!(why.contains("permits"), "{why}"),
        other => panic!("0 permits: {:?}", other.map(|l| l.fence())),
    }
    let status = a.status("pool").await.expect("status");
    assert_eq!(status.len(), 1);
    assert_eq!(status[0].permits, 2);
    let holders: Vec<&str> = status[0].holders.iter().map(|h| h.0.as_str()).collect();
    assert_eq!(holders, ["a", "b"]);
    la.release().await.expect("release");
    lb.release().await.expect("release");
}

/// Readers share; a writer waits for them and is alone; a reader that comes
/// while the writer waits queues behind it; every hold is fenced.
#[tokio::test]
async fn readers_share_a_writer_is_alone_and_is_not_starved() {
    let server = Leaseholdd::start();
    let url = server.url();
    let (r1, r2, w, r3) = (
        client(&url, "r1").await,
        client(&url, "r2").await,
        client(&url, "w").await,
        client(&url, "r3").await,
    );
    let l1 = r1
        .try_acquire("doc", opts().shared())
        .await
        .expect("reader");
    let l2 = r2
        .try_acquire("doc", opts().shared())
        .await
        .expect("reader");
    match w.try_acquire("doc", opts()).await {
        Err(Error::Held { .. }) => {}
        other => panic!("a writer beside readers: {:?}", other.map(|l| l.fence())),
    }
    let writer = tokio::spawn(async move {
        let lease = w.acquire("doc", opts()).await.expect("the writer");
        (w, lease)
    });
    // Wait until the writer is in line.
    let mut queued = false;
    for _ in 0..100 {
        let s = r1.status("doc").await.expect("status");
        if s.first().is_some_and(|l| l.waiters == 1) {
            queued = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(queued, "the writer never queued");
    // A new reader does not jump the waiting writer.
    match r3.try_acquire("doc", opts().shared()).await {
        Err(Error::Held { .. }) => {}
        other => panic!("a reader jumped the writer: {:?}", other.map(|l| l.fence())),
    }
    let late_reader = tokio::spawn(async move {
        let lease = r3.acquire("doc", opts().shared()).await.expect("reader");
        (r3, lease)
    });
    let reader_tokens = [l1.token().expect("live"), l2.token().expect("live")];
    l1.release().await.expect("release");
    l2.release().await.expect("release");
    let (_w, wl) = writer.await.expect("writer");
    let wt = wl.token().expect("live");
    assert!(reader_tokens.iter().all(|t| wt > *t));
    let s = r1.status("doc").await.expect("status");
    assert_eq!(s[0].holders.len(), 1, "the writer is alone: {s:?}");
    wl.release().await.expect("release");
    let (_r3, rl) = late_reader.await.expect("late reader");
    assert!(rl.token().expect("live") > wt);
    rl.release().await.expect("release");
}

#[tokio::test]
async fn other_stores_refuse_shared_holds_and_semaphores() {
    let client = Client::connect("memory://").await.expect("memory");
    match client.try_acquire("k", opts().permits(2)).await {
        Err(Error::Unsupported { .. }) => {}
        other => panic!("memory store took a permit: {:?}", other.map(|l| l.fence())),
    }
    match client.try_acquire("k", opts().shared()).await {
        Err(Error::Unsupported { .. }) => {}
        other => panic!(
            "memory store took a shared hold: {:?}",
            other.map(|l| l.fence())
        ),
    }
}

/// Transfers between accounts, each taking its two or three accounts as one
/// lock set in random order: no account is ever in two transfers at once,
/// the total is kept, and nobody deadlocks (every worker finishes).
#[tokio::test]
async fn lock_sets_move_money_between_accounts_without_overlap_or_deadlock() {
    const ACCOUNTS: usize = 5;
    let server = Leaseholdd::start();
    let balances = Arc::new(Mutex::new(vec![100i64; ACCOUNTS]));
    let busy = Arc::new(Mutex::new(vec![false; ACCOUNTS]));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for w in 0..8u64 {
        let url = server.url();
        let (balances, busy, overlaps) = (balances.clone(), busy.clone(), overlaps.clone());
        workers.push(tokio::spawn(async move {
            let client = client(&url, &format!("w{w}")).await;
            for round in 0..10u64 {
                // Two or three accounts, listed in an order of this worker's.
                let pick = (w * 7 + round * 3) as usize;
                let mut ids = vec![pick % ACCOUNTS, (pick + 1 + w as usize) % ACCOUNTS];
                if round % 2 == 0 {
                    ids.push((pick + 3) % ACCOUNTS);
                }
                ids.dedup();
                if w % 2 == 1 {
                    ids.reverse();
                }
                let names: Vec<String> = ids.iter().map(|i| format!("acct/{i}")).collect();
                let keys: Vec<&str> = names.iter().map(String::as_str).collect();
                let lease = client.acquire_set(&keys, opts()).await.expect("the set");
                {
                    let mut b = busy.lock().expect("busy");
                    if ids.iter().any(|i| b[*i]) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    ids.iter().for_each(|i| b[*i] = true);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                {
                    let mut bal = balances.lock().expect("balances");
                    let (from, to) = (ids[0], ids[ids.len() - 1]);
                    bal[from] -= 7;
                    bal[to] += 7;
                }
                {
                    let mut b = busy.lock().expect("busy");
                    ids.iter().for_each(|i| b[*i] = false);
                }
                lease.release().await.expect("release");
            }
        }));
    }
    for w in workers {
        tokio::time::timeout(Duration::from_secs(60), w)
            .await
            .expect("no deadlock")
            .expect("worker");
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    let total: i64 = balances.lock().expect("balances").iter().sum();
    assert_eq!(total, 100 * ACCOUNTS as i64);
}

#[tokio::test]
async fn a_lock_set_is_all_or_nothing_with_one_token() {
    let server = Leaseholdd::start();
    let a = client(&server.url(), "a").await;
    let b = client(&server.url(), "b").await;
    let held = a.try_acquire("y", opts()).await.expect("y");
    match b.try_acquire_set(&["x", "y", "z"], opts()).await {
        Err(Error::Held { .. }) => {}
        other => panic!("a set with a held key: {:?}", other.map(|l| l.fence())),
    }
    // Nothing of the refused set was taken.
    let status = b.status("").await.expect("status");
    let held_keys: Vec<&str> = status
        .iter()
        .filter(|l| l.fence.is_some())
        .map(|l| l.key.as_str())
        .collect();
    assert_eq!(held_keys, ["y"]);
    held.release().await.expect("release");

    let set = b
        .try_acquire_set(&["z", "x", "y"], opts())
        .await
        .expect("the set");
    let token = set.token().expect("live");
    let status = b.status("").await.expect("status");
    assert_eq!(status.len(), 3);
    assert!(status.iter().all(|l| l.fence == Some(token)), "{status:?}");
    assert!(matches!(
        a.try_acquire("x", opts()).await,
        Err(Error::Held { .. })
    ));
    set.release().await.expect("release");
    let status = b.status("").await.expect("status");
    assert!(status.iter().all(|l| l.fence.is_none()), "{status:?}");
    match a.try_acquire_set(&[], opts()).await {
        Err(Error::InvalidArgument(_)) => {}
        other => panic!("an empty set: {:?}", other.map(|l| l.fence())),
    }
}

/// A resource behind a read/write lock: the gate admits the writer's token,
/// refuses a reader's (newer, from the same sequence), and refuses a writer
/// whose hold ended.
#[tokio::test]
async fn a_read_write_gate_admits_writes_only_from_the_writer() {
    use leasehold_fence::{GateError, MemoryGate, ReadWriteGate};
    let server = Leaseholdd::start();
    let client = Client::connect(&server.url()).await.expect("connect");
    let checker = client.clone();
    let gate = ReadWriteGate::new(MemoryGate::new(), move |key: String, fence| {
        let c = checker.clone();
        async move {
            c.is_writer(&key, fence)
                .await
                .map_err(|e| GateError::Store(e.to_string()))
        }
    });
    let writer = client.try_acquire("doc", opts()).await.expect("writer");
    let wt = writer.token().expect("live");
    gate.admit_write("doc-file", "doc", wt)
        .await
        .expect("the writer writes");
    writer.release().await.expect("release");
    // The writer's hold ended: its token writes no more.
    assert!(matches!(
        gate.admit_write("doc-file", "doc", wt).await,
        Err(GateError::NotWriter { .. })
    ));
    let reader = client
        .try_acquire("doc", opts().shared())
        .await
        .expect("reader");
    let rt = reader.token().expect("live");
    assert!(rt > wt);
    match gate.admit_write("doc-file", "doc", rt).await {
        Err(GateError::NotWriter { fence, .. }) => assert_eq!(fence, rt),
        other => panic!("a reader's token wrote: {other:?}"),
    }
    reader.release().await.expect("release");
    let next = client.try_acquire("doc", opts()).await.expect("writer");
    gate.admit_write("doc-file", "doc", next.token().expect("live"))
        .await
        .expect("the next writer writes");
    next.release().await.expect("release");
}
