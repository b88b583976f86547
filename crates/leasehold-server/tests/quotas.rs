//! Quotas and the rate limit: what would pass a limit is refused with
//! `resource_exhausted` naming it, and renewing, releasing and revoking
//! never are, so a node at its limits still lets holders stay and leave.

mod common;

use common::call;
use leasehold_testkit::{workspace_bin, Leaseholdd};
use serde_json::{json, Value};

fn refused(status: u16, answer: &Value, limit: &str) {
    assert_eq!(status, 429, "{answer}");
    assert_eq!(answer["error"]["code"], "resource_exhausted", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains(limit), "{message}");
}

#[tokio::test]
async fn a_node_at_its_limits_refuses_new_work_and_lets_holders_renew_and_leave() {
    let server = Leaseholdd::start_with(&["--max-leases", "3", "--max-locks", "2"]);
    let a = server.addr.as_str();
    let mut leases = Vec::new();
    for i in 0..3 {
        let body = json!({ "ttl_ms": 60_000, "holder": format!("h{i}") });
        let (status, answer) = call("POST", a, "/v1/leases", None, Some(body)).await;
        assert_eq!(status, 200, "{answer}");
        leases.push(answer["lease"].as_u64().expect("lease"));
    }
    let body = json!({ "ttl_ms": 60_000, "holder": "one too many" });
    let (status, answer) = call("POST", a, "/v1/leases", None, Some(body)).await;
    refused(status, &answer, "--max-leases");
    assert!(answer["error"]["message"]
        .as_str()
        .unwrap_or("")
        .contains("3 live"));
    // An acquire that would make a lease is refused too.
    let body = json!({ "key": "x", "ttl_ms": 60_000 });
    let (status, answer) = call("POST", a, "/v1/acquire", None, Some(body)).await;
    refused(status, &answer, "--max-leases");

    let mut fences = Vec::new();
    for (key, lease) in [("k1", leases[0]), ("k2", leases[1])] {
        let body = json!({ "key": key, "lease": lease });
        let (status, answer) = call("POST", a, "/v1/acquire", None, Some(body)).await;
        assert_eq!(status, 200, "{answer}");
        fences.push(answer["fence"].as_u64().expect("fence"));
    }
    let body = json!({ "key": "k3", "lease": leases[2] });
    let (status, answer) = call("POST", a, "/v1/acquire", None, Some(body)).await;
    refused(status, &answer, "--max-locks");
    // At the limit, asking again for what a lease holds adds nothing: it is
    // answered with the hold, not refused.
    let body = json!({ "key": "k2", "lease": leases[1] });
    let (status, answer) = call("POST", a, "/v1/acquire", None, Some(body)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["fence"].as_u64(), Some(fences[1]), "{answer}");

    // At both limits: renewing, releasing and revoking all go through.
    for lease in &leases {
        let path = format!("/v1/leases/{lease}/keepalive");
        let (status, answer) = call("POST", a, &path, None, Some(json!({}))).await;
        assert_eq!(status, 200, "{answer}");
    }
    let body = json!({ "key": "k1", "fence": fences[0] });
    let (status, answer) = call("POST", a, "/v1/release", None, Some(body)).await;
    assert_eq!(status, 200, "{answer}");
    let path = format!("/v1/leases/{}", leases[1]);
    let (status, answer) = call("DELETE", a, &path, None, None).await;
    assert_eq!(status, 200, "{answer}");
    // And room came back.
    let body = json!({ "key": "k3", "ttl_ms": 60_000 });
    let (status, answer) = call("POST", a, "/v1/acquire", None, Some(body)).await;
    assert_eq!(status, 200, "{answer}");
}

#[tokio::test]
async fn a_retry_of_an_answered_request_is_not_refused_at_the_limit() {
    let server = Leaseholdd::start_with(&["--max-leases", "1", "--max-locks", "1"]);
    let a = server.addr.as_str();
    let first = json!({ "key": "k", "ttl_ms": 60_000, "request_id": 77 });
    let (status, answer) = call("POST", a, "/v1/acquire", None, Some(first.clone())).await;
    assert_eq!(status, 200, "{answer}");
    // Both limits are reached; the retry (its answer lost, say) gets the
    // first answer again, and a new request is refused.
    let (status, again) = call("POST", a, "/v1/acquire", None, Some(first)).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["fence"], answer["fence"], "{again}");
    assert_eq!(again["lease"], answer["lease"], "{again}");
    let other = json!({ "key": "j", "ttl_ms": 60_000, "request_id": 78 });
    let (status, refusal) = call("POST", a, "/v1/acquire", None, Some(other)).await;
    refused(status, &refusal, "--max-leases");
}

