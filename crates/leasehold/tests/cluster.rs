//! The client against a 3-node cluster of real `leaseholdd` processes: it
//! finds the leader from any endpoint, and holders keep their locks through
//! a leader `kill -9` under load.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use leasehold::{Client, Error, LockOptions};
use leasehold_fence::MemoryGate;
use leasehold_testkit::Cluster;

/// One cluster at a time: three servers, and in one test twenty clients,
/// are all two cores take.
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

fn opts(ttl_ms: u64) -> LockOptions {
    LockOptions::default().ttl(Duration::from_millis(ttl_ms))
}

/// Given only one node's address, a client finds the leader and every
/// operation works: acquire, checkpoint, release, a wait, watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_works_through_any_single_endpoint() {
    let _serial = serial().await;
    let c = Cluster::start(3);
    for (i, node) in c.nodes.iter().enumerate() {
        let key = format!("job-{i}");
        let a = Client::connect(&node.url()).await.unwrap();
        let b = Client::connect(&node.url()).await.unwrap();
        let mut events = a.watch(&key).await.unwrap();

        let la = a.try_acquire(&key, opts(5_000)).await.unwrap();
        la.save_checkpoint(b"step 3").await.unwrap();
        let waiting = {
            let key = key.clone();
            tokio::spawn(async move {
                let lease = b
                    .acquire(&key, opts(5_000).wait(Duration::from_secs(10)))
                    .await;
                (b, lease)
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let fa = la.fence().unwrap();
        la.release().await.unwrap();
        let (_b, lb) = waiting.await.unwrap();
        let lb = lb.expect("the waiter got the lock");
        assert!(lb.fence().unwrap() > fa);
        assert_eq!(lb.checkpoint(), Some(&b"step 3"[..]));
        lb.release().await.unwrap();

        let mut kinds = Vec::new();
        while kinds.len() < 5 {
            let e = tokio::time::timeout(Duration::from_secs(5), events.next())
                .await
                .expect("an event")
                .expect("the stream goes on")
                .unwrap();
            kinds.push(e.kind);
        }
        assert_eq!(
            kinds,
            ["acquired", "checkpoint", "released", "acquired", "released"]
        );
        // Free, and kept listed for its checkpoint.
        let status = a.status(&key).await.unwrap();
        assert_eq!(status.len(), 1, "{status:?}");
        assert_eq!(status[0].fence, None, "{status:?}");
    }
}

#[derive(Debug, Clone)]
struct Hold {
    fence: u64,
    from: Instant,
    to: Instant,
}

/// 20 clients take and release five keys as fast as they can, writing
/// through a fence gate, while long holders (TTL 2 s) keep theirs; the
/// leader is killed with SIGKILL. A new leader serves; no two clients held a
/// key at once; tokens after the failover are above every earlier one;
/// every grant was released by its holder (none was lost); the long holders
/// kept their locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_kill_under_load_loses_no_lock() {
    let _serial = serial().await;
    let mut c = Cluster::start(3);
    let endpoints = c.endpoints();
    let gate = Arc::new(MemoryGate::new());
    let holds: Arc<Mutex<HashMap<String, Vec<Hold>>>> = Arc::default();

    let keeper = Client::connect(&endpoints).await.unwrap();
    let mut kept = Vec::new();
    for i in 0..3 {
        kept.push(
            keeper
                .try_acquire(&format!("kept-{i}"), opts(2_000))
                .await
                .unwrap(),
        );
    }

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..20 {
        let (endpoints, gate, holds, stop) =
            (endpoints.clone(), gate.clone(), holds.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let client = Client::connect(&endpoints).await.unwrap();
            let mut granted = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let key = format!("k{}", (w + granted) % 5);
                let lease = match client
                    .acquire(&key, opts(2_000).wait(Duration::from_secs(10)))
                    .await
                {
                    Ok(l) => l,
                    Err(Error::Unavailable(_)) | Err(Error::Timeout { .. }) => continue,
                    Err(e) => panic!("acquire: {e}"),
                };
                let from = Instant::now();
                let fence = lease.token().unwrap();
                gate.admit_now(&key, fence)
                    .expect("the gate admits the holder's write");
                tokio::time::sleep(Duration::from_millis(5)).await;
                let to = Instant::now();
                holds
                    .lock()
                    .unwrap()
                    .entry(key)
                    .or_default()
                    .push(Hold { fence, from, to });
                lease
                    .release()
                    .await
                    .expect("a grant was lost or its release refused");
                granted += 1;
                // A client's own work between locks; also leaves the 2 cores
                // of a test machine to the three servers.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            granted
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = holds
        .lock()
        .unwrap()
        .values()
        .flatten()
        .map(|h| h.fence)
        .max()
        .unwrap_or(0);
    let leader = c.wait_leader();
    c.kill(leader);
    let killed_at = Instant::now();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let first_after = holds
        .lock()
        .unwrap()
        .values()
        .flatten()
        .filter(|h| h.from > killed_at)
        .map(|h| h.from - killed_at)
        .min();
    eprintln!("first grant after the kill: {first_after:?}");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut total = 0;
    for w in workers {
        total += tokio::time::timeout(Duration::from_secs(20), w)
            .await
            .expect("a worker finished")
            .unwrap();
    }
    assert!(total > 0);

    let holds = holds.lock().unwrap().clone();
    let after: Vec<&Hold> = holds
        .values()
        .flatten()
        .filter(|h| h.from > killed_at)
        .collect();
    assert!(!after.is_empty(), "nothing was granted after the failover");
    assert!(
        after.iter().all(|h| h.fence > before),
        "a token after the failover went back"
    );
    let mut all: Vec<u64> = holds.values().flatten().map(|h| h.fence).collect();
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n, "a token was handed out twice");
    for (key, list) in &holds {
        let mut list = list.clone();
        list.sort_by_key(|h| h.fence);
        for pair in list.windows(2) {
            assert!(
                pair[0].to <= pair[1].from,
                "{key}: fence {} held until {:?} overlaps fence {} from {:?}",
                pair[0].fence,
                pair[0].to,
                pair[1].fence,
                pair[1].from
            );
        }
    }
    for lease in &kept {
        assert!(
            lease.is_live(),
            "a TTL 2 s holder lost its lock: {}",
            lease.lost_reason()
        );
    }
    let status = keeper.status("kept-").await.unwrap();
    for lease in &kept {
        assert!(
            status
                .iter()
                .any(|l| l.key == lease.key() && l.fence == lease.fence()),
            "{status:?}"
        );
    }
}

/// The leader is cut off from both followers (a proxy in front of each node
/// refuses the others' connections). It can commit nothing, so it grants,
/// renews and expires nothing: a holder that can reach only the old leader
/// loses its lease by its own deadline, before the majority's new leader
/// grants that key to anyone else; a holder that can reach the majority
/// keeps its lock through the new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_leader_loses_its_holders_before_the_majority_grants_again() {
    let _serial = serial().await;
    let c = Cluster::start_isolatable(3);
    let l = c.wait_leader();
    let others: Vec<usize> = (0..3).filter(|&i| i != l).collect();
    // `a` knows only the leader (by its own address, so the cut leaves it on
    // the leader's side: a leader without a quorum names no other); the
    // others know every node.
    let a = Client::connect(&c.nodes[l].url()).await.unwrap();
    let majority = format!(
        "http://{},{},{}",
        c.nodes[others[0]].addr, c.nodes[others[1]].addr, c.nodes[l].addr
    );
    let b = Client::connect(&majority).await.unwrap();
    let kept = Client::connect(&majority).await.unwrap();
    // A partition is found out later than a kill (calls to the cut-off
    // leader hang until it notices; a killed one refuses at once), so these
    // holders use a 3 s TTL.
    let la = a.try_acquire("a-key", opts(3_000)).await.unwrap();
    let lk = kept.try_acquire("kept-key", opts(3_000)).await.unwrap();

    // Cut the leader off from the followers, both ways.
    c.isolate(l);
    let isolated_at = Instant::now();
    let lost = la.lost_token();
    let lost_at = tokio::spawn(async move {
        lost.cancelled().await;
        Instant::now()
    });

    let lb = b
        .acquire("a-key", opts(3_000).wait(Duration::from_secs(15)))
        .await
        .expect("the majority grants the key once its holder's lease is over");
    let granted_at = Instant::now();
    let lost_at = tokio::time::timeout(Duration::from_secs(1), lost_at)
        .await
        .expect("a's loss was noticed")
        .unwrap();
    assert!(
        lost_at < granted_at,
        "a lost its lease at {:?}, but b was granted the key at {:?} (after the cut)",
        lost_at - isolated_at,
        granted_at - isolated_at
    );
    assert!(lb.fence() > la.fence());
    assert!(la.token().is_err());

    // The holder that reaches the majority kept its lock, past several TTLs.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(lk.is_live(), "{}", lk.lost_reason());
    let status = kept.status("kept-key").await.unwrap();
    assert_eq!(status[0].fence, lk.fence(), "{status:?}");
}

/// A wait queued at a leader that is then cut off from its followers: the
/// new leader grants the queued wait when the key is released, and the old
/// leader, which hears nothing, must not answer the waiting call "timed out"
/// while the key is in fact held for it. (It did: the key then stayed held
/// by the waiter's session, which nobody knew.) It says so only once it has
/// withdrawn the wait; cut off, it cannot, and answers `unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_on_a_cut_off_leader_is_never_reported_timed_out_while_granted() {
    let _serial = serial().await;
    let c = Cluster::start_isolatable(3);
    let l = c.wait_leader();
    let others: Vec<usize> = (0..3).filter(|&i| i != l).collect();
    let majority = format!(
        "http://{},{}",
        c.nodes[others[0]].addr, c.nodes[others[1]].addr
    );
    let a = Client::connect(&c.endpoints()).await.unwrap();
    let la = a.try_acquire("w-key", opts(5_000)).await.unwrap();
    // The waiter knows only the leader.
    let waiter = Client::builder(&c.nodes[l].url())
        .holder("waiter")
        .connect()
        .await
        .unwrap();
    let waiting = tokio::spawn(async move {
        let result = waiter
            .acquire("w-key", opts(10_000).wait(Duration::from_secs(3)))
            .await;
        (result, waiter)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;

    c.isolate(l);
    let majority_client = Client::connect(&majority).await.unwrap();
    // Once the majority leads, the release goes there and the new leader
    // grants the key to the queued wait.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match majority_client
            .release_by_fence("w-key", la.fence().unwrap())
            .await
        {
            Ok(()) => break,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("release through the majority: {e}"),
        }
    }
    let (result, _waiter) = waiting.await.unwrap();
    let held_by_waiter = majority_client
        .status("w-key")
        .await
        .unwrap()
        .iter()
        .any(|s| s.holder == "waiter");
    match result {
        Ok(lease) => assert!(lease.fence() > la.fence()),
        Err(Error::Timeout { .. }) => assert!(
            !held_by_waiter,
            "the wait was reported timed out, but the key is held by the waiter"
        ),
        // Honest: the old leader cannot know, and says so.
        Err(e) => assert!(
            matches!(e, Error::Unavailable(_) | Error::OutcomeUnknown(_)),
            "{e}"
        ),
    }
}

/// A release that no node could take (the whole cluster was down) is not
/// forgotten: the client sends it again in the background once the cluster
/// is back, and meanwhile does not take the key again on the same session.
/// (It used to drop the release: the key stayed held by the session, which
/// went on renewing it, and the client's next acquire of it was answered
/// with the old hold and its old token.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_nobody_took_is_sent_again_once_the_cluster_is_back() {
    let _serial = serial().await;
    let mut c = Cluster::start(3);
    let client = Client::connect(&c.endpoints()).await.unwrap();
    // A TTL that outlasts the outage, so the session lives through it.
    let held = client.try_acquire("r-key", opts(30_000)).await.unwrap();
    let first = held.fence().unwrap();
    for i in 0..3 {
        c.kill(i);
    }
    let released = held.release().await;
    assert!(
        matches!(
            released,
            Err(Error::Unavailable(_) | Error::OutcomeUnknown(_))
        ),
        "{released:?}"
    );
    for i in 0..3 {
        c.restart(i);
    }
    c.wait_leader();
    let again = client
        .acquire("r-key", opts(30_000).wait(Duration::from_secs(20)))
        .await
        .unwrap();
    assert!(
        again.fence().unwrap() > first,
        "the key was still held by the first hold (fence {first})"
    );
    let status = client.status("r-key").await.unwrap();
    assert_eq!(status[0].holders.len(), 1, "{status:?}");
}

