//! A cluster of real `leaseholdd` processes: forming once, serving from the
//! leader, followers that crash or lose their data catching up, a whole
//! cluster restarting, and membership changes.

mod common;

use std::time::Duration;

use leasehold_testkit::{http_get, metric, wait_until, Cluster};
use serde_json::{json, Value};

fn health(addr: &str) -> Value {
    http_get(addr, "/health")
        .and_then(|b| serde_json::from_str(&b).ok())
        .unwrap_or(Value::Null)
}

async fn get(addr: &str, path: &str) -> (u16, Value) {
    let r = reqwest::get(format!("http://{addr}{path}"))
        .await
        .expect("get");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn leader_addr(c: &Cluster) -> String {
    c.nodes[c.wait_leader()].addr.clone()
}

/// Exactly one group forms, with one leader; followers refuse writes with
/// the leader's address as a field, and serve health with role and term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_forms_once_and_followers_name_the_leader() {
    let _serial = common::serial().await;
    let c = Cluster::start(3);
    let leader = c.wait_leader();
    let leaders: Vec<_> = c.nodes.iter().filter(|n| n.leads()).collect();
    assert_eq!(leaders.len(), 1);
    // Nodes that start one after another refuse each other's first calls:
    // nothing an operator must act on, so nothing at ERROR, and none of
    // openraft's own lines.
    for n in &c.nodes {
        let log = n.output();
        assert!(
            !log.lines()
                .any(|l| l.contains(" ERROR ") || l.contains("openraft")),
            "{log}"
        );
    }
    let term = health(&c.nodes[leader].addr)["term"].clone();
    for (i, n) in c.nodes.iter().enumerate() {
        let h = health(&n.addr);
        assert_eq!(h["leader_addr"], json!(c.nodes[leader].addr), "{h}");
        assert_eq!(h["term"], term);
        assert_eq!(h["role"], if i == leader { "leader" } else { "follower" });
        if i != leader {
            let (s, e) =
                common::post(&n.addr, "/v1/acquire", json!({"key": "k", "ttl_ms": 5_000})).await;
            assert_eq!(s, 503, "{e}");
            assert_eq!(e["error"]["code"], "not_leader");
            assert_eq!(e["error"]["leader"], json!(c.nodes[leader].addr));
            assert_eq!(
                e["error"]["leader_url"],
                json!(format!("http://{}", c.nodes[leader].addr))
            );
            // A client that asks is sent to the leader, path and query kept,
            // and following it does the call there.
            let direct = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap();
            let r = direct
                .get(format!("http://{}/v1/locks?prefix=k", n.addr))
                .header("Leasehold-Follow-Leader", "1")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 307);
            assert_eq!(
                r.headers()["location"],
                format!("http://{}/v1/locks?prefix=k", c.nodes[leader].addr).as_str()
            );
            let r = reqwest::Client::new()
                .post(format!("http://{}/v1/acquire", n.addr))
                .header("Leasehold-Follow-Leader", "1")
                .json(&json!({"key": format!("followed-{i}"), "ttl_ms": 5_000}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 200, "{:?}", r.text().await);
        }
    }
    let (s, status) = get(&c.nodes[leader].addr, "/v1/cluster").await;
    assert_eq!(s, 200);
    assert_eq!(status["members"].as_array().unwrap().len(), 3);
    assert!(status["members"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m["voter"] == true));
    // The leader's metrics show each peer's lag, not its own; and the
    // process's own metrics and the build are there.
    let leader_id = status["id"].as_u64().expect("an id");
    let text = http_get(&c.nodes[leader].addr, "/metrics").expect("metrics");
    let lags: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("leasehold_raft_replication_lag{"))
        .collect();
    assert_eq!(lags.len(), 2, "{lags:?}");
    assert!(
        !lags
            .iter()
            .any(|l| l.contains(&format!("peer=\"{leader_id}\""))),
        "{lags:?}"
    );
    for name in [
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_open_fds ",
    ] {
        assert!(text.contains(&format!("\n{name}")), "{name}");
    }
    assert!(text.contains("leasehold_build_info{version="), "build info");
    // Exactly one initialization: the log says so on one node only.
    let inits = c
        .nodes
        .iter()
        .filter(|n| n.output().contains("initialized a new group"))
        .count();
    assert_eq!(inits, 1);
}

