//! The client against a real `leaseholdd` process, including real faults:
//! SIGSTOP of a holder, SIGSTOP of the server, kill -9 and restart of the server.

use std::time::Duration;

use leasehold::{Client, Error, LockOptions};
use leasehold_testkit::{workspace_bin, Leaseholdd, Process};

fn opts(ttl_ms: u64) -> LockOptions {
    LockOptions::default().ttl(Duration::from_millis(ttl_ms))
}

#[tokio::test]
async fn contention_fencing_and_checkpoints() {
    let server = Leaseholdd::start();
    let a = Client::builder(&server.url())
        .holder("a")
        .connect()
        .await
        .unwrap();
    let b = Client::builder(&server.url())
        .holder("b")
        .connect()
        .await
        .unwrap();

    let la = a.try_acquire("job", opts(5_000)).await.unwrap();
    match b.try_acquire("job", opts(5_000)).await {
        Err(Error::Held { holder, fence, .. }) => {
            assert_eq!((holder.as_str(), fence), ("a", la.fence()))
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("two holders"),
    }
    la.save_checkpoint(b"item 17").await.unwrap();
    let fa = la.token().unwrap();
    la.release().await.unwrap();

    let lb = b.try_acquire("job", opts(5_000)).await.unwrap();
    assert!(lb.token().unwrap() > fa);
    assert_eq!(lb.checkpoint(), Some(&b"item 17"[..]));
}

/// What crosses the wire comes back exact: a holder name that looks like a
/// number, and checkpoint bytes that are not text.
#[tokio::test]
async fn numeric_holders_and_binary_checkpoints_survive_the_wire() {
    let server = Leaseholdd::start();
    let a = Client::builder(&server.url())
        .holder("42")
        .connect()
        .await
        .unwrap();
    let b = Client::connect(&server.url()).await.unwrap();
    let la = a.try_acquire("bin", opts(5_000)).await.unwrap();
    match b.try_acquire("bin", opts(5_000)).await {
        Err(Error::Held { holder, fence, .. }) => {
            assert_eq!((holder.as_str(), fence), ("42", la.fence()))
        }
        other => panic!("expected Held, got {:?}", other.map(|l| l.fence())),
    }
    let bytes = [0u8, 255, 1, b'"', b'\\', 0xc3];
    la.save_checkpoint(&bytes).await.unwrap();
    la.release().await.unwrap();
    let lb = b.try_acquire("bin", opts(5_000)).await.unwrap();
    assert_eq!(lb.checkpoint(), Some(&bytes[..]));
}

/// The largest call there is, a 64 KiB checkpoint under a 512-byte key, fits
/// the framed protocol's request limit.
#[tokio::test]
async fn the_largest_checkpoint_under_the_longest_key_goes_through() {
    let server = Leaseholdd::start();
    let c = Client::connect(&server.url()).await.unwrap();
    let key = "k".repeat(512);
    let data = vec![0xa5; leasehold_core::limits::MAX_CHECKPOINT_LEN];
    let first = c.try_acquire(&key, opts(5_000)).await.unwrap();
    first.save_checkpoint(&data).await.unwrap();
    first.release().await.unwrap();
    let next = c.try_acquire(&key, opts(5_000)).await.unwrap();
    assert_eq!(next.checkpoint(), Some(&data[..]));
}

#[tokio::test]
async fn acquire_waits_in_the_queue_and_gets_a_higher_token() {
    let server = Leaseholdd::start();
    let a = Client::connect(&server.url()).await.unwrap();
    let b = Client::connect(&server.url()).await.unwrap();
    let la = a.try_acquire("k", opts(5_000)).await.unwrap();
    let fa = la.fence().unwrap();
    let waiter = tokio::spawn(async move {
        b.acquire("k", opts(5_000).wait(Duration::from_secs(10)))
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(la); // released in the background
    let lb = waiter
        .await
        .unwrap()
        .expect("granted after the drop released it");
    assert!(lb.fence().unwrap() > fa);

    let c = Client::connect(&server.url()).await.unwrap();
    let err = c
        .acquire("k", opts(5_000).wait(Duration::from_millis(300)))
        .await
        .err();
    assert!(matches!(err, Some(Error::Timeout { .. })), "{err:?}");
}

#[tokio::test]
async fn a_lease_outlives_many_ttls_while_renewed() {
    let server = Leaseholdd::start();
    let a = Client::connect(&server.url()).await.unwrap();
    let lease = a.try_acquire("k", opts(300)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(lease.is_live(), "lost: {}", lease.lost_reason());
    let other = Client::connect(&server.url()).await.unwrap();
    assert!(matches!(
        other.try_acquire("k", opts(300)).await,
        Err(Error::Held { .. })
    ));
}

#[tokio::test]
async fn a_client_renews_its_many_leases_together() {
    let server = Leaseholdd::start();
    let a = Client::connect(&server.url()).await.unwrap();
    // A lease per TTL: 200 leases, renewing every 0.7-0.8 s.
    let mut held = Vec::new();
    for i in 0..200 {
        let lease = a
            .try_acquire(&format!("k{i}"), opts(2_000 + i))
            .await
            .unwrap();
        held.push(lease);
    }
    // Twice the server stops answering for a while: the renewals that fall
    // due meanwhile wait for the call on its way, then go together.
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        server.process.pause();
        tokio::time::sleep(Duration::from_millis(400)).await;
        server.process.resume();
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for lease in &held {
        assert!(lease.is_live(), "lost: {}", lease.lost_reason());
    }
    let metrics = reqwest::get(format!("{}/metrics", server.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let batched: f64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("leasehold_requests_total{")
                && l.contains("op=\"keep_alive_many\"")
                && l.contains("code=\"ok\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(batched >= 2.0, "renewals went one by one:\n{metrics}");
    // Each lease was renewed past its TTL: the locks are still held.
    let other = Client::connect(&server.url()).await.unwrap();
    for key in ["k0", "k199"] {
        assert!(matches!(
            other.try_acquire(key, opts(1_000)).await,
            Err(Error::Held { .. })
        ));
    }
}

#[tokio::test]
async fn a_paused_holder_finds_its_lease_lost_before_its_next_fenced_write() {
    let server = Leaseholdd::start();
    let dir = tempfile_dir();
    let out = dir.join("writes.log");
    let writer = Process::spawn(
        &workspace_bin("examples/fenced_writer"),
        &[
            server.url(),
            "ledger".into(),
            "600".into(),
            out.display().to_string(),
        ],
        &dir.join("writer.out"),
    );
    wait_for(|| std::fs::read_to_string(&out).is_ok_and(|s| s.lines().count() >= 3)).await;

    writer.pause(); // a GC pause, a stalled VM
    let b = Client::connect(&server.url()).await.unwrap();
    let lb = b
        .acquire("ledger", opts(5_000).wait(Duration::from_secs(5)))
        .await
        .expect("B gets the lock");
    let fb = lb.token().unwrap();
    std::fs::OpenOptions::new()
        .append(true)
        .open(&out)
        .and_then(|mut f| std::io::Write::write_all(&mut f, format!("B {fb}\n").as_bytes()))
        .unwrap();
    writer.resume();
    wait_for(|| writer.output().contains("lost")).await;

    let log = std::fs::read_to_string(&out).unwrap();
    let after_b: Vec<&str> = log
        .lines()
        .skip_while(|l| !l.starts_with("B "))
        .skip(1)
        .collect();
    assert!(
        after_b.iter().all(|l| l.starts_with("A lost")),
        "the paused holder wrote after the new holder:\n{log}"
    );
    let fa: u64 = log
        .lines()
        .next()
        .unwrap()
        .trim_start_matches("A ")
        .parse()
        .unwrap();
    assert!(fb > fa);
    drop(writer);
}

#[tokio::test]
async fn with_lock_cancels_its_body_when_the_lease_is_lost() {
    let server = Leaseholdd::start();
    let a = Client::connect(&server.url()).await.unwrap();
    let body_finished = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = body_finished.clone();
    let run = tokio::spawn(async move {
        a.with_lock("k", opts(600), |lease| async move {
            assert!(lease.token().is_ok());
            tokio::time::sleep(Duration::from_secs(10)).await;
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.process.pause(); // renewals stop getting answers
    let result = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("with_lock returns")
        .unwrap();
    server.process.resume();
    assert!(matches!(result, Err(Error::LeaseLost { .. })), "{result:?}");
    assert!(!body_finished.load(std::sync::atomic::Ordering::SeqCst));
}

/// A hold released by its token elsewhere (`leasehold release KEY --fence
/// F`) is lost at the holder's next renewal, though its lease lives on;
/// the other holds on that lease go on.
#[tokio::test]
async fn a_hold_released_by_its_token_elsewhere_is_lost_at_the_next_renewal() {
    let server = Leaseholdd::start();
    let a = Client::connect(&server.url()).await.unwrap();
    let released = a.try_acquire("elsewhere/1", opts(600)).await.unwrap();
    let kept = a.try_acquire("elsewhere/2", opts(600)).await.unwrap();
    let operator = Client::connect(&server.url()).await.unwrap();
    operator
        .release_by_fence("elsewhere/1", released.fence().unwrap())
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), released.lost())
        .await
        .expect("the released hold was not said lost");
    assert!(
        released
            .lost_reason()
            .contains("released by its token elsewhere"),
        "{}",
        released.lost_reason()
    );
    assert!(released.token().is_err());
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        kept.is_live(),
        "the other hold on the lease: {}",
        kept.lost_reason()
    );
    assert!(matches!(
        released.release().await,
        Err(Error::LeaseLost { .. })
    ));
    kept.release().await.unwrap();
}

#[tokio::test]
async fn release_after_loss_says_so_and_leaves_the_new_holder_alone() {
    let server = Leaseholdd::start();
    let a = Client::connect(&server.url()).await.unwrap();
    let la = a.try_acquire("k", opts(500)).await.unwrap();
    server.process.pause();
    la.lost().await;
    server.process.resume();
    let b = Client::connect(&server.url()).await.unwrap();
    let lb = b
        .acquire("k", opts(5_000).wait(Duration::from_secs(5)))
        .await
        .expect("B takes it after A's expiry");
    assert!(matches!(la.release().await, Err(Error::LeaseLost { .. })));
    let status = b.status("k").await.unwrap();
    assert_eq!(status[0].fence, lb.fence(), "A's release touched B's lock");
    assert!(lb.is_live());
}

#[tokio::test]
async fn a_server_restart_never_leaves_two_holders() {
    let mut server = Leaseholdd::start();
    let a = Client::connect(&server.url()).await.unwrap();
    // A TTL with room for a debug build to restart on a loaded machine.
    let la = a.try_acquire("k", opts(5_000)).await.unwrap();
    server.crash_and_restart();
    // Give the client a renewal round (every TTL/3) against the restarted server.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let b = Client::connect(&server.url()).await.unwrap();
    let second = b.try_acquire("k", opts(5_000)).await;
    match (la.is_live(), &second) {
        (true, Err(Error::Held { .. })) => {} // A kept it: restored with a full TTL
        (false, _) => {}                      // A was told it lost it
        (true, Ok(_)) => panic!("two holders after a restart"),
        (true, Err(e)) => panic!("unexpected: {e}"),
    }
    assert!(
        la.is_live(),
        "with a 5 s TTL and a quick restart, the lease should survive: {}",
        la.lost_reason()
    );
    // The same client goes on working over a new connection.
    la.release().await.unwrap();
    let again = a.try_acquire("k2", opts(5_000)).await.unwrap();
    again.release().await.unwrap();
}

/// A caller that gives up on a try-acquire (drops the future, e.g. in a
/// timeout) while the server is stalled: when the server answers with a
/// grant nobody will learn of, the client releases it, so the lock does not
/// stay held under the client's session for as long as the process lives.
#[tokio::test]
async fn an_abandoned_try_acquire_does_not_leave_the_lock_held() {
    let server = Leaseholdd::start();
    let a = Client::connect(&server.url()).await.unwrap();
    let b = Client::connect(&server.url()).await.unwrap();
    // a's session exists before the stall, so the stalled call is the acquire.
    a.try_acquire("warm-up", opts(10_000))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    server.process.pause();
    let gave_up =
        tokio::time::timeout(Duration::from_millis(300), a.try_acquire("k", opts(10_000))).await;
    assert!(gave_up.is_err(), "a stalled server answered");
    // a asks again before the stalled grant is answered: that is another
    // holder, and the release of the abandoned grant must not take its lock.
    let again = {
        let a = a.clone();
        tokio::spawn(async move { a.try_acquire("k", opts(10_000)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.process.resume();
    match again.await.unwrap() {
        Ok(lease) => {
            // It got the lock: it keeps it, whatever the cleanup does.
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert!(matches!(
                b.try_acquire("k", opts(10_000)).await,
                Err(Error::Held { .. })
            ));
            assert!(lease.is_live());
            lease.release().await.unwrap();
        }
        Err(Error::Held { .. }) => {} // the abandoned grant held it then
        Err(e) => panic!("{e}"),
    }
    // a hears the grant nobody waits for and releases it, well within the
    // session's 10 s TTL that a keeps renewing.
    let mut taken = None;
    for _ in 0..100 {
        match b.try_acquire("k", opts(10_000)).await {
            Ok(lease) => {
                taken = Some(lease);
                break;
            }
            Err(Error::Held { .. }) => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(taken.is_some(), "the abandoned grant is still held");
}

/// Many tasks on one client share its connection and its session: every call
/// gets its own answer, none is lost or crossed with another, and the first
/// calls, made at once, grant one lease between them.
#[tokio::test]
async fn concurrent_calls_on_one_client_each_get_their_own_answer() {
    let server = Leaseholdd::start();
    let client = std::sync::Arc::new(Client::connect(&server.url()).await.unwrap());
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let lock = client
                    .try_acquire(&format!("k{i}"), opts(10_000))
                    .await
                    .unwrap();
                let fence = lock.fence().unwrap();
                lock.release().await.unwrap();
                fence
            })
        })
        .collect();
    let mut fences = std::collections::HashSet::new();
    for t in tasks {
        assert!(
            fences.insert(t.await.unwrap()),
            "a fencing token given twice"
        );
    }
    assert_eq!(fences.len(), 200);
    assert!(client
        .status("")
        .await
        .unwrap()
        .iter()
        .all(|l| l.fence.is_none()));
    let addr = server.url().trim_start_matches("http://").to_string();
    let leases = leasehold_testkit::http_get(&addr, "/v1/leases").unwrap();
    assert_eq!(leases.matches("\"lease\":").count(), 1);
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "leasehold-test-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn rand_suffix() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

async fn wait_for(mut ready: impl FnMut() -> bool) {
    for _ in 0..500 {
        if ready() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("condition not reached in 10 s");
}

/// The server's view of a lock: the holding lease, if held.
fn server_holder(server: &Leaseholdd, key: &str) -> Option<(u64, u64)> {
    let body = leasehold_testkit::http_get(&server.addr, &format!("/v1/locks/{key}"))?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    Some((
        v["holder"]["lease"].as_u64()?,
        v["holder"]["fence"].as_u64()?,
    ))
}

fn server_leases(server: &Leaseholdd) -> usize {
    let body = leasehold_testkit::http_get(&server.addr, "/v1/leases").unwrap_or_default();
    body.matches("\"lease\":").count()
}

/// A reply lost on the way back (the request took effect) is retried with
/// the same request id: the grant of the session lease and the acquire each
/// happen once, the lease the client renews is the one that holds the lock,
/// and no lease is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_is_retried_without_acting_twice() {
    let server = Leaseholdd::start();
    let proxy = leasehold_testkit::FaultProxy::start(&server.addr);
    let client = Client::connect(&proxy.url()).await.unwrap();

    // The first reply is the session grant's.
    proxy.drop_next_reply();
    let la = client.try_acquire("a", opts(10_000)).await.unwrap();
    assert_eq!(proxy.dropped(), 1, "the fault acted");
    assert_eq!(server_leases(&server), 1, "one session lease, not two");
    let (session, fa) = server_holder(&server, "a").expect("a is held");
    assert_eq!(Some(fa), la.fence());

    // Now an acquire's reply.
    proxy.drop_next_reply();
    let lb = client.try_acquire("b", opts(10_000)).await.unwrap();
    assert_eq!(proxy.dropped(), 2, "the fault acted");
    let (holder, fb) = server_holder(&server, "b").expect("b is held");
    assert_eq!((holder, Some(fb)), (session, lb.fence()));
    assert_eq!(fb, fa + 1, "the retry granted nothing a second time");
    assert_eq!(server_leases(&server), 1);

    // The lease being renewed is the one holding both keys: past several TTLs
    // both are still held by it.
    tokio::time::sleep(Duration::from_millis(2 * 10_000 / 3 + 500)).await;
    assert!(la.is_live() && lb.is_live());
    assert_eq!(server_holder(&server, "b"), Some((session, fb)));
    la.release().await.unwrap();
    lb.release().await.unwrap();
}

/// A caller waiting in the queue when the server is killed (`kill -9`)
/// re-attaches to its wait after the restart and gets the lock when the
/// holder releases it, and keeps it past the re-attach bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_survives_a_server_crash() {
    let mut server = Leaseholdd::start();
    let a = Client::builder(&server.url())
        .holder("a")
        .connect()
        .await
        .unwrap();
    let b = Client::builder(&server.url())
        .holder("b")
        .connect()
        .await
        .unwrap();
    let la = a.try_acquire("job", opts(10_000)).await.unwrap();
    let waiting = tokio::spawn(async move {
        let lease = b
            .acquire("job", opts(10_000).wait(Duration::from_secs(30)))
            .await;
        (b, lease)
    });
    let queued = || {
        leasehold_testkit::http_get(&server.addr, "/v1/locks/job")
            .is_some_and(|body| body.contains("\"holder\":\"b\""))
    };
    wait_for(queued).await;
    server.crash_and_restart();
    // Give b's broken call time to come back, then release.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let fa = la.fence().unwrap();
    la.release().await.unwrap();
    let (_b, lb) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("b got an answer")
        .unwrap();
    let lb = lb.expect("b got the lock");
    assert!(lb.fence().unwrap() > fa);
    // Past the bound in which an unclaimed grant is taken back, b still holds it.
    tokio::time::sleep(Duration::from_millis(leasehold_core::REATTACH_MS + 1_000)).await;
    assert!(lb.is_live(), "{}", lb.lost_reason());
    assert_eq!(server_holder(&server, "job").map(|h| h.1), lb.fence());
    lb.release().await.unwrap();
}
