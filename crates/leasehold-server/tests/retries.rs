//! Retries and crashes as a client the project did not write sees them, over
//! HTTP: request ids are scoped to their caller, a grant (and a grant made
//! with an acquire) is retry-safe, and a wait whose caller died with the
//! server does not outlive it.

use std::time::{Duration, Instant};

use leasehold_core::REATTACH_MS;
use leasehold_testkit::Leaseholdd;
use serde_json::{json, Value};

async fn post(server: &Leaseholdd, path: &str, body: Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(format!("{}{path}", server.url()))
        .json(&body)
        .send()
        .await
        .expect("send");
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON body"))
}

async fn get(server: &Leaseholdd, path: &str) -> Value {
    reqwest::get(format!("{}{path}", server.url()))
        .await
        .expect("get")
        .json()
        .await
        .expect("JSON body")
}

async fn holder_lease(server: &Leaseholdd, key: &str) -> Option<u64> {
    get(server, &format!("/v1/locks/{key}")).await["holder"]["lease"].as_u64()
}

async fn lease_count(server: &Leaseholdd) -> usize {
    get(server, "/v1/leases").await["leases"]
        .as_array()
        .map_or(0, Vec::len)
}

/// Two callers that pick the same request id get their own answers; a
/// caller that reuses an id for another request is refused, by name.
#[tokio::test]
async fn a_request_id_is_scoped_to_its_caller() {
    let server = Leaseholdd::start();
    let (_, a) = post(&server, "/v1/leases", json!({"ttl_ms": 30_000})).await;
    let (_, b) = post(&server, "/v1/leases", json!({"ttl_ms": 30_000})).await;
    let (a, b) = (a["lease"].as_u64().unwrap(), b["lease"].as_u64().unwrap());

    let (s, x) = post(
        &server,
        "/v1/acquire",
        json!({"key": "x", "lease": a, "request_id": 7}),
    )
    .await;
    assert_eq!(s, 200, "{x}");
    let (s, y) = post(
        &server,
        "/v1/acquire",
        json!({"key": "y", "lease": b, "request_id": 7}),
    )
    .await;
    assert_eq!(s, 200, "{y}");
    assert_eq!(
        holder_lease(&server, "y").await,
        Some(b),
        "b really holds y"
    );
    assert!(y["fence"].as_u64() > x["fence"].as_u64());
    // Nobody else can take y now.
    let (s, _) = post(
        &server,
        "/v1/acquire",
        json!({"key": "y", "ttl_ms": 30_000}),
    )
    .await;
    assert_eq!(s, 409);

    // The same id for another key from the same lease: refused, naming the id.
    let (s, e) = post(
        &server,
        "/v1/acquire",
        json!({"key": "z", "lease": a, "request_id": 7}),
    )
    .await;
    assert_eq!(s, 400, "{e}");
    assert_eq!(e["error"]["code"], "invalid_argument");
    assert!(e["error"]["message"]
        .as_str()
        .unwrap()
        .contains("request_id"));
    assert!(e["error"]["message"].as_str().unwrap().contains(" 7 "));
    assert_eq!(holder_lease(&server, "z").await, None);

    // Releases with one id by two holders each release their own lock.
    let (s, _) = post(
        &server,
        "/v1/release",
        json!({"key": "x", "fence": x["fence"], "request_id": 3}),
    )
    .await;
    assert_eq!(s, 200);
    let (s, _) = post(
        &server,
        "/v1/release",
        json!({"key": "y", "fence": y["fence"], "request_id": 3}),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(holder_lease(&server, "y").await, None, "y was released");
}

/// A grant, and an acquire that grants its own lease, retried with the same
/// request id answer with the same lease and token and leak nothing.
#[tokio::test]
async fn retried_grants_and_acquires_leak_no_lease() {
    let server = Leaseholdd::start();
    let grant = json!({"ttl_ms": 30_000, "holder": "g", "request_id": 5});
    let (_, first) = post(&server, "/v1/leases", grant.clone()).await;
    let (_, again) = post(&server, "/v1/leases", grant).await;
    assert_eq!(first, again);
    assert_eq!(lease_count(&server).await, 1);

    let body = json!({"key": "r", "ttl_ms": 30_000, "request_id": 9});
    let (s, first) = post(&server, "/v1/acquire", body.clone()).await;
    assert_eq!(s, 200, "{first}");
    let (s, again) = post(&server, "/v1/acquire", body).await;
    assert_eq!(s, 200, "{again}");
    assert_eq!(first, again, "the retry gets the same lease and fence");
    assert_eq!(lease_count(&server).await, 2, "no lease per retry");
    assert_eq!(holder_lease(&server, "r").await, first["lease"].as_u64());

    // A refusal leaves no lease behind.
    let (s, _) = post(
        &server,
        "/v1/acquire",
        json!({"key": "r", "ttl_ms": 30_000, "request_id": 10}),
    )
    .await;
    assert_eq!(s, 409);
    assert_eq!(lease_count(&server).await, 2);
}

/// `kill -9` while a caller waits: after the restart, the waiter whose call
/// died is not handed the lock for its whole TTL. It is withdrawn (or its
/// grant taken back) once REATTACH_MS pass without it coming back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_died_with_the_server_is_not_granted_the_lock() {
    let mut server = Leaseholdd::start();
    let (s, held) = post(
        &server,
        "/v1/acquire",
        json!({"key": "job", "ttl_ms": 60_000, "holder": "a"}),
    )
    .await;
    assert_eq!(s, 200);
    let url = server.url();
    let waiting = tokio::spawn(async move {
        reqwest::Client::new()
            .post(format!("{url}/v1/acquire"))
            .json(&json!({"key": "job", "ttl_ms": 60_000, "holder": "b", "wait_ms": 60_000}))
            .send()
            .await
    });
    leasehold_testkit::wait_until(Duration::from_secs(10), "b to queue", || {
        leasehold_testkit::http_get(&server.addr, "/v1/locks/job")
            .is_some_and(|b| b.contains("\"holder\":\"b\""))
    });
    server.crash_and_restart();
    assert!(
        waiting.await.unwrap().is_err(),
        "the waiting call died with the server"
    );

    let restarted = Instant::now();
    let (s, _) = post(
        &server,
        "/v1/release",
        json!({"key": "job", "fence": held["fence"]}),
    )
    .await;
    assert_eq!(s, 200);
    // First in line, the ghost is granted the key, held for it for the
    // bound in case its caller comes back (as the Rust client would).
    let lock = get(&server, "/v1/locks/job").await;
    assert_eq!(lock["holder"]["holder"], "b", "{lock}");
    // Within the bound the ghost may hold the grant it cannot receive; past
    // it, the key is free again.
    let bound = Duration::from_millis(REATTACH_MS) + Duration::from_secs(3);
    let mut free = false;
    while restarted.elapsed() < bound {
        if holder_lease(&server, "job").await.is_none() {
            free = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(free, "the lock stayed with a caller that is gone");
    let (s, _) = post(
        &server,
        "/v1/acquire",
        json!({"key": "job", "ttl_ms": 60_000, "holder": "c"}),
    )
    .await;
    assert_eq!(s, 200, "a live caller gets the lock");
}