/// A follower killed and restarted catches up; a follower whose data is
/// wiped is rebuilt by the leader; the whole cluster stopped and started
/// keeps every lock and the token sequence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_catch_up_and_a_full_restart_keeps_every_lock() {
    let _serial = common::serial().await;
    // Snapshots often, so the wiped node needs one, sent in many small
    // chunks that it must put back together.
    let mut c = Cluster::start_with(
        3,
        &["--snapshot-every", "50", "--snapshot-chunk-bytes", "1024"],
    );
    let leader = leader_addr(&c);
    let follower = (0..3).find(|&i| c.nodes[i].addr != leader).unwrap();
    c.kill(follower);
    let mut fences = Vec::new();
    for i in 0..120 {
        let (s, r) = common::post(
            &leader,
            "/v1/acquire",
            json!({"key": format!("k{i}"), "ttl_ms": 600_000}),
        )
        .await;
        assert_eq!(s, 200, "{r}");
        fences.push(r["fence"].as_u64().unwrap());
    }
    let applied = |addr: &str| health(addr)["last_applied"].as_u64().unwrap_or(0);
    let target = applied(&leader);
    c.restart(follower);
    let addr = c.nodes[follower].addr.clone();
    wait_until(
        Duration::from_secs(20),
        "the restarted follower to catch up",
        || applied(&addr) >= target,
    );

    let wiped = (0..3)
        .find(|&i| c.nodes[i].addr != leader && i != follower)
        .unwrap();
    let term = health(&leader)["term"].clone();
    c.wipe(wiped);
    let addr = c.nodes[wiped].addr.clone();
    wait_until(
        Duration::from_secs(20),
        "the wiped follower to be rebuilt",
        || applied(&addr) >= target,
    );
    // By the leader it had before, which took its emptied log in its stride
    // and still serves (a leader whose raft core stopped would keep
    // answering health with what it last knew).
    let h = health(&leader);
    assert_eq!(
        (h["role"].as_str(), &h["term"]),
        (Some("leader"), &term),
        "{h}"
    );
    let (s, r) = common::post(
        &leader,
        "/v1/acquire",
        json!({"key": "after-wipe", "ttl_ms": 600_000}),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    let release = json!({"key": "after-wipe", "fence": r["fence"]});
    let (s, r) = common::post(&leader, "/v1/release", release).await;
    assert_eq!(s, 200, "{r}");
    // From a snapshot: the log it needed was purged.
    let metrics = http_get(&leader, "/metrics").unwrap_or_default();
    let chunks = metric(&metrics, "leasehold_raft_snapshot_chunks_sent_total");
    assert!(
        chunks >= 4,
        "the snapshot was not sent in chunks:\n{metrics}"
    );
    let commit = metric(&metrics, "leasehold_raft_commit_index");
    assert!(commit >= target, "commit index {commit} below {target}");
    // Without peer certificates, appends go framed, not over gRPC.
    let streams = |transport: &str| {
        let name = format!("leasehold_raft_append_streams_total{{transport=\"{transport}\"}}");
        metric(&metrics, &name)
    };
    assert!(streams("framed") >= 2, "{metrics}");
    assert_eq!(streams("grpc"), 0, "{metrics}");

    for i in 0..3 {
        c.kill(i);
    }
    for i in 0..3 {
        c.restart(i);
    }
    let leader = leader_addr(&c);
    let (_, locks) = get(&leader, "/v1/locks").await;
    assert_eq!(
        locks["locks"].as_array().unwrap().len(),
        120,
        "every lock survived"
    );
    let (s, r) = common::post(
        &leader,
        "/v1/acquire",
        json!({"key": "after", "ttl_ms": 5_000}),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    assert!(r["fence"].as_u64().unwrap() > *fences.iter().max().unwrap());
}

/// A member that comes back deposes no one: the old leader, restarted after
/// the group moved on without it (and the leader's retries to it backed
/// off), rejoins as a follower, and the new leader keeps its term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_member_deposes_no_one() {
    let _serial = common::serial().await;
    let mut c = Cluster::start(3);
    for round in 0..2 {
        let old = c.wait_leader();
        c.kill(old);
        let leader = c.wait_leader();
        let addr = c.nodes[leader].addr.clone();
        let key = format!("k{round}");
        let (s, r) =
            common::post(&addr, "/v1/acquire", json!({"key": key, "ttl_ms": 60_000})).await;
        assert_eq!(s, 200, "{r}");
        tokio::time::sleep(Duration::from_secs(3)).await;
        let term = health(&addr)["term"].clone();
        // Writes going on, as in production.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers: Vec<_> = (0..8)
            .map(|w| {
                let (addr, stop) = (addr.clone(), stop.clone());
                tokio::spawn(async move {
                    let http = reqwest::Client::new();
                    let body = json!({"key": format!("busy{w}"), "ttl_ms": 5_000});
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let _ = http
                            .post(format!("http://{addr}/v1/acquire"))
                            .json(&body)
                            .send()
                            .await;
                    }
                })
            })
            .collect();
        c.restart(old);
        let rejoined = c.nodes[old].addr.clone();
        wait_until(Duration::from_secs(20), "the old leader to rejoin", || {
            health(&rejoined)["leader_addr"] == json!(addr)
        });
        tokio::time::sleep(Duration::from_secs(2)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for w in writers {
            let _ = w.await;
        }
        let h = health(&addr);
        assert_eq!(
            (h["role"].as_str(), &h["term"]),
            (Some("leader"), &term),
            "{h}"
        );
    }
}