/// A fourth node joins while ten clients take and release locks: it is
/// caught up and votes, and no client sees a grant lost or a release refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joins_under_load() {
    let _serial = serial().await;
    let mut c = Cluster::start(3);
    let endpoints = c.endpoints();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..10 {
        let (endpoints, stop) = (endpoints.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let client = Client::connect(&endpoints).await.unwrap();
            let mut done = 0u32;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let key = format!("load-{}", (w + done) % 4);
                match client
                    .acquire(&key, opts(5_000).wait(Duration::from_secs(10)))
                    .await
                {
                    Ok(lease) => {
                        lease.release().await.expect("a release was refused");
                        done += 1;
                    }
                    Err(Error::Unavailable(_)) | Err(Error::Timeout { .. }) => {}
                    Err(e) => panic!("acquire: {e}"),
                }
            }
            done
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let new = c.start_new_node(4);
    let leader = c.wait_leader();
    let mut admin =
        leasehold_proto::v1::leasehold_client::LeaseholdClient::connect(c.nodes[leader].url())
            .await
            .unwrap();
    let status = admin
        .add_member(leasehold_proto::v1::AddMemberRequest {
            id: 4,
            addr: c.nodes[new].addr.clone(),
        })
        .await
        .expect("the node joins under load")
        .into_inner();
    assert_eq!(status.members.iter().filter(|m| m.voter).count(), 4);
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut total = 0;
    for w in workers {
        total += w.await.unwrap();
    }
    assert!(total > 0);
    let applied = |i: usize| {
        c.nodes[i]
            .health()
            .and_then(|h| serde_json::from_str::<serde_json::Value>(&h).ok())
            .and_then(|h| h["last_applied"].as_u64())
            .unwrap_or(0)
    };
    let target = applied(leader);
    leasehold_testkit::wait_until(Duration::from_secs(10), "node 4 to catch up", || {
        applied(new) >= target
    });
}

