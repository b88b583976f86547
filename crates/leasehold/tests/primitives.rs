//! Semaphores and read/write locks against a real `leaseholdd` process.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::{Client, Error, LockOptions};
use leasehold_testkit::Leaseholdd;

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
            let client = Client::builder(&url)
                .holder(format!("w{i}"))
                .connect()
                .await
                .expect("connect");
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
    let a = Client::builder(&server.url())
        .holder("a")
        .connect()
        .await
        .expect("connect");
    let b = Client::builder(&server.url())
        .holder("b")
        .connect()
        .await
        .expect("connect");
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
    let client = |name: &'static str| {
        let url = server.url();
        async move {
            Client::builder(&url)
                .holder(name)
                .connect()
                .await
                .expect("connect")
        }
    };
    let (r1, r2, w, r3) = (
        client("r1").await,
        client("r2").await,
        client("w").await,
        client("r3").await,
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