/// A new member that voted for the first candidate and restarted before the
/// leader's first entries holds a vote and no log (and openraft counts it
/// initialized). It is in no group yet: it takes the cluster's id from the
/// leader's entries and catches up, instead of refusing the leader as a
/// member of another cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_only_voted_before_a_restart_joins_the_cluster() {
    let _serial = common::serial().await;
    let mut c = Cluster::start(3);
    let follower = (c.wait_leader() + 1) % 3;
    // Its data dir as it was after its vote: the vote, and nothing else of
    // the group (no log, no snapshot, no cluster id).
    c.kill(follower);
    let dir = c.nodes[follower].data_dir().to_path_buf();
    keep_only_the_vote(&dir);
    c.restart(follower);
    let leader = c.wait_leader();
    let addr = c.nodes[leader].addr.clone();
    let (s, r) = common::post(&addr, "/v1/acquire", json!({"key": "k", "ttl_ms": 60_000})).await;
    assert_eq!(s, 200, "{r}");
    let id = std::fs::read_to_string(c.nodes[leader].data_dir().join("cluster")).unwrap();
    wait_until(
        Duration::from_secs(20),
        "the member to take the cluster's id",
        || std::fs::read_to_string(dir.join("cluster")).is_ok_and(|mine| mine == id),
    );
    let applied = health(&addr)["last_applied"].as_u64().unwrap_or(0);
    let rejoined = c.nodes[follower].addr.clone();
    wait_until(Duration::from_secs(20), "the member to catch up", || {
        health(&rejoined)["last_applied"].as_u64().unwrap_or(0) >= applied
    });
    let output = c.nodes[follower].output();
    assert!(!output.contains("refused a raft call"), "{output}");
}

/// Leaves in a stopped node's data dir its vote and nothing else of the
/// group (no log, no snapshot, no cluster id): the dir of a member that
/// voted for the first candidate and got none of its entries.
fn keep_only_the_vote(dir: &std::path::Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        match path.file_name().and_then(|n| n.to_str()) {
            Some("vote" | "format") => {}
            _ if path.is_dir() => std::fs::remove_dir_all(&path).unwrap(),
            _ => std::fs::remove_file(&path).unwrap(),
        }
    }
}