/// Turns auth on at `a` and makes a token of the role `w` (lock on every
/// key): the root token and the worker's.
async fn root_and_worker(a: &str) -> (String, String) {
    let (status, enabled) = call("POST", a, "/v1/auth/enable", None, None).await;
    assert_eq!(status, 200, "{enabled}");
    let root = enabled["token"].as_str().expect("root token").to_string();
    let rules = json!({ "rules": [{ "prefix": "", "permission": "lock" }] });
    let (status, body) = call("PUT", a, "/v1/auth/roles/w", Some(&root), Some(rules)).await;
    assert_eq!(status, 200, "{body}");
    let made = json!({ "name": "w", "role": "w" });
    let (status, body) = call("POST", a, "/v1/auth/tokens", Some(&root), Some(made)).await;
    assert_eq!(status, 200, "{body}");
    (root, body["token"].as_str().expect("token").to_string())
}

#[tokio::test]
async fn a_token_at_its_lease_limit_is_refused_and_another_token_is_not() {
    let server = Leaseholdd::start_with(&["--max-leases-per-token", "2"]);
    let a = server.addr.as_str();
    let (root, worker) = root_and_worker(a).await;

    let grant = json!({ "ttl_ms": 60_000, "holder": "w" });
    let mut leases = Vec::new();
    for _ in 0..2 {
        let (status, answer) =
            call("POST", a, "/v1/leases", Some(&worker), Some(grant.clone())).await;
        assert_eq!(status, 200, "{answer}");
        leases.push(answer["lease"].as_u64().expect("lease"));
    }
    let (status, answer) = call("POST", a, "/v1/leases", Some(&worker), Some(grant.clone())).await;
    refused(status, &answer, "--max-leases-per-token");
    assert!(answer["error"]["message"]
        .as_str()
        .unwrap_or("")
        .contains("2 live"));
    // Another token has room of its own.
    let (status, answer) = call("POST", a, "/v1/leases", Some(&root), Some(grant.clone())).await;
    assert_eq!(status, 200, "{answer}");
    // The worker's own leases still take locks, and a revoke makes room.
    let body = json!({ "key": "k", "lease": leases[0] });
    let (status, answer) = call("POST", a, "/v1/acquire", Some(&worker), Some(body)).await;
    assert_eq!(status, 200, "{answer}");
    let path = format!("/v1/leases/{}", leases[1]);
    let (status, answer) = call("DELETE", a, &path, Some(&worker), None).await;
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = call("POST", a, "/v1/leases", Some(&worker), Some(grant)).await;
    assert_eq!(status, 200, "{answer}");
}

