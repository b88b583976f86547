//! The client with an access token, against a real `leaseholdd` with auth
//! on: locks inside the token's prefix over both transports (framed for
//! try-acquire and release, gRPC for waits), typed refusals outside it, a
//! refused token at connect, and a holder whose token is revoked losing its
//! lease.

use std::time::Duration;

use leasehold::{Client, Error, LockOptions};
use leasehold_testkit::Leaseholdd;
use serde_json::{json, Value};

async fn admin(addr: &str, token: Option<&str>, method: &str, path: &str, body: Value) -> Value {
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
    let mut request = reqwest::Client::new()
        .request(method, format!("http://{addr}{path}"))
        .json(&body);
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let answer: Value = request
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert!(answer.get("error").is_none(), "{path}: {answer}");
    answer
}

/// A server with auth on, the root token and a token for `jobs/` only.
async fn server() -> (Leaseholdd, String, String, u64) {
    let server = Leaseholdd::start();
    let addr = server.addr.clone();
    let root = admin(&addr, None, "POST", "/v1/auth/enable", json!({})).await["token"]
        .as_str()
        .expect("root")
        .to_string();
    let rules = json!({ "rules": [{ "prefix": "jobs/", "permission": "lock" }] });
    admin(&addr, Some(&root), "PUT", "/v1/auth/roles/jobs", rules).await;
    let made = admin(
        &addr,
        Some(&root),
        "POST",
        "/v1/auth/tokens",
        json!({ "name": "worker", "role": "jobs" }),
    )
    .await;
    let jobs = made["token"].as_str().expect("token").to_string();
    let id = made["id"].as_u64().expect("id");
    (server, root, jobs, id)
}

fn opts() -> LockOptions {
    LockOptions::default().ttl(Duration::from_secs(3))
}

#[tokio::test]
async fn a_token_locks_inside_its_prefix_and_is_refused_outside() {
    let (server, _root, jobs, _) = server().await;
    let client = Client::builder(&server.url())
        .token(&jobs)
        .connect()
        .await
        .expect("connect with a token");
    // Framed: try once; gRPC: wait.
    let lease = client.try_acquire("jobs/a", opts()).await.expect("jobs/a");
    let waited = client
        .acquire("jobs/b", opts().wait(Duration::from_secs(2)))
        .await
        .expect("jobs/b with a wait");
    match client.try_acquire("payments/x", opts()).await {
        Err(Error::PermissionDenied(m)) => assert!(m.contains("payments/x"), "{m}"),
        other => panic!(
            "expected permission denied, got {:?}",
            other.map(|l| l.fence())
        ),
    }
    match client
        .acquire("payments/x", opts().wait(Duration::from_secs(1)))
        .await
    {
        Err(Error::PermissionDenied(_)) => {}
        other => panic!(
            "expected permission denied, got {:?}",
            other.map(|l| l.fence())
        ),
    }
    lease.release().await.expect("release");
    waited.release().await.expect("release");

    // No token, or a wrong one.
    let anonymous = Client::connect(&server.url()).await.expect("connect");
    assert!(matches!(
        anonymous
            .try_acquire("jobs/a", opts())
            .await
            .map(|l| l.fence()),
        Err(Error::Unauthenticated(_))
    ));
    let wrong = Client::builder(&server.url())
        .token("lh_2_0000")
        .connect()
        .await;
    assert!(matches!(wrong.map(|_| ()), Err(Error::Unauthenticated(_))));
}

#[tokio::test]
async fn a_holder_whose_token_is_revoked_loses_its_lease() {
    let (server, root, jobs, id) = server().await;
    let client = Client::builder(&server.url())
        .token(&jobs)
        .connect()
        .await
        .expect("connect");
    let lease = client
        .try_acquire("jobs/long", opts())
        .await
        .expect("jobs/long");
    let fence = lease.token().expect("live");
    admin(
        &server.addr,
        Some(&root),
        "DELETE",
        &format!("/v1/auth/tokens/{id}"),
        json!({}),
    )
    .await;
    // The next renewal (at TTL/3) is refused: the lease is lost well
    // before its TTL runs out on the server.
    tokio::time::timeout(Duration::from_secs(3), lease.lost())
        .await
        .expect("the lease is lost once its token is revoked");
    assert!(lease.token().is_err());
    // The key frees when the server-side lease expires; root sees the
    // fence move on when it takes it.
    let root_client = Client::builder(&server.url())
        .token(&root)
        .connect()
        .await
        .expect("connect as root");
    let next = root_client
        .acquire("jobs/long", opts().wait(Duration::from_secs(6)))
        .await
        .expect("root takes the key after the lease expires");
    assert!(next.token().expect("live") > fence);
}