/// The lowest id loses its data while forming the group, before its first
/// entries reached the others, which hold only their votes for it: started
/// again, it forms the group again (the others' votes are no group), where
/// it used to wait, with the others, for a leader that would never come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowest_id_that_lost_its_data_before_its_first_entries_forms_the_group_again() {
    let _serial = common::serial().await;
    let mut c = Cluster::start(3);
    c.wait_leader();
    for i in 0..3 {
        c.kill(i);
    }
    let _ = std::fs::remove_dir_all(c.nodes[0].data_dir());
    for i in 1..3 {
        keep_only_the_vote(c.nodes[i].data_dir());
        c.restart(i);
    }
    // The others answer before the lowest id starts, so it asks them.
    for i in 1..3 {
        let addr = c.nodes[i].addr.clone();
        wait_until(Duration::from_secs(20), "a member to answer", || {
            health(&addr).is_object()
        });
    }
    c.restart(0);
    let addr = leader_addr(&c);
    let (s, r) = common::post(&addr, "/v1/acquire", json!({"key": "k", "ttl_ms": 60_000})).await;
    assert_eq!(s, 200, "{r}");
    let applied = health(&addr)["last_applied"].as_u64().unwrap_or(0);
    for node in &c.nodes {
        wait_until(Duration::from_secs(20), "every member to catch up", || {
            health(&node.addr)["last_applied"].as_u64().unwrap_or(0) >= applied
        });
        let output = node.output();
        assert!(!output.contains("refused a raft call"), "{output}");
    }
}

/// The same lowest id, but one of the others holds the group (its entries)
/// and does not answer, and the other holds only a vote: the lowest id
/// forms nothing (the vote shows an election took place, so the silent one
/// may hold the group's state) until that one is back, whose group then
/// brings it back with every lock it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowest_id_that_lost_its_data_forms_nothing_while_a_member_that_may_hold_the_group_is_silent(
) {
    let _serial = common::serial().await;
    let mut c = Cluster::start(3);
    let addr = leader_addr(&c);
    let (s, held) =
        common::post(&addr, "/v1/acquire", json!({"key": "k", "ttl_ms": 600_000})).await;
    assert_eq!(s, 200, "{held}");
    let applied = health(&addr)["last_applied"].as_u64().unwrap_or(0);
    wait_until(
        Duration::from_secs(20),
        "every member to apply the grant",
        || {
            c.nodes
                .iter()
                .all(|n| health(&n.addr)["last_applied"].as_u64().unwrap_or(0) >= applied)
        },
    );
    for i in 0..3 {
        c.kill(i);
    }
    let _ = std::fs::remove_dir_all(c.nodes[0].data_dir());
    keep_only_the_vote(c.nodes[2].data_dir());
    c.restart(2);
    let voted = c.nodes[2].addr.clone();
    wait_until(
        Duration::from_secs(20),
        "the member that voted to answer",
        || health(&voted).is_object(),
    );
    c.restart(0);
    let first = c.nodes[0].addr.clone();
    wait_until(Duration::from_secs(20), "the lowest id to answer", || {
        health(&first).is_object()
    });
    // Past a few of its probes and an election's time: no group of the two.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        c.leader().is_none(),
        "a group formed without the member that holds it"
    );
    let output = c.nodes[0].output();
    assert!(
        output.contains("forming no group until every member answers"),
        "{output}"
    );
    // The one that voted goes silent too: the vote it showed still counts.
    c.kill(2);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let formed = c.nodes[0].data_dir().join("cluster");
    assert!(
        !formed.exists(),
        "a group formed while every other member was silent"
    );
    c.restart(2);
    c.restart(1);
    let addr = leader_addr(&c);
    let (s, lock) = get(&addr, "/v1/locks/k").await;
    assert_eq!(s, 200, "{lock}");
    assert_eq!(lock["holders"][0]["fence"], held["fence"], "{lock} {held}");
    let id = std::fs::read_to_string(c.nodes[1].data_dir().join("cluster")).unwrap();
    for node in &c.nodes {
        wait_until(
            Duration::from_secs(20),
            "every member to rejoin the group",
            || {
                std::fs::read_to_string(node.data_dir().join("cluster"))
                    .is_ok_and(|mine| mine == id)
            },
        );
    }
}