/// A follower whose data dir is lost, after the group took snapshots and
/// purged its log under concurrent load, is rebuilt from a snapshot by the
/// leader it had, which keeps leading in the same term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_follower_is_rebuilt_after_snapshots_under_load() {
    let _serial = serial().await;
    let mut c = Cluster::start_with(3, &["--snapshot-every", "1000"]);
    let endpoints = c.endpoints();
    let mut workers = Vec::new();
    for w in 0..20 {
        let endpoints = endpoints.clone();
        workers.push(tokio::spawn(async move {
            let client = Client::connect(&endpoints).await.unwrap();
            let mut held = Vec::new();
            for k in 0..150 {
                let lease = client
                    .acquire(&format!("w{w}-{k}"), opts(600_000))
                    .await
                    .expect("acquire");
                held.push(lease);
            }
            held
        }));
    }
    let mut held = Vec::new();
    for w in workers {
        held.extend(w.await.unwrap());
    }
    let json = |addr: &str| {
        leasehold_testkit::http_get(addr, "/health")
            .and_then(|h| serde_json::from_str::<serde_json::Value>(&h).ok())
            .unwrap_or_default()
    };
    let leader = c.wait_leader();
    let (leader_addr, follower) = (c.nodes[leader].addr.clone(), (leader + 1) % 3);
    let follower_addr = c.nodes[follower].addr.clone();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = json(&leader_addr);
    c.wipe(follower);
    let target = before["last_applied"].as_u64().unwrap_or(0);
    leasehold_testkit::wait_until(
        Duration::from_secs(30),
        "the wiped follower rebuilt",
        || json(&follower_addr)["last_applied"].as_u64().unwrap_or(0) >= target,
    );
    let metrics = leasehold_testkit::http_get(&follower_addr, "/metrics").unwrap_or_default();
    assert!(
        metrics.contains(&format!("leasehold_locks_held {}", held.len())),
        "the rebuilt follower holds every lock:\n{metrics}"
    );
    let after = json(&leader_addr);
    assert_eq!(
        (&after["role"], &after["term"]),
        (&before["role"], &before["term"]),
        "{after}"
    );
    // And it still serves: a leader whose raft core stopped would keep
    // answering health with what it last knew.
    let client = Client::connect(&format!("http://{leader_addr}"))
        .await
        .unwrap();
    let lease = tokio::time::timeout(
        Duration::from_secs(5),
        client.acquire("after-wipe", opts(5_000)),
    )
    .await
    .expect("the leader answers")
    .expect("the leader grants");
    lease.release().await.unwrap();
}

