//! `leaseholdd` as a real process, over gRPC and HTTP.

mod common;

use std::time::Duration;

use leasehold_proto::v1 as pb;
use leasehold_testkit::Leaseholdd;
use serde_json::{json, Value};

fn acquire(lease_id: u64, key: &str, wait_ms: u64) -> pb::AcquireRequest {
    pb::AcquireRequest {
        lease_id,
        key: key.into(),
        wait_ms,
        ..Default::default()
    }
}

async fn post(server: &Leaseholdd, path: &str, body: Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{}{path}", server.url()))
        .json(&body)
        .send()
        .await
        .expect("http");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn get(server: &Leaseholdd, path: &str) -> (u16, Value) {
    let r = reqwest::get(format!("{}{path}", server.url()))
        .await
        .expect("http");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn contention_tells_who_holds_the_lock_over_grpc_and_http() {
    let server = Leaseholdd::start();
    let mut c = common::grpc(&server).await;
    let a = common::lease(&mut c, 10_000, "host-a/pid-1").await;
    let b = common::lease(&mut c, 10_000, "host-b/pid-2").await;
    let fence = c
        .acquire(acquire(a, "nightly", 0))
        .await
        .expect("first")
        .into_inner()
        .fence;

    let err = c
        .acquire(acquire(b, "nightly", 0))
        .await
        .expect_err("second must fail");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert_eq!(common::code(&err), "held");
    assert_eq!(
        err.metadata().get("leasehold-holder").unwrap(),
        "host-a/pid-1"
    );
    assert_eq!(
        err.metadata()
            .get("leasehold-fence")
            .unwrap()
            .to_str()
            .unwrap(),
        fence.to_string()
    );

    let (status, body) = post(
        &server,
        "/v1/acquire",
        json!({"key": "nightly", "ttl_ms": 5000, "holder": "curl"}),
    )
    .await;
    assert_eq!(status, 409);
    assert_eq!(body["error"]["code"], "held");
    assert_eq!(body["error"]["holder"], "host-a/pid-1");
    assert_eq!(body["error"]["fence"], fence);

    let (status, body) = get(&server, "/v1/locks/nightly").await;
    assert_eq!(status, 200);
    assert_eq!(body["holder"]["holder"], "host-a/pid-1");
    assert_eq!(body["holder"]["fence"], fence);
}

#[tokio::test]
async fn waiters_are_granted_in_fifo_order() {
    let server = Leaseholdd::start();
    let mut c = common::grpc(&server).await;
    let holder = common::lease(&mut c, 30_000, "holder").await;
    let mut fence = c
        .acquire(acquire(holder, "k", 0))
        .await
        .unwrap()
        .into_inner()
        .fence;

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for i in 0..4 {
        let id = common::lease(&mut c, 30_000, &format!("w{i}")).await;
        let mut wc = c.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let r = wc
                .acquire(acquire(id, "k", 20_000))
                .await
                .map(|r| r.into_inner().fence);
            let _ = tx.send((id, r));
        });
        // Queue them one at a time so the order is known.
        loop {
            let info = common::describe(&mut c, "k").await;
            if info.waiters.len() == i + 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        waiters.push(id);
    }

    for expected in waiters {
        c.release(pb::ReleaseRequest {
            key: "k".into(),
            fence,
            request_id: 0,
        })
        .await
        .expect("release");
        let (id, granted) = rx.recv().await.expect("a waiter is granted");
        assert_eq!(id, expected, "granted out of order");
        let granted = granted.expect("grant");
        assert!(granted > fence);
        fence = granted;
    }
}

#[tokio::test]
async fn expiry_frees_the_lock_and_grants_the_next_waiter() {
    let server = Leaseholdd::start();
    let mut c = common::grpc(&server).await;
    let short = common::lease(&mut c, 300, "crashed").await;
    let first = c
        .acquire(acquire(short, "k", 0))
        .await
        .unwrap()
        .into_inner()
        .fence;
    let waiter = common::lease(&mut c, 30_000, "next").await;
    let started = std::time::Instant::now();
    let granted = c
        .acquire(acquire(waiter, "k", 10_000))
        .await
        .expect("granted after expiry")
        .into_inner()
        .fence;
    assert!(granted > first);
    assert!(started.elapsed() < Duration::from_secs(5));
    let err = c
        .keep_alive(pb::KeepAliveRequest { lease_id: short })
        .await
        .expect_err("expired");
    assert_eq!(common::code(&err), "lease_expired");
}

#[tokio::test]
async fn one_call_renews_many_leases_and_answers_each_on_its_own() {
    use leasehold_proto::frame::{Frame, Op};
    let server = Leaseholdd::start();
    let mut c = common::grpc(&server).await;
    let short = common::lease(&mut c, 300, "short").await;
    let holding = common::lease(&mut c, 10_000, "holding").await;
    c.acquire(acquire(holding, "k", 0)).await.unwrap();
    let bare = common::lease(&mut c, 10_000, "bare").await;
    tokio::time::sleep(Duration::from_millis(700)).await;

    // In the order asked, a lease named twice answered twice; the expired
    // one and one never granted each get their own code.
    let asked = vec![holding, short, bare, 999_999, holding];
    let answer = c
        .keep_alive_many(pb::KeepAliveManyRequest {
            lease_ids: asked.clone(),
        })
        .await
        .expect("a call of many renewals")
        .into_inner();
    let ids: Vec<u64> = answer.renewals.iter().map(|r| r.lease_id).collect();
    assert_eq!(ids, asked);
    let outcome = |i: usize| {
        let r = &answer.renewals[i];
        match (&r.renewed, &r.error) {
            (Some(renewed), None) => Ok((renewed.ttl_ms, renewed.key_count)),
            (None, Some(e)) => Err(e.code.clone()),
            other => panic!("lease {}: {other:?}", r.lease_id),
        }
    };
    assert_eq!(outcome(0), Ok((10_000, Some(1))));
    assert_eq!(outcome(1), Err("lease_expired".into()));
    assert_eq!(outcome(2), Ok((10_000, Some(0))));
    assert_eq!(outcome(3), Err("lease_not_found".into()));
    assert_eq!(outcome(4), outcome(0));

    // Nothing asked, nothing answered.
    let none = c
        .keep_alive_many(pb::KeepAliveManyRequest { lease_ids: vec![] })
        .await
        .unwrap()
        .into_inner();
    assert!(none.renewals.is_empty());

    // The framed protocol answers the same call alike.
    let mut f = common::RawFrames::connect(&server).await;
    let request = pb::KeepAliveManyRequest {
        lease_ids: vec![bare, short],
    };
    f.send(vec![Frame::new(1, Op::KeepAliveMany as u8, &request)])
        .await;
    let replies = f.replies(1).await;
    let framed = common::frame_ok::<pb::KeepAliveManyResponse>(&replies[&1]);
    assert_eq!(framed.renewals.len(), 2);
    assert_eq!(framed.renewals[0].renewed.map(|r| r.ttl_ms), Some(10_000));
    assert_eq!(
        framed.renewals[1].error.as_ref().map(|e| e.code.as_str()),
        Some("lease_expired")
    );

    // The renewals are real: past the TTL the leases renewed with the
    // others are alive, and the lock is still held.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(4_000)).await;
        c.keep_alive_many(pb::KeepAliveManyRequest {
            lease_ids: vec![holding, bare],
        })
        .await
        .unwrap();
    }
    let lock = c
        .describe_lock(pb::DescribeLockRequest { key: "k".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(lock.holder.map(|h| h.lease_id), Some(holding));
}

#[tokio::test]
async fn stale_release_is_refused_and_changes_nothing() {
    let server = Leaseholdd::start();
    let mut c = common::grpc(&server).await;
    let a = common::lease(&mut c, 200, "a").await;
    let old = c
        .acquire(acquire(a, "k", 0))
        .await
        .unwrap()
        .into_inner()
        .fence;
    let b = common::lease(&mut c, 30_000, "b").await;
    let new = c
        .acquire(acquire(b, "k", 5_000))
        .await
        .unwrap()
        .into_inner()
        .fence;

    let err = c
        .release(pb::ReleaseRequest {
            key: "k".into(),
            fence: old,
            request_id: 0,
        })
        .await
        .expect_err("stale");
    assert_eq!(common::code(&err), "stale_fence");
    assert!(
        err.message()
            .contains(&format!("presented {old}, current {new}")),
        "{}",
        err.message()
    );

    let (status, body) = post(&server, "/v1/release", json!({"key": "k", "fence": old})).await;
    assert_eq!(status, 409);
    assert_eq!(body["error"]["presented_fence"], old);
    assert_eq!(body["error"]["current_fence"], new);

    let info = common::describe(&mut c, "k").await;
    assert_eq!(info.holder.map(|h| h.fence), Some(new));
}

#[tokio::test]
async fn the_next_holder_receives_the_checkpoint() {
    let server = Leaseholdd::start();
    let mut c = common::grpc(&server).await;
    let a = common::lease(&mut c, 30_000, "a").await;
    let fa = c
        .acquire(acquire(a, "job", 0))
        .await
        .unwrap()
        .into_inner()
        .fence;
    c.save_checkpoint(pb::SaveCheckpointRequest {
        key: "job".into(),
        fence: fa,
        data: b"done:41".to_vec(),
    })
    .await
    .expect("save");
    c.revoke(pb::RevokeRequest { lease_id: a })
        .await
        .expect("revoke");

    let (status, body) = post(
        &server,
        "/v1/acquire",
        json!({"key": "job", "ttl_ms": 5000}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["checkpoint"], "done:41");
    assert_eq!(body["checkpoint_fence"], fa);
    assert!(body["fence"].as_u64().unwrap() > fa);
}

#[tokio::test]
async fn a_retried_acquire_never_grants_twice() {
    let server = Leaseholdd::start();
    let mut c = common::grpc(&server).await;
    let a = common::lease(&mut c, 30_000, "a").await;
    let req = pb::AcquireRequest {
        lease_id: a,
        key: "k".into(),
        request_id: 42,
        ..Default::default()
    };
    let first = c.acquire(req.clone()).await.unwrap().into_inner().fence;
    c.release(pb::ReleaseRequest {
        key: "k".into(),
        fence: first,
        request_id: 43,
    })
    .await
    .unwrap();
    // The first reply was "lost" and the client retries after all that.
    let again = c.acquire(req).await.unwrap().into_inner().fence;
    assert_eq!(again, first);
    let info = common::describe(&mut c, "k").await;
    assert!(
        info.holder.is_none(),
        "the retry must not take the lock again"
    );
}

#[tokio::test]
async fn an_abandoned_wait_is_withdrawn() {
    let server = Leaseholdd::start();
    let mut c = common::grpc(&server).await;
    let a = common::lease(&mut c, 30_000, "a").await;
    let fa = c
        .acquire(acquire(a, "k", 0))
        .await
        .unwrap()
        .into_inner()
        .fence;
    let b = common::lease(&mut c, 30_000, "gone").await;
    let mut wc = common::grpc(&server).await;
    let waiting = tokio::spawn(async move { wc.acquire(acquire(b, "k", 20_000)).await });
    loop {
        let info = common::describe(&mut c, "k").await;
        if !info.waiters.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    waiting.abort(); // the caller goes away (its connection drops)
    let _ = waiting.await;
    loop {
        let info = common::describe(&mut c, "k").await;
        if info.waiters.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    c.release(pb::ReleaseRequest {
        key: "k".into(),
        fence: fa,
        request_id: 0,
    })
    .await
    .unwrap();
    let info = common::describe(&mut c, "k").await;
    assert!(
        info.holder.is_none(),
        "granted to a caller that left: {info:?}"
    );
}

#[tokio::test]
async fn watch_streams_acquired_released_and_expired() {
    let server = Leaseholdd::start();
    let mut c = common::grpc(&server).await;
    let mut stream = c
        .watch(pb::WatchRequest {
            prefix: "jobs/".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let a = common::lease(&mut c, 30_000, "a").await;
    let f1 = c
        .acquire(acquire(a, "jobs/1", 0))
        .await
        .unwrap()
        .into_inner()
        .fence;
    c.acquire(acquire(a, "other", 0)).await.unwrap();
    c.release(pb::ReleaseRequest {
        key: "jobs/1".into(),
        fence: f1,
        request_id: 0,
    })
    .await
    .unwrap();
    let short = common::lease(&mut c, 100, "short").await;
    let f2 = c
        .acquire(acquire(short, "jobs/2", 0))
        .await
        .unwrap()
        .into_inner()
        .fence;

    use pb::lock_event::Kind;
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let e = tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await
            .expect("event")
            .unwrap()
            .unwrap();
        seen.push((Kind::try_from(e.kind).unwrap(), e.key, e.fence));
    }
    assert_eq!(
        seen,
        vec![
            (Kind::Acquired, "jobs/1".into(), f1),
            (Kind::Released, "jobs/1".into(), f1),
            (Kind::Acquired, "jobs/2".into(), f2),
            (Kind::Expired, "jobs/2".into(), f2),
        ]
    );
}

#[tokio::test]
async fn http_walkthrough_acquire_renew_release() {
    let server = Leaseholdd::start();
    let (s, body) = post(
        &server,
        "/v1/acquire",
        json!({"key": "report", "ttl_ms": 10000, "holder": "me"}),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    let (lease, fence) = (
        body["lease"].as_u64().unwrap(),
        body["fence"].as_u64().unwrap(),
    );
    let (s, body) = post(&server, &format!("/v1/leases/{lease}/keepalive"), json!({})).await;
    assert_eq!((s, body["ttl_ms"].as_u64()), (200, Some(10000)));
    let (s, body) = get(&server, "/v1/locks?prefix=rep").await;
    assert_eq!(s, 200);
    assert_eq!(body["locks"][0]["holder"]["fence"], fence);
    let (s, _) = post(
        &server,
        "/v1/release",
        json!({"key": "report", "fence": fence}),
    )
    .await;
    assert_eq!(s, 200);
    let (_, body) = get(&server, "/v1/locks/report").await;
    assert!(body["holder"].is_null());
    let r = reqwest::get(format!("{}/metrics", server.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(r.contains("leasehold_locks_held 0"), "{r}");
}

#[tokio::test]
async fn the_framed_protocol_answers_pipelined_calls_by_id() {
    use leasehold_proto::frame::{Frame, Op};
    let server = Leaseholdd::start();
    let mut a = common::RawFrames::connect(&server).await;
    let grant = |holder: &str| pb::GrantRequest {
        ttl_ms: 10_000,
        holder: holder.into(),
        ..Default::default()
    };
    a.send(vec![
        Frame::new(7, Op::Grant as u8, &grant("host-a/pid-1")),
        Frame::new(8, Op::Grant as u8, &grant("host-b/pid-2")),
    ])
    .await;
    let granted = a.replies(2).await;
    let lease = common::frame_ok::<pb::GrantResponse>(&granted[&7]).lease_id;
    let other = common::frame_ok::<pb::GrantResponse>(&granted[&8]).lease_id;

    // Three acquires in one write: two keys, then the first key again under
    // another lease.
    a.send(vec![
        Frame::new(1, Op::Acquire as u8, &acquire(lease, "one", 0)),
        Frame::new(2, Op::Acquire as u8, &acquire(lease, "two", 0)),
        Frame::new(3, Op::Acquire as u8, &acquire(other, "one", 0)),
    ])
    .await;
    let replies = a.replies(3).await;
    let two = common::frame_ok::<pb::AcquireResponse>(&replies[&2]).fence;
    // The calls run concurrently: whichever of 1 and 3 came first holds "one",
    // and the other is told who.
    let (won, lost, winner) = match replies[&1].tag {
        leasehold_proto::frame::REPLY_OK => (1, 3, "host-a/pid-1"),
        _ => (3, 1, "host-b/pid-2"),
    };
    let one = common::frame_ok::<pb::AcquireResponse>(&replies[&won]).fence;
    assert_ne!(one, two);
    let held = common::frame_error(&replies[&lost]);
    assert_eq!(held.code, "held");
    assert_eq!(held.details["holder"], winner);
    assert_eq!(held.details["fence"], one.to_string());

    // Another connection sees the same table, and a release frees the key.
    let mut b = common::RawFrames::connect(&server).await;
    let release = pb::ReleaseRequest {
        key: "one".into(),
        fence: one,
        request_id: 0,
    };
    b.send(vec![Frame::new(1, Op::Release as u8, &release)])
        .await;
    common::frame_ok::<pb::ReleaseResponse>(&b.replies(1).await[&1]);
    let mut c = common::grpc(&server).await;
    assert!(common::describe(&mut c, "one").await.holder.is_none());
    assert_eq!(
        common::describe(&mut c, "two")
            .await
            .holder
            .map(|h| h.fence),
        Some(two)
    );
}

/// Lists page through any number of locks and leases with a cursor: each
/// page names where the next starts, the pages together hold every item
/// once, in order, and the last page names no next one.
#[tokio::test]
async fn lists_page_with_a_cursor() {
    let server = Leaseholdd::start();
    for i in 0..25 {
        let (s, r) = post(
            &server,
            "/v1/acquire",
            json!({"key": format!("jobs/{i:02}"), "ttl_ms": 60_000}),
        )
        .await;
        assert_eq!(s, 200, "{r}");
    }
    let (s, r) = post(
        &server,
        "/v1/acquire",
        json!({"key": "other", "ttl_ms": 60_000}),
    )
    .await;
    assert_eq!(s, 200, "{r}");

    // HTTP, locks under a prefix, 10 at a time.
    let mut keys = Vec::new();
    let mut cursor = String::new();
    let mut pages = 0;
    loop {
        let (s, page) = get(
            &server,
            &format!("/v1/locks?prefix=jobs/&limit=10&start_after={cursor}"),
        )
        .await;
        assert_eq!(s, 200, "{page}");
        pages += 1;
        keys.extend(
            page["locks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l["key"].as_str().unwrap().to_string()),
        );
        match page["next_start_after"].as_str() {
            Some(next) => {
                assert_eq!(Some(next), keys.last().map(String::as_str));
                cursor = next.to_string();
            }
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(
        keys,
        (0..25).map(|i| format!("jobs/{i:02}")).collect::<Vec<_>>()
    );

    // gRPC, leases (one per acquire), 10 at a time.
    let mut c = common::grpc(&server).await;
    let mut leases = Vec::new();
    let mut after = 0;
    loop {
        let page = c
            .list_leases(pb::ListLeasesRequest {
                limit: 10,
                start_after: after,
            })
            .await
            .unwrap()
            .into_inner();
        leases.extend(page.leases.iter().map(|l| l.lease_id));
        match page.next_start_after {
            Some(next) => after = next,
            None => break,
        }
    }
    assert_eq!(leases.len(), 26);
    assert!(leases.windows(2).all(|w| w[0] < w[1]), "{leases:?}");

    // gRPC locks after a cursor; a cursor past the end is an empty last page.
    let page = c
        .list_locks(pb::ListLocksRequest {
            prefix: "jobs/".into(),
            limit: 0,
            start_after: "jobs/20".into(),
            held_only: false,
        })
        .await
        .unwrap()
        .into_inner();
    let keys: Vec<_> = page.locks.iter().map(|l| l.key.as_str()).collect();
    assert_eq!(keys, ["jobs/21", "jobs/22", "jobs/23", "jobs/24"]);
    assert_eq!(page.next_start_after, None);
    let (s, page) = get(&server, "/v1/locks?prefix=jobs/&start_after=zzz").await;
    assert_eq!(s, 200);
    assert_eq!(page["locks"], json!([]));
    assert_eq!(page["next_start_after"], Value::Null);
}

#[tokio::test]
async fn metrics_show_waiters_wait_times_and_log_fsyncs() {
    use leasehold_testkit::metric;
    let server = Leaseholdd::start();
    let metrics = || async {
        reqwest::get(format!("{}/metrics", server.url()))
            .await
            .expect("http")
            .text()
            .await
            .expect("text")
    };
    let (s, body) = post(
        &server,
        "/v1/acquire",
        json!({"key": "queue", "ttl_ms": 10000, "holder": "first"}),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    let fence = body["fence"].as_u64().expect("fence");
    let url = format!("{}/v1/acquire", server.url());
    let waiter = tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .json(&json!({"key": "queue", "ttl_ms": 10000, "holder": "second", "wait_ms": 10000}))
            .send()
            .await
            .expect("http")
            .status()
            .as_u16()
    });
    let mut waiting = 0;
    for _ in 0..100 {
        waiting = metric(&metrics().await, "leasehold_waiters");
        if waiting == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(waiting, 1, "the queued acquire shows as a waiter");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (s, _) = post(
        &server,
        "/v1/release",
        json!({"key": "queue", "fence": fence}),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(waiter.await.expect("join"), 200);
    let text = metrics().await;
    assert_eq!(metric(&text, "leasehold_waiters"), 0);
    assert_eq!(metric(&text, "leasehold_wait_seconds_count"), 1, "{text}");
    // It queued before it was seen queued, 100 ms before the release.
    let waited: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("leasehold_wait_seconds_sum "))
        .and_then(|v| v.trim().parse().ok())
        .expect("wait sum");
    assert!(waited >= 0.1, "waited {waited} s, not over 100 ms: {text}");
    assert!(
        text.contains("leasehold_wait_seconds_bucket{le=\"0.064\"} 0"),
        "counted in a bucket below 100 ms: {text}"
    );
    assert!(
        metric(&text, "leasehold_log_fsync_seconds_count") >= 3,
        "{text}"
    );
}

/// Semaphores and readers on the wire: `permits` and `mode` over HTTP and
/// gRPC, every holder listed, bad modes refused with the field named.
#[tokio::test]
async fn semaphores_and_readers_over_http_and_grpc() {
    let server = Leaseholdd::start();
    let permit =
        |holder: &str| json!({"key": "api", "ttl_ms": 5000, "holder": holder, "permits": 2});
    let (s1, a) = post(&server, "/v1/acquire", permit("a")).await;
    let (s2, b) = post(&server, "/v1/acquire", permit("b")).await;
    assert_eq!((s1, s2), (200, 200), "{a} {b}");
    assert!(b["fence"].as_u64() > a["fence"].as_u64());
    let (s, full) = post(&server, "/v1/acquire", permit("c")).await;
    assert_eq!((s, &full["error"]["code"]), (409, &json!("held")), "{full}");
    let (s, other) = post(
        &server,
        "/v1/acquire",
        json!({"key": "api", "ttl_ms": 5000, "mode": "permit", "permits": 3}),
    )
    .await;
    assert_eq!(s, 400, "{other}");
    let why = other["error"]["message"].as_str().unwrap_or_default();
    assert!(why.contains("a semaphore of 2 permits"), "{other}");
    let (_, view) = get(&server, "/v1/locks/api").await;
    assert_eq!(view["permits"], 2);
    let names: Vec<&str> = view["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .map(|h| h["holder"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(view["holders"][1]["mode"], "permit");

    for bad in [
        json!({"key": "x", "ttl_ms": 5000, "mode": "sometimes"}),
        json!({"key": "x", "ttl_ms": 5000, "mode": "shared", "permits": 2}),
        json!({"key": "x", "ttl_ms": 5000, "permits": 10_001}),
    ] {
        let (s, body) = post(&server, "/v1/acquire", bad.clone()).await;
        assert_eq!(
            (s, &body["error"]["code"]),
            (400, &json!("invalid_argument")),
            "{bad}: {body}"
        );
    }
    let (_, locks) = get(&server, "/v1/locks").await;
    assert_eq!(locks["locks"].as_array().map(Vec::len), Some(1), "{locks}");

    // gRPC: two readers, then a writer is refused; an unknown mode is refused.
    let mut c = common::grpc(&server).await;
    let shared = |lease_id| pb::AcquireRequest {
        mode: pb::Mode::Shared.into(),
        ..acquire(lease_id, "doc", 0)
    };
    let r1 = common::lease(&mut c, 10_000, "r1").await;
    let r2 = common::lease(&mut c, 10_000, "r2").await;
    let w = common::lease(&mut c, 10_000, "w").await;
    c.acquire(shared(r1)).await.expect("reader");
    c.acquire(shared(r2)).await.expect("reader");
    let err = c.acquire(acquire(w, "doc", 0)).await.expect_err("writer");
    assert_eq!(common::code(&err), "held");
    let err = c
        .acquire(pb::AcquireRequest {
            mode: 9,
            ..acquire(w, "doc", 0)
        })
        .await
        .expect_err("mode 9");
    assert_eq!(common::code(&err), "invalid_argument");
    let info = common::describe(&mut c, "doc").await;
    assert_eq!(info.holders.len(), 2);
    assert!(info.holders.iter().all(|h| h.mode() == pb::Mode::Shared));
}

/// A lock set over HTTP: one token for every key; a refused set leaves no
/// lease and no key behind; a wait for a set is granted when the last of
/// its keys is released.
#[tokio::test]
async fn lock_sets_over_http() {
    let server = Leaseholdd::start();
    let (s, first) = post(
        &server,
        "/v1/acquire",
        json!({"keys": ["q", "p"], "ttl_ms": 5000, "holder": "a"}),
    )
    .await;
    assert_eq!(s, 200, "{first}");
    assert_eq!(first["keys"], json!(["p", "q"]));
    let fence = first["fence"].as_u64().expect("fence");
    for key in ["p", "q"] {
        let (_, view) = get(&server, &format!("/v1/locks/{key}")).await;
        assert_eq!(view["holder"]["fence"], fence);
    }
    let (s, refused) = post(
        &server,
        "/v1/acquire",
        json!({"keys": ["q", "r"], "ttl_ms": 5000, "holder": "b"}),
    )
    .await;
    assert_eq!(
        (s, &refused["error"]["code"]),
        (409, &json!("held")),
        "{refused}"
    );
    let (_, leases) = get(&server, "/v1/leases").await;
    assert_eq!(
        leases["leases"].as_array().map(Vec::len),
        Some(1),
        "{leases}"
    );
    let (_, r) = get(&server, "/v1/locks/r").await;
    assert!(r["holder"].is_null(), "{r}");

    let url = server.url();
    let waiter = tokio::spawn(async move {
        let r = reqwest::Client::new()
            .post(format!("{url}/v1/acquire"))
            .json(&json!({"keys": ["q", "r"], "ttl_ms": 5000, "holder": "b", "wait_ms": 10000}))
            .send()
            .await
            .expect("http");
        r.json::<Value>().await.expect("json")
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (s, _) = post(&server, "/v1/release", json!({"key": "p", "fence": fence})).await;
    assert_eq!(s, 200);
    let granted = waiter.await.expect("waiter");
    assert!(granted["fence"].as_u64() > Some(fence), "{granted}");
    let (_, p) = get(&server, "/v1/locks/p").await;
    assert!(
        p["holder"].is_null(),
        "releasing p released the whole set: {p}"
    );

    for bad in [
        json!({"key": "a", "keys": ["b"], "ttl_ms": 5000}),
        json!({"keys": [], "ttl_ms": 5000}),
        json!({"keys": ["a"], "mode": "shared", "ttl_ms": 5000}),
    ] {
        let (s, body) = post(&server, "/v1/acquire", bad.clone()).await;
        assert_eq!(s, 400, "{bad}: {body}");
    }
}

/// What the dashboard reads: the node's recent events with its own time,
/// keys that are held (not those that only keep a checkpoint), and the
/// keys a lease is queued for.
#[tokio::test]
async fn recent_events_held_keys_and_waits_over_http() {
    let server = Leaseholdd::start();
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };
    let started = now_ms();
    let (_, kept) = post(
        &server,
        "/v1/acquire",
        json!({"key": "d/kept", "ttl_ms": 60_000}),
    )
    .await;
    let fence = kept["fence"].as_u64().expect("fence");
    let (status, _) = post(
        &server,
        "/v1/checkpoint",
        json!({"key": "d/kept", "fence": fence, "data": "step 3"}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = post(
        &server,
        "/v1/release",
        json!({"key": "d/kept", "fence": fence}),
    )
    .await;
    assert_eq!(status, 200);
    let (_, held) = post(
        &server,
        "/v1/acquire",
        json!({"key": "d/held", "ttl_ms": 60_000}),
    )
    .await;
    let (_, other) = post(
        &server,
        "/v1/acquire",
        json!({"key": "x/other", "ttl_ms": 60_000}),
    )
    .await;
    assert!(other["fence"].is_u64(), "{other}");

    let (_, events) = get(&server, "/v1/events?prefix=d/").await;
    let seen: Vec<(&str, &str)> = events["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| (e["kind"].as_str().unwrap(), e["key"].as_str().unwrap()))
        .collect();
    assert_eq!(
        seen,
        [
            ("acquired", "d/kept"),
            ("checkpoint", "d/kept"),
            ("released", "d/kept"),
            ("acquired", "d/held"),
        ],
        "{events}"
    );
    for e in events["events"].as_array().unwrap() {
        let at = e["at_unix_ms"].as_u64().expect("at_unix_ms");
        assert!(
            at >= started.saturating_sub(1_000) && at <= now_ms() + 1_000,
            "{e}"
        );
    }
    assert_eq!(events["events"][3]["fence"], held["fence"]);

    let keys = |body: &Value| -> Vec<String> {
        body["locks"]
            .as_array()
            .expect("locks")
            .iter()
            .map(|l| l["key"].as_str().unwrap().to_string())
            .collect()
    };
    let (_, all) = get(&server, "/v1/locks?prefix=d/").await;
    assert_eq!(keys(&all), ["d/held", "d/kept"]);
    let (_, only_held) = get(&server, "/v1/locks?prefix=d/&held=true").await;
    assert_eq!(keys(&only_held), ["d/held"]);

    // A second lease queued for d/held shows what it waits for.
    let (_, lease) = post(
        &server,
        "/v1/leases",
        json!({"ttl_ms": 60_000, "holder": "waiter"}),
    )
    .await;
    let waiter = lease["lease"].as_u64().expect("lease");
    let url = server.url();
    let queued = tokio::spawn(async move {
        reqwest::Client::new()
            .post(format!("{url}/v1/acquire"))
            .json(&json!({"key": "d/held", "lease": waiter, "wait_ms": 30_000}))
            .send()
            .await
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, described) = get(&server, &format!("/v1/leases/{waiter}")).await;
        if described["waiting_for"] == json!(["d/held"]) {
            assert_eq!(described["waiting_count"], 1);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{described}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, listed) = get(&server, "/v1/leases").await;
    let row = listed["leases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["lease"] == waiter)
        .cloned()
        .expect("the waiting lease");
    assert_eq!(row["waiting_for"], json!(["d/held"]), "{row}");
    queued.abort();

    let (_, health) = get(&server, "/health").await;
    assert_eq!(health["leader_url"], json!(server.url()), "{health}");
}

/// Takes `sets` lock sets of 64 keys `bulk/SET/K` under one new lease; its id.
async fn hold_bulk(server: &Leaseholdd, sets: usize) -> u64 {
    let (_, lease) = post(
        server,
        "/v1/leases",
        json!({"ttl_ms": 60_000, "holder": "bulk"}),
    )
    .await;
    let lease = lease["lease"].as_u64().expect("lease");
    for set in 0..sets {
        let keys: Vec<String> = (0..64).map(|k| format!("bulk/{set}/{k}")).collect();
        let (status, body) =
            post(server, "/v1/acquire", json!({"keys": keys, "lease": lease})).await;
        assert_eq!(status, 200, "{body}");
    }
    lease
}

async fn revoke(server: &Leaseholdd, lease: u64) {
    let r = reqwest::Client::new()
        .delete(format!("{}/v1/leases/{lease}", server.url()))
        .send()
        .await
        .expect("revoke");
    assert_eq!(r.status().as_u16(), 200);
}

/// A watcher that falls behind its stream's buffer (4,096 events) takes
/// what it missed from the node's history (10,000 events) and misses
/// nothing; one that falls behind the history too ends with its own code,
/// `watch_behind` (list again, then watch again), not `internal`.
#[tokio::test]
async fn a_watch_that_falls_behind_catches_up_or_says_so_with_its_own_code() {
    let server = Leaseholdd::start();
    // 66 sets of 64 keys: more lock events in one revoke than a watcher's
    // buffer holds, fewer than the history keeps.
    let lease = hold_bulk(&server, 66).await;
    let mut watch = common::SseWatch::open(&server.addr, "/v1/watch?prefix=bulk/", &[])
        .await
        .expect("watch");
    revoke(&server, lease).await;
    let events = watch.events(66 * 64).await;
    let ids: Vec<&str> = events.iter().map(|(id, _)| id.as_str()).collect();
    assert!(
        events.iter().all(|(_, e)| e["kind"] == "released"),
        "every event is a release, none an error"
    );
    let distinct: std::collections::BTreeSet<&str> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), 66 * 64, "none twice");

    // 160 sets: more than the history keeps.
    let lease = hold_bulk(&server, 160).await;
    let watch = common::RawWatch::open(&server.addr, "/v1/watch?prefix=bulk/", None).await;
    revoke(&server, lease).await;
    let error = watch.error().await;
    assert_eq!(error["error"]["code"], "watch_behind", "{error}");
}

/// Every event carries its position (`index`, `seq`, and `INDEX.SEQ` as the
/// server-sent event's id); a watch started after one sends exactly what
/// came after it, given as query parameters or as the `Last-Event-ID` an
/// `EventSource` sends when it reconnects. A node that no longer has those
/// events (it started from a later snapshot) answers 410 `watch_behind`.
#[tokio::test]
async fn a_watch_resumes_after_the_last_event_it_sent() {
    let mut server = Leaseholdd::start_with(&["--snapshot-every", "20"]);
    let mut first = common::SseWatch::open(&server.addr, "/v1/watch?prefix=r/", &[])
        .await
        .expect("watch");
    for i in 0..5 {
        let (status, body) = post(
            &server,
            "/v1/acquire",
            json!({"key": format!("r/{i}"), "ttl_ms": 60_000}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let all = first.events(5).await;
    for (id, e) in &all {
        assert_eq!(*id, format!("{}.{}", e["index"], e["seq"]), "{e}");
    }
    let keys = |events: &[(String, serde_json::Value)]| -> Vec<String> {
        events
            .iter()
            .map(|(_, e)| e["key"].as_str().unwrap_or("").to_string())
            .collect()
    };
    let (id, e) = &all[1];
    let by_query = format!(
        "/v1/watch?prefix=r/&after_index={}&after_seq={}",
        e["index"], e["seq"]
    );
    let mut resumed = common::SseWatch::open(&server.addr, &by_query, &[])
        .await
        .expect("resume by query");
    assert_eq!(keys(&resumed.events(3).await), keys(&all[2..]));
    let mut resumed = common::SseWatch::open(
        &server.addr,
        "/v1/watch?prefix=r/",
        &[("Last-Event-ID", id)],
    )
    .await
    .expect("resume by Last-Event-ID");
    assert_eq!(keys(&resumed.events(3).await), keys(&all[2..]));

    for (path, header) in [
        ("/v1/watch?after_seq=1", None),
        ("/v1/watch", Some("seven")),
        ("/v1/watch?after_index=1", Some("2.0")),
    ] {
        let headers: Vec<(&str, &str)> = header.map(|h| ("Last-Event-ID", h)).into_iter().collect();
        let refused = common::SseWatch::open(&server.addr, path, &headers).await;
        let (status, body) = refused.err().expect("refused");
        assert_eq!(status, 400, "{path} {header:?}: {body}");
        assert_eq!(body["error"]["code"], "invalid_argument", "{body}");
    }

    // Enough commands for snapshots, then a restart: the node's events
    // begin after its snapshot.
    for i in 0..60 {
        let (status, body) = post(
            &server,
            "/v1/acquire",
            json!({"key": format!("s/{i}"), "ttl_ms": 60_000}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    server.crash_and_restart();
    let refused = common::SseWatch::open(&server.addr, &by_query, &[]).await;
    let (status, body) = refused.err().expect("behind");
    assert_eq!(status, 410, "{body}");
    assert_eq!(body["error"]["code"], "watch_behind", "{body}");
}