/// The lowest id started again on a data dir that holds only a cluster id
/// of its own (what a kill between making the id and forming the group
/// leaves) while the others hold the group: it takes their cluster's id
/// from their leader's entries and catches up, where it used to refuse that
/// leader until its data dir was wiped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_id_kept_with_no_data_gives_way_to_the_group_that_formed() {
    let _serial = common::serial().await;
    let mut c = Cluster::start(3);
    c.wait_leader();
    c.kill(0);
    let dir = c.nodes[0].data_dir().to_path_buf();
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("cluster"), "cluster 00000000000000aa\n").unwrap();
    c.restart(0);
    let addr = leader_addr(&c);
    let (s, r) = common::post(&addr, "/v1/acquire", json!({"key": "k", "ttl_ms": 60_000})).await;
    assert_eq!(s, 200, "{r}");
    let applied = health(&addr)["last_applied"].as_u64().unwrap_or(0);
    let first = c.nodes[0].addr.clone();
    wait_until(Duration::from_secs(20), "the lowest id to catch up", || {
        health(&first)["last_applied"].as_u64().unwrap_or(0) >= applied
    });
    let theirs = std::fs::read_to_string(c.nodes[1].data_dir().join("cluster")).unwrap();
    let kept = std::fs::read_to_string(dir.join("cluster")).unwrap();
    assert_eq!(kept, theirs);
    let output = c.nodes[0].output();
    assert!(!output.contains("refused a raft call"), "{output}");
    assert!(output.contains("in place of the id"), "{output}");
}

