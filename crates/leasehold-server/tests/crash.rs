//! `kill -9` and restart: acknowledged writes survive, tokens never go back,
//! leases get their full TTL again.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_proto::v1 as pb;
use leasehold_testkit::Leaseholdd;

/// Runs acquisitions from several clients, kills the server mid-stream, and
/// checks every acknowledged grant after the restart.
async fn acknowledged_grants_survive(server: &mut Leaseholdd, round: &str) {
    let acked: Arc<Mutex<Vec<(String, u64, u64)>>> = Arc::default();
    let mut tasks = Vec::new();
    for t in 0..8 {
        let mut c = common::grpc(server).await;
        let acked = acked.clone();
        let round = round.to_string();
        tasks.push(tokio::spawn(async move {
            for i in 0.. {
                let lease = match c
                    .grant(pb::GrantRequest {
                        ttl_ms: 120_000,
                        holder: format!("t{t}"),
                        ..Default::default()
                    })
                    .await
                {
                    Ok(l) => l,
                    Err(e) => {
                        eprintln!("grant stopped: {e}");
                        return;
                    }
                };
                let lease = lease.into_inner().lease_id;
                let key = format!("{round}/{t}/{i}");
                let req = pb::AcquireRequest {
                    lease_id: lease,
                    key: key.clone(),
                    ..Default::default()
                };
                match c.acquire(req).await {
                    Ok(r) => acked
                        .lock()
                        .unwrap()
                        .push((key, lease, r.into_inner().fence)),
                    Err(e) => {
                        eprintln!("acquire stopped: {e}");
                        return;
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    server.process.kill9();
    for t in tasks {
        let _ = t.await;
    }
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() > 20,
        "too few acquisitions before the crash: {}",
        acked.len()
    );

    server.crash_and_restart();
    let mut c = common::grpc(server).await;
    let listed = c
        .list_locks(pb::ListLocksRequest {
            prefix: format!("{round}/"),
            limit: 0,
            start_after: String::new(),
            held_only: false,
        })
        .await
        .unwrap()
        .into_inner()
        .locks;
    let by_key: std::collections::HashMap<_, _> = listed
        .iter()
        .map(|l| {
            (
                l.key.clone(),
                l.holder.clone().map(|h| (h.lease_id, h.fence)),
            )
        })
        .collect();
    for (key, lease, fence) in &acked {
        assert_eq!(
            by_key.get(key),
            Some(&Some((*lease, *fence))),
            "acknowledged grant of {key} lost"
        );
    }
    let highest = acked.iter().map(|a| a.2).max().unwrap();
    let lease = common::lease(&mut c, 10_000, "after").await;
    let fresh = c
        .acquire(pb::AcquireRequest {
            lease_id: lease,
            key: format!("{round}-fresh"),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .fence;
    assert!(
        fresh > highest,
        "token went back after restart: {fresh} <= {highest}"
    );
}

#[tokio::test]
async fn kill_9_during_acquisitions_loses_no_acknowledged_grant() {
    let mut server = Leaseholdd::start();
    acknowledged_grants_survive(&mut server, "a").await;
}

#[tokio::test]
async fn kill_9_with_snapshots_and_purged_log_loses_nothing() {
    // Snapshot every 64 entries so the restart goes through snapshot + log tail.
    let mut server = Leaseholdd::start_with(&["--snapshot-every", "64"]);
    acknowledged_grants_survive(&mut server, "a").await;
    assert!(server.data_dir().join("snapshot").exists());
    // And once more, from the state the first restart produced.
    acknowledged_grants_survive(&mut server, "b").await;
}

#[tokio::test]
async fn kill_9_with_a_multi_threaded_runtime_loses_nothing() {
    let mut server = Leaseholdd::start_with(&["--threads", "2"]);
    acknowledged_grants_survive(&mut server, "a").await;
}

#[tokio::test]
async fn a_restart_gives_live_leases_their_full_ttl_again() {
    let mut server = Leaseholdd::start();
    let mut c = common::grpc(&server).await;
    let lease = common::lease(&mut c, 4_000, "h").await;
    c.acquire(pb::AcquireRequest {
        lease_id: lease,
        key: "k".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    server.crash_and_restart();
    let mut c = common::grpc(&server).await;
    let info = c
        .describe_lease(pb::DescribeLeaseRequest { lease_id: lease })
        .await
        .expect("lease survives")
        .into_inner();
    // About 1.5 s were left at the crash; a restamp gives close to 4 s again.
    assert!(
        info.ttl_left_ms > 2_000,
        "lease not restamped: {} ms left",
        info.ttl_left_ms
    );
    // A renewal works, so a client that kept trying is not cut off.
    c.keep_alive(pb::KeepAliveRequest { lease_id: lease })
        .await
        .expect("renew after restart");
}

#[tokio::test]
async fn sigterm_shuts_down_cleanly_and_keeps_state() {
    let mut server = Leaseholdd::start();
    let mut c = common::grpc(&server).await;
    let lease = common::lease(&mut c, 60_000, "h").await;
    let fence = common::take(&mut c, lease, "k").await;
    let status = server.process.terminate().expect("exit status");
    assert!(
        status.success(),
        "leaseholdd exited with {status}: {}",
        server.process.output()
    );
    server.crash_and_restart();
    let mut c = common::grpc(&server).await;
    let info = common::describe(&mut c, "k").await;
    assert_eq!(info.holder.map(|h| h.fence), Some(fence));
}