/// Reads `n` more events into `seen`, each within 20 s.
async fn read(
    events: &mut futures::stream::BoxStream<'static, leasehold::Result<leasehold::LockEvent>>,
    seen: &mut Vec<leasehold::LockEvent>,
    n: usize,
) {
    let until = seen.len() + n;
    while seen.len() < until {
        let e = tokio::time::timeout(Duration::from_secs(20), events.next())
            .await
            .expect("the watch goes on within 20 s")
            .expect("the stream does not end")
            .expect("no error");
        seen.push(e);
    }
}

/// A watch given every endpoint outlives the node it streams from: a writer
/// takes and releases keys while the follower streaming the watch is
/// `kill -9`ed, then (with it back) the node the watch went on at. Every
/// event arrives once, in order: the same list, position by position, as a
/// watch from the start on the node never killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_goes_on_across_kills_of_the_node_it_streams_from() {
    let _serial = serial().await;
    let mut c = Cluster::start(3);
    let leader = c.wait_leader();
    // The watch's node is the first endpoint it is given: a follower.
    let order = [(leader + 1) % 3, (leader + 2) % 3, leader];
    let watch_endpoints = c.endpoints_from(order[0]);
    let watcher = Client::connect(&watch_endpoints).await.unwrap();
    let mut events = watcher.watch("w/").await.unwrap();

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (endpoints, stop) = (c.endpoints(), stop.clone());
        tokio::spawn(async move {
            let client = Client::connect(&endpoints).await.unwrap();
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                // Failovers refuse some: the events say what happened.
                if let Ok(lease) = client.try_acquire(&format!("w/{i}"), opts(5_000)).await {
                    let _ = lease.release().await;
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };

    let mut seen = Vec::new();
    read(&mut events, &mut seen, 20).await;
    c.kill(order[0]);
    read(&mut events, &mut seen, 40).await;
    c.restart(order[0]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The watch went on at the next endpoint: kill that one too (the
    // leader, maybe: the writer's client follows the new one).
    c.kill(order[1]);
    read(&mut events, &mut seen, 40).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    writer.await.unwrap();

    let positions: Vec<(u64, u32)> = seen.iter().map(|e| (e.index, e.seq)).collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "in order, none twice: {positions:?}"
    );
    // The whole history, from the node never killed.
    let reference = Client::connect(&c.nodes[order[2]].url()).await.unwrap();
    let mut all = reference.watch_after("w/", 0, u32::MAX).await.unwrap();
    let last = *positions.last().expect("events");
    let mut expected = Vec::new();
    while expected
        .last()
        .is_none_or(|e: &leasehold::LockEvent| (e.index, e.seq) < last)
    {
        let e = tokio::time::timeout(Duration::from_secs(10), all.next())
            .await
            .expect("the history")
            .expect("the stream does not end")
            .expect("no error");
        expected.push(e);
    }
    let first = expected
        .iter()
        .position(|e| (e.index, e.seq) == positions[0])
        .expect("the first event watched is in the history");
    let describe = |events: &[leasehold::LockEvent]| -> Vec<String> {
        events
            .iter()
            .map(|e| format!("{}.{} {} {} {}", e.index, e.seq, e.kind, e.key, e.fence))
            .collect()
    };
    assert_eq!(describe(&seen), describe(&expected[first..]));
}