/// A fourth node joins as a learner, catches up and becomes a voter; the
/// old leader is removed and the group goes on; a change that would leave
/// no quorum is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_are_added_and_removed_and_quorum_is_kept() {
    let _serial = common::serial().await;
    let mut c = Cluster::start(3);
    let leader = c.wait_leader();
    let addr = c.nodes[leader].addr.clone();
    for i in 0..20 {
        common::post(
            &addr,
            "/v1/acquire",
            json!({"key": format!("m{i}"), "ttl_ms": 600_000}),
        )
        .await;
    }
    let new = c.start_new_node(4);
    let new_addr = c.nodes[new].addr.clone();
    let (s, r) = common::post(
        &addr,
        "/v1/cluster/members",
        json!({"id": 4, "addr": new_addr}),
    )
    .await;
    assert_eq!(s, 200, "{r}\nnode 4:\n{}", c.nodes[new].output());
    let members = r["members"].as_array().unwrap();
    assert_eq!(
        members.iter().filter(|m| m["voter"] == true).count(),
        4,
        "{r}"
    );

    // Remove the old leader; someone else leads.
    let leader_id = c.nodes[leader].id;
    let r = reqwest::Client::new()
        .delete(format!("http://{addr}/v1/cluster/members/{leader_id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{:?}", r.text().await);
    c.kill(leader);
    let now = c.wait_leader();
    let (_, locks) = get(&c.nodes[now].addr, "/v1/locks").await;
    assert_eq!(locks["locks"].as_array().unwrap().len(), 20);

    // Of the three voters left, kill one: removing another would leave two
    // voters of which one answers.
    let others: Vec<usize> = (0..c.nodes.len())
        .filter(|&i| i != leader && i != now)
        .collect();
    c.kill(others[0]);
    let victim = c.nodes[others[1]].id;
    let r = reqwest::Client::new()
        .delete(format!(
            "http://{}/v1/cluster/members/{victim}",
            c.nodes[now].addr
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("quorum"),
        "{body}"
    );
}

/// `cluster add` of a node that never answers, or answers nobody but its
/// clients (cut off from the leader by a proxy), fails within the answer
/// time, names the node and leaves the voters as they were: the group still
/// survives a killed follower. Once the cut heals, the same add succeeds
/// and the leader reports every member reachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_does_not_answer_is_not_added() {
    let _serial = common::serial().await;
    let mut c = Cluster::start(3);
    let leader = c.wait_leader();
    let addr = c.nodes[leader].addr.clone();
    let voters = |status: &Value| {
        status["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_u64().unwrap())
            .collect::<Vec<_>>()
    };

    // Nothing listens there.
    let nobody = format!("127.0.0.1:{}", leasehold_testkit::free_port());
    let (s, r) = common::post(
        &addr,
        "/v1/cluster/members",
        json!({"id": 4, "addr": nobody}),
    )
    .await;
    assert_eq!(s, 409, "{r}");
    assert_eq!(r["error"]["code"], "not_added", "{r}");
    assert_eq!(
        r["error"]["message"],
        format!("node 4 at {nobody} did not answer within 10 s; it was not added"),
    );
    let (_, status) = get(&addr, "/v1/cluster").await;
    assert_eq!(voters(&status), vec![1, 2, 3], "{status}");

    // Started, but the leader cannot reach it.
    let new = c.start_new_node(4);
    let proxy = leasehold_testkit::FaultProxy::start(&c.nodes[new].addr);
    proxy.block_from([127, 0, 0, 1].into());
    let (s, r) = common::post(
        &addr,
        "/v1/cluster/members",
        json!({"id": 4, "addr": proxy.addr}),
    )
    .await;
    assert_eq!(s, 409, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .ends_with("did not answer within 10 s; it was not added"),
        "{r}"
    );
    let (_, status) = get(&addr, "/v1/cluster").await;
    assert_eq!(voters(&status), vec![1, 2, 3], "{status}");

    // Still three voters: one follower down leaves a quorum.
    let follower = (0..3).find(|&i| i != leader).unwrap();
    c.kill(follower);
    let (s, r) = common::post(&addr, "/v1/acquire", json!({"key": "k", "ttl_ms": 5_000})).await;
    assert_eq!(s, 200, "{r}");
    let (_, status) = get(&addr, "/v1/cluster").await;
    let dead = c.nodes[follower].id;
    wait_until(
        Duration::from_secs(10),
        "the dead member unreachable",
        || {
            let status = health_cluster(&addr);
            status["members"].as_array().is_some_and(|ms| {
                ms.iter()
                    .any(|m| m["id"] == dead && m["reachable"] == false)
            })
        },
    );
    assert_eq!(status["quorum"], true, "{status}");
    c.restart(follower);

    // Healed, the same add goes through.
    proxy.allow_all();
    let (s, r) = common::post(
        &addr,
        "/v1/cluster/members",
        json!({"id": 4, "addr": proxy.addr}),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(voters(&r), vec![1, 2, 3, 4], "{r}");
    wait_until(Duration::from_secs(20), "every member reachable", || {
        let status = health_cluster(&addr);
        status["members"]
            .as_array()
            .is_some_and(|ms| ms.len() == 4 && ms.iter().all(|m| m["reachable"] == true))
    });
}

/// A member removed while it runs learns it from its peers: `/health`
/// says `removed` with a 503, it stops campaigning (its term stops
/// rising, and the leader keeps its own), and it is a member again once
/// it is added back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_member_says_so_and_stops_campaigning() {
    let _serial = common::serial().await;
    let c = Cluster::start(3);
    let leader = c.wait_leader();
    let addr = c.nodes[leader].addr.clone();
    let gone = (0..3).find(|&i| i != leader).unwrap();
    let (gone_id, gone_addr) = (c.nodes[gone].id, c.nodes[gone].addr.clone());
    let r = reqwest::Client::new()
        .delete(format!("http://{addr}/v1/cluster/members/{gone_id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{:?}", r.text().await);

    let health_of = |a: String| async move {
        let r = reqwest::get(format!("http://{a}/health")).await.unwrap();
        let code = r.status().as_u16();
        (code, r.json::<Value>().await.unwrap_or(Value::Null))
    };
    let started = std::time::Instant::now();
    let removed = loop {
        let (code, h) = health_of(gone_addr.clone()).await;
        if h["status"] == "removed" {
            assert_eq!(code, 503, "{h}");
            assert_eq!(h["role"], "removed", "{h}");
            break h;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never said removed: {h}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        c.nodes[gone]
            .output()
            .contains("this node was removed from the cluster"),
        "{}",
        c.nodes[gone].output()
    );
    let leader_term = health(&addr)["term"].clone();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, now) = health_of(gone_addr.clone()).await;
    assert_eq!(now["term"], removed["term"], "it campaigned on: {now}");
    assert_eq!(health(&addr)["term"], leader_term);

    // Added back, it is a member again.
    let (s, r) = common::post(
        &addr,
        "/v1/cluster/members",
        json!({"id": gone_id, "addr": gone_addr}),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    wait_until(Duration::from_secs(20), "the member healthy again", || {
        health(&gone_addr)["status"] == "ok"
    });
}

fn health_cluster(addr: &str) -> Value {
    http_get(addr, "/v1/cluster")
        .and_then(|b| serde_json::from_str(&b).ok())
        .unwrap_or(Value::Null)
}

/// Five nodes survive two kills, the leader among them: a new leader
/// serves, and every lock is still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_nodes_survive_two_kills() {
    let _serial = common::serial().await;
    let mut c = Cluster::start(5);
    let leader = c.wait_leader();
    let addr = c.nodes[leader].addr.clone();
    for i in 0..10 {
        let (s, _) = common::post(
            &addr,
            "/v1/acquire",
            json!({"key": format!("f{i}"), "ttl_ms": 600_000}),
        )
        .await;
        assert_eq!(s, 200);
    }
    c.kill(leader);
    c.kill((leader + 1) % 5);
    let now = leader_addr(&c);
    let (_, locks) = get(&now, "/v1/locks").await;
    assert_eq!(locks["locks"].as_array().unwrap().len(), 10);
    let (s, r) = common::post(
        &now,
        "/v1/acquire",
        json!({"key": "after", "ttl_ms": 5_000}),
    )
    .await;
    assert_eq!(s, 200, "{r}");
}

/// The admin API over gRPC: status on any node, changes at the leader (a
/// follower refuses with `not_leader` and the leader's address in metadata).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_over_grpc() {
    use leasehold_proto::v1 as pb;
    let _serial = common::serial().await;
    let mut c = Cluster::start(3);
    let leader = c.wait_leader();
    let follower = (leader + 1) % 3;
    let mut f = pb::leasehold_client::LeaseholdClient::connect(c.nodes[follower].url())
        .await
        .unwrap();
    let status = f
        .cluster_status(pb::ClusterStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.role, "follower");
    assert_eq!(status.leader_addr, c.nodes[leader].addr);
    assert_eq!(status.members.len(), 3);

    let new = c.start_new_node(4);
    let add = pb::AddMemberRequest {
        id: 4,
        addr: c.nodes[new].addr.clone(),
    };
    let refused = f.add_member(add.clone()).await.unwrap_err();
    let md = |name: &str| {
        refused
            .metadata()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    assert_eq!(md("leasehold-code").as_deref(), Some("not_leader"));
    assert_eq!(md("leasehold-leader"), Some(c.nodes[leader].addr.clone()));

    let mut l = pb::leasehold_client::LeaseholdClient::connect(c.nodes[leader].url())
        .await
        .unwrap();
    let status = l.add_member(add).await.unwrap().into_inner();
    let voters = status.members.iter().filter(|m| m.voter).count();
    assert_eq!(voters, 4);
    assert!(status.members.iter().all(|m| m.lag.is_some()), "{status:?}");
    let status = l
        .remove_member(pb::RemoveMemberRequest { id: 4 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.members.len(), 3);
}

/// Leadership moves to the voter named, or to the most caught-up follower,
/// over HTTP and gRPC; a leader stopped with SIGTERM hands it over first; a
/// transfer that cannot be made is refused and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_is_handed_over_on_request_and_before_a_clean_stop() {
    use leasehold_proto::v1 as pb;
    let _serial = common::serial().await;
    let mut c = Cluster::start(3);
    let leader = c.wait_leader();
    let addr = c.nodes[leader].addr.clone();
    let term = health(&addr)["term"].as_u64().expect("term");
    let (s, held) = common::post(&addr, "/v1/acquire", json!({"key": "k", "ttl_ms": 60_000})).await;
    assert_eq!(s, 200, "{held}");

    // Refused, and the leader stays: not a member, itself, a bad body, and
    // asked of a follower.
    let me = c.nodes[leader].id;
    let path = "/v1/cluster/transfer-leader";
    for body in [json!({"to": 9}), json!({"to": me}), json!({"to": "two"})] {
        let (s, r) = common::post(&addr, path, body).await;
        assert_eq!(s, 400, "{r}");
        assert_eq!(r["error"]["code"], "invalid_argument", "{r}");
    }
    let follower = (leader + 1) % 3;
    let (s, r) = common::post(&c.nodes[follower].addr, path, json!({})).await;
    assert_eq!(r["error"]["code"], "not_leader", "{s} {r}");
    assert_eq!(health(&addr)["role"], "leader");

    // Named, over HTTP: it leads when the call answers.
    let to = c.nodes[follower].id;
    let (s, r) = common::post(&addr, path, json!({"to": to})).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["leader"], to, "{r}");
    let h = health(&c.nodes[follower].addr);
    assert_eq!(h["role"], "leader", "{h}");
    assert!(h["term"].as_u64() > Some(term), "{h}");

    // Unnamed, over gRPC: someone else leads.
    let mut g = pb::leasehold_client::LeaseholdClient::connect(c.nodes[follower].url())
        .await
        .expect("connect");
    let status = g
        .transfer_leader(pb::TransferLeaderRequest { to: None })
        .await
        .expect("transfer over gRPC")
        .into_inner();
    let next = status.leader.expect("a leader");
    assert_ne!(next, to);

    // SIGTERM: the leader hands over before it exits.
    let stopping = c.wait_leader();
    let term = health(&c.nodes[stopping].addr)["term"]
        .as_u64()
        .expect("term");
    let exited = c.nodes[stopping]
        .process
        .as_mut()
        .expect("running")
        .terminate();
    assert!(exited.is_some_and(|s| s.success()), "{exited:?}");
    assert!(
        c.nodes[stopping]
            .output()
            .contains("handed leadership over first"),
        "{}",
        c.nodes[stopping].output()
    );
    let now = c.wait_leader();
    assert_ne!(now, stopping);
    let h = health(&c.nodes[now].addr);
    assert_eq!(h["term"].as_u64(), Some(term + 1), "one campaign: {h}");
    let (_, lock) = get(&c.nodes[now].addr, "/v1/locks/k").await;
    assert_eq!(lock["holder"]["fence"], held["fence"], "{lock}");

    // The stopped node cannot take over: once it has been silent past the
    // reachability window (20 heartbeats, at least 1 s), it is refused at
    // once, and the leader goes on leading (a hand-over it dropped would
    // stop writes).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let gone = c.nodes[stopping].id;
    let (s, r) = common::post(&c.nodes[now].addr, path, json!({"to": gone})).await;
    assert_eq!(s, 400, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("unreachable")),
        "{r}"
    );
    let (s, r) = common::post(
        &c.nodes[now].addr,
        "/v1/acquire",
        json!({"key": "k2", "ttl_ms": 5_000}),
    )
    .await;
    assert_eq!(s, 200, "{r}");
}