#[tokio::test]
async fn a_token_at_its_lock_and_wait_limits_is_refused_and_another_token_is_not() {
    let server =
        Leaseholdd::start_with(&["--max-locks-per-token", "2", "--max-waiters-per-token", "1"]);
    let a = server.addr.as_str();
    let (root, worker) = root_and_worker(a).await;
    let grant = json!({ "ttl_ms": 60_000, "holder": "w" });
    let (status, answer) = call("POST", a, "/v1/leases", Some(&worker), Some(grant.clone())).await;
    assert_eq!(status, 200, "{answer}");
    let lease = answer["lease"].as_u64().expect("lease");
    let acquire =
        |key: &str, wait_ms: u64| json!({ "key": key, "lease": lease, "wait_ms": wait_ms });
    let mut fences = Vec::new();
    for key in ["a", "b"] {
        let (status, answer) = call(
            "POST",
            a,
            "/v1/acquire",
            Some(&worker),
            Some(acquire(key, 0)),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        fences.push(answer["fence"].as_u64().expect("fence"));
    }
    let (status, answer) = call(
        "POST",
        a,
        "/v1/acquire",
        Some(&worker),
        Some(acquire("c", 0)),
    )
    .await;
    refused(status, &answer, "--max-locks-per-token");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("2 held"),
        "{answer}"
    );
    // Its own key again adds nothing; another token holds keys of its own
    // (up to its own limit, the same flag).
    let (status, answer) = call(
        "POST",
        a,
        "/v1/acquire",
        Some(&worker),
        Some(acquire("a", 0)),
    )
    .await;
    assert_eq!(
        (status, answer["fence"].as_u64()),
        (200, Some(fences[0])),
        "{answer}"
    );
    let (status, answer) = call("POST", a, "/v1/leases", Some(&root), Some(grant)).await;
    assert_eq!(status, 200, "{answer}");
    let other = answer["lease"].as_u64().expect("lease");
    for key in ["x", "y"] {
        let body = json!({ "key": key, "lease": other });
        let (status, answer) = call("POST", a, "/v1/acquire", Some(&root), Some(body)).await;
        assert_eq!(status, 200, "{answer}");
    }
    // A release makes room: one wait (on a key the root token holds) is
    // taken, and a second is refused.
    let body = json!({ "key": "b", "fence": fences[1] });
    let (status, answer) = call("POST", a, "/v1/release", Some(&worker), Some(body)).await;
    assert_eq!(status, 200, "{answer}");
    let (addr, token, body) = (a.to_string(), worker.clone(), acquire("x", 60_000));
    let waiting =
        tokio::spawn(
            async move { call("POST", &addr, "/v1/acquire", Some(&token), Some(body)).await },
        );
    let mut queued = false;
    for _ in 0..250 {
        let (_, info) = call("GET", a, "/v1/locks/x", Some(&root), None).await;
        queued = info["waiters"][0]["lease"].as_u64() == Some(lease);
        if queued {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(queued, "the first wait was never queued");
    let (status, answer) = call(
        "POST",
        a,
        "/v1/acquire",
        Some(&worker),
        Some(acquire("y", 60_000)),
    )
    .await;
    refused(status, &answer, "--max-waiters-per-token");
    waiting.abort();
}

#[tokio::test]
async fn a_roles_quota_holds_its_tokens_and_not_others() {
    let server = Leaseholdd::start_with(&[
        "--max-leases-per-token",
        "50",
        "--role-quota",
        "batch=leases:1",
    ]);
    let a = server.addr.as_str();
    let (status, enabled) = call("POST", a, "/v1/auth/enable", None, None).await;
    assert_eq!(status, 200, "{enabled}");
    let root = enabled["token"].as_str().expect("root token").to_string();
    let rules = json!({ "rules": [{ "prefix": "jobs/", "permission": "lock" }] });
    let (status, body) = call("PUT", a, "/v1/auth/roles/batch", Some(&root), Some(rules)).await;
    assert_eq!(status, 200, "{body}");
    let made = json!({ "name": "nightly", "role": "batch" });
    let (status, body) = call("POST", a, "/v1/auth/tokens", Some(&root), Some(made)).await;
    assert_eq!(status, 200, "{body}");
    let batch = body["token"].as_str().expect("token").to_string();

    let body = json!({ "key": "jobs/a", "ttl_ms": 60_000 });
    let (status, answer) = call("POST", a, "/v1/acquire", Some(&batch), Some(body)).await;
    assert_eq!(status, 200, "{answer}");
    let body = json!({ "key": "jobs/b", "ttl_ms": 60_000 });
    let (status, answer) = call("POST", a, "/v1/acquire", Some(&batch), Some(body)).await;
    refused(status, &answer, "--role-quota batch");
    // Root's role has no quota of its own: the flag's 50 hold for it.
    for i in 0..3 {
        let body = json!({ "key": format!("r/{i}"), "ttl_ms": 60_000 });
        let (status, answer) = call("POST", a, "/v1/acquire", Some(&root), Some(body)).await;
        assert_eq!(status, 200, "{answer}");
    }
}

#[tokio::test]
async fn a_token_past_its_rate_is_slowed_and_its_renewals_are_not() {
    let server = Leaseholdd::start_with(&["--rate-limit", "5"]);
    let a = server.addr.as_str();
    let (status, enabled) = call("POST", a, "/v1/auth/enable", None, None).await;
    assert_eq!(status, 200, "{enabled}");
    let root = enabled["token"].as_str().expect("root token").to_string();
    let body = json!({ "ttl_ms": 60_000, "holder": "flood" });
    let (status, answer) = call("POST", a, "/v1/leases", Some(&root), Some(body)).await;
    assert_eq!(status, 200, "{answer}");
    let lease = answer["lease"].as_u64().expect("lease");

    let mut refusals = 0;
    for i in 0..30 {
        if refusals == 2 {
            break;
        }
        let body = json!({ "key": format!("f/{i}"), "lease": lease });
        let (status, answer) = call("POST", a, "/v1/acquire", Some(&root), Some(body)).await;
        if status == 429 {
            refused(status, &answer, "--rate-limit");
            refusals += 1;
        } else {
            assert_eq!(status, 200, "{answer}");
        }
    }
    assert!(
        refusals > 0,
        "acquires one after another passed a rate of 5 a second"
    );
    for _ in 0..30 {
        let path = format!("/v1/leases/{lease}/keepalive");
        let (status, answer) = call("POST", a, &path, Some(&root), Some(json!({}))).await;
        assert_eq!(status, 200, "a renewal was refused: {answer}");
    }
}

#[test]
fn a_role_quota_of_zero_or_without_its_form_is_refused_at_start() {
    for bad in ["batch=leases:0", "batch", "batch=size:5"] {
        let out = std::process::Command::new(workspace_bin("leaseholdd"))
            .args(["--role-quota", bad, "--print-config"])
            .output()
            .expect("run leaseholdd");
        assert_eq!(out.status.code(), Some(2), "{bad} was taken");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.contains("ROLE=leases:N"), "{said}");
    }
}

#[test]
fn a_quota_of_zero_is_refused_at_start() {
    for flag in [
        "--max-leases",
        "--max-locks",
        "--max-waiters",
        "--max-leases-per-token",
        "--max-locks-per-token",
        "--max-waiters-per-token",
        "--rate-limit",
    ] {
        let out = std::process::Command::new(workspace_bin("leaseholdd"))
            .args([flag, "0", "--print-config"])
            .output()
            .expect("run leaseholdd");
        assert_eq!(out.status.code(), Some(2), "{flag} 0 was taken");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.contains(flag) && said.contains('0'), "{said}");
    }
}
