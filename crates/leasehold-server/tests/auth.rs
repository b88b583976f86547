//! Access tokens scoped to key prefixes, against real `leaseholdd`
//! processes: what a token may touch and see over HTTP, gRPC and the framed
//! protocol, revocation on every node of a cluster, auth kept across
//! restarts, and bad input to the auth API.

mod common;

use std::time::{Duration, Instant};

use common::{call, code, frame_error, frame_ok, RawFrames};
use leasehold_proto::frame::{Frame, Op};
use leasehold_proto::v1 as pb;
use leasehold_testkit::Cluster;
use leasehold_testkit::Leaseholdd;
use pb::leasehold_client::LeaseholdClient;
use serde_json::{json, Value};
use tonic::transport::Channel;

/// Turns auth on; the root token.
async fn enable(addr: &str) -> String {
    let (status, body) = call("POST", addr, "/v1/auth/enable", None, None).await;
    assert_eq!(status, 200, "{body}");
    body["token"].as_str().expect("root token").to_string()
}

/// Sets `role` and makes a token for it; the token.
async fn token_for(addr: &str, root: &str, role: &str, rules: Value) -> String {
    let path = format!("/v1/auth/roles/{role}");
    let (status, body) = call(
        "PUT",
        addr,
        &path,
        Some(root),
        Some(json!({ "rules": rules })),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let made = json!({ "name": role, "role": role });
    let (status, body) = call("POST", addr, "/v1/auth/tokens", Some(root), Some(made)).await;
    assert_eq!(status, 200, "{body}");
    body["token"].as_str().expect("token").to_string()
}

/// A token for the role `jobs`: lock on `jobs/`, nothing else.
async fn jobs_token(addr: &str, root: &str) -> String {
    let rules = json!([{ "prefix": "jobs/", "permission": "lock" }]);
    token_for(addr, root, "jobs", rules).await
}

/// Takes `key` on a new lease as `token`: the status and the answer.
async fn acquire(addr: &str, token: Option<&str>, key: &str) -> (u16, Value) {
    let body = json!({ "key": key, "ttl_ms": 30_000 });
    call("POST", addr, "/v1/acquire", token, Some(body)).await
}

/// Puts `authorization: Bearer <token>` on every gRPC call.
#[derive(Clone)]
struct Bearer(tonic::metadata::MetadataValue<tonic::metadata::Ascii>);

impl tonic::service::Interceptor for Bearer {
    #[allow(clippy::result_large_err)]
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        r.metadata_mut().insert("authorization", self.0.clone());
        Ok(r)
    }
}

/// A gRPC client that sends `token` with every call.
type Authed = LeaseholdClient<tonic::service::interceptor::InterceptedService<Channel, Bearer>>;

async fn grpc_as(url: String, token: &str) -> Authed {
    let channel = Channel::from_shared(url)
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let value = format!("Bearer {token}").parse().expect("header");
    LeaseholdClient::with_interceptor(channel, Bearer(value))
}

#[tokio::test]
async fn a_token_touches_and_sees_only_its_prefixes() {
    let server = Leaseholdd::start();
    let addr = server.addr.as_str();
    // Before auth is on, anyone may do anything.
    assert_eq!(acquire(addr, None, "before/auth").await.0, 200);
    let root = enable(addr).await;
    let jobs = jobs_token(addr, &root).await;

    // No token, a malformed one, a made-up one: 401, and nothing taken.
    let (status, body) = acquire(addr, None, "jobs/a").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("unauthenticated"))
    );
    assert_eq!(acquire(addr, Some("nonsense"), "jobs/a").await.0, 401);
    let forged = format!("{}x", &jobs[..jobs.len() - 1]);
    assert_eq!(acquire(addr, Some(&forged), "jobs/a").await.0, 401);
    let (_, lock) = call("GET", addr, "/v1/locks/jobs/a", Some(&root), None).await;
    assert!(lock["holder"].is_null(), "{lock}");

    // Its prefix: yes. Another: 403 naming the key and the permission.
    let (status, mine) = acquire(addr, Some(&jobs), "jobs/a").await;
    assert_eq!(status, 200, "{mine}");
    let (status, body) = acquire(addr, Some(&jobs), "payments/x").await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "permission_denied");
    assert_eq!(body["error"]["key"], "payments/x");
    assert_eq!(body["error"]["needed"], "lock");

    // Root's lock under payments/: the jobs token can neither release it,
    // nor revoke its lease, nor see it.
    let (status, theirs) = acquire(addr, Some(&root), "payments/x").await;
    assert_eq!(status, 200, "{theirs}");
    let release = json!({ "key": "payments/x", "fence": theirs["fence"] });
    let (status, _) = call("POST", addr, "/v1/release", Some(&jobs), Some(release)).await;
    assert_eq!(status, 403);
    let lease = theirs["lease"].as_u64().expect("lease");
    let path = format!("/v1/leases/{lease}");
    let (status, body) = call("DELETE", addr, &path, Some(&jobs), None).await;
    assert_eq!(status, 403, "{body}");
    let (status, _) = call("GET", addr, &path, Some(&jobs), None).await;
    assert_eq!(status, 403);
    let (_, still) = call("GET", addr, "/v1/locks/payments/x", Some(&root), None).await;
    assert_eq!(still["holder"]["fence"], theirs["fence"], "{still}");
    let (_, list) = call("GET", addr, "/v1/locks", Some(&jobs), None).await;
    let keys: Vec<&str> = list["locks"]
        .as_array()
        .expect("locks")
        .iter()
        .filter_map(|l| l["key"].as_str())
        .collect();
    assert_eq!(keys, ["jobs/a"]);
    let (_, leases) = call("GET", addr, "/v1/leases", Some(&jobs), None).await;
    let ids: Vec<u64> = leases["leases"]
        .as_array()
        .expect("leases")
        .iter()
        .filter_map(|l| l["lease"].as_u64())
        .collect();
    assert_eq!(ids, [mine["lease"].as_u64().expect("lease")]);
    // Root sees all three, the one from before auth too.
    let (_, all) = call("GET", addr, "/v1/locks", Some(&root), None).await;
    assert_eq!(all["locks"].as_array().map(Vec::len), Some(3), "{all}");

    // No admin: membership and auth are out of reach.
    let (status, _) = call("GET", addr, "/v1/auth", Some(&jobs), None).await;
    assert_eq!(status, 403);
    let grab = json!({ "name": "mine", "role": "root" });
    let (status, _) = call("POST", addr, "/v1/auth/tokens", Some(&jobs), Some(grab)).await;
    assert_eq!(status, 403);
    let (status, _) = call("DELETE", addr, "/v1/cluster/members/1", Some(&jobs), None).await;
    assert_eq!(status, 403);

    // A watch over every key, as the jobs token, over gRPC: root's events
    // under payments/ never reach it.
    let mut watcher = grpc_as(server.url(), &jobs).await;
    let mut events = watcher
        .watch(pb::WatchRequest {
            prefix: String::new(),
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();
    acquire(addr, Some(&root), "payments/y").await;
    acquire(addr, Some(&jobs), "jobs/b").await;
    let first = tokio::time::timeout(Duration::from_secs(10), events.message())
        .await
        .expect("an event")
        .expect("stream")
        .expect("event");
    assert_eq!(first.key, "jobs/b");
    // gRPC calls refuse the same way, with the code in metadata.
    let refused = watcher
        .describe_lock(pb::DescribeLockRequest {
            key: "payments/x".into(),
        })
        .await
        .expect_err("describe outside the prefix");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    assert_eq!(code(&refused), "permission_denied");

    // Renewals in one call are checked one by one: its own lease is
    // renewed, root's is refused as a call of its own would be.
    let (own, others) = (mine["lease"].as_u64().expect("lease"), lease);
    let alone = watcher
        .keep_alive(pb::KeepAliveRequest { lease_id: others })
        .await
        .expect_err("another token's lease");
    let together = watcher
        .keep_alive_many(pb::KeepAliveManyRequest {
            lease_ids: vec![own, others],
        })
        .await
        .expect("renewals")
        .into_inner()
        .renewals;
    assert!(together[0].renewed.is_some(), "{together:?}");
    let refused = together[1].error.as_ref().expect("refused");
    assert_eq!(refused.code, code(&alone), "{together:?}");

    // Root may revoke the jobs token's lease: an admin act, in the audit log.
    let path = format!("/v1/leases/{}", mine["lease"]);
    let (status, body) = call("DELETE", addr, &path, Some(&root), None).await;
    assert_eq!(status, 200, "{body}");
    let start = Instant::now();
    while !server
        .process
        .output()
        .contains("revoked, releasing 1 keys")
    {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{}",
            server.process.output()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = server.process.output();
    let line = log
        .lines()
        .find(|l| l.contains("revoked, releasing 1 keys"))
        .expect("the audit line");
    assert!(
        line.contains("leasehold::audit") && line.contains("root"),
        "{line}"
    );
    assert!(line.contains("of \"jobs\" (token 2)"), "{line}");
}

#[tokio::test]
async fn the_framed_protocol_authenticates_with_a_frame() {
    let server = Leaseholdd::start();
    let root = enable(&server.addr).await;
    let jobs = jobs_token(&server.addr, &root).await;
    let mut frames = RawFrames::connect(&server).await;
    let grant = pb::GrantRequest {
        ttl_ms: 10_000,
        ..Default::default()
    };
    let auth = |id, token: &str| {
        let body = pb::AuthenticateRequest {
            token: token.into(),
        };
        Frame::new(id, Op::Authenticate as u8, &body)
    };
    // Before, with a bad token, then a good one; a grant after each, all in
    // one write: the frames apply in order.
    frames
        .send(vec![
            Frame::new(1, Op::Grant as u8, &grant),
            auth(2, "lh_9_nope"),
            Frame::new(3, Op::Grant as u8, &grant),
            auth(4, &jobs),
            Frame::new(5, Op::Grant as u8, &grant),
        ])
        .await;
    let replies = frames.replies(5).await;
    assert_eq!(frame_error(&replies[&1]).code, "unauthenticated");
    assert_eq!(frame_error(&replies[&2]).code, "unauthenticated");
    assert_eq!(frame_error(&replies[&3]).code, "unauthenticated");
    frame_ok::<pb::AuthenticateResponse>(&replies[&4]);
    let lease = frame_ok::<pb::GrantResponse>(&replies[&5]).lease_id;
    let outside = pb::AcquireRequest {
        lease_id: lease,
        key: "payments/x".into(),
        ..Default::default()
    };
    let inside = pb::AcquireRequest {
        key: "jobs/x".into(),
        ..outside.clone()
    };
    frames
        .send(vec![
            Frame::new(6, Op::Acquire as u8, &outside),
            Frame::new(7, Op::Acquire as u8, &inside),
        ])
        .await;
    let replies = frames.replies(2).await;
    let denied = frame_error(&replies[&6]);
    assert_eq!(denied.code, "permission_denied");
    assert_eq!(
        denied.details.get("key").map(String::as_str),
        Some("payments/x")
    );
    assert!(frame_ok::<pb::AcquireResponse>(&replies[&7]).fence > 0);
}

#[tokio::test]
async fn bad_input_to_the_auth_api_is_refused_and_changes_nothing() {
    let server = Leaseholdd::start();
    let addr = server.addr.as_str();
    let root = enable(addr).await;
    let jobs = jobs_token(addr, &root).await;
    let (_, before) = call("GET", addr, "/v1/auth", Some(&root), None).await;
    let r = Some(root.as_str());
    let refusals: Vec<(&str, String, Option<Value>, u16)> = vec![
        ("POST", "/v1/auth/enable".into(), None, 400),
        (
            "PUT",
            "/v1/auth/roles/x".into(),
            Some(json!({ "rules": [{ "prefix": "a", "permission": "write" }] })),
            400,
        ),
        (
            "PUT",
            "/v1/auth/roles/x".into(),
            Some(
                json!({ "rules": [{ "prefix": "a", "permission": "read" }, { "prefix": "a", "permission": "lock" }] }),
            ),
            400,
        ),
        (
            "PUT",
            "/v1/auth/roles/x".into(),
            Some(json!({ "rules": "all" })),
            400,
        ),
        (
            "PUT",
            "/v1/auth/roles/x".into(),
            Some(json!({ "rules": [], "extra": 1 })),
            400,
        ),
        (
            "PUT",
            "/v1/auth/roles/x".into(),
            Some(json!({ "rules": [{ "prefix": "a".repeat(600), "permission": "read" }] })),
            400,
        ),
        (
            "PUT",
            format!("/v1/auth/roles/{}", "n".repeat(200)),
            Some(json!({ "rules": [] })),
            400,
        ),
        (
            "POST",
            "/v1/auth/tokens".into(),
            Some(json!({ "name": "t", "role": "missing" })),
            400,
        ),
        (
            "POST",
            "/v1/auth/tokens".into(),
            Some(json!({ "name": "", "role": "jobs" })),
            400,
        ),
        (
            "POST",
            "/v1/auth/tokens".into(),
            Some(json!({ "role": "jobs" })),
            400,
        ),
        ("DELETE", "/v1/auth/tokens/99".into(), None, 400),
        ("DELETE", "/v1/auth/tokens/abc".into(), None, 400),
        ("DELETE", "/v1/auth/roles/jobs".into(), None, 400),
        ("DELETE", "/v1/auth/roles/nobody".into(), None, 400),
        // The only token with admin on every key cannot go.
        ("DELETE", "/v1/auth/tokens/1".into(), None, 400),
        (
            "PUT",
            "/v1/auth/roles/root".into(),
            Some(json!({ "rules": [{ "prefix": "", "permission": "read" }] })),
            400,
        ),
    ];
    for (method, path, body, want) in refusals {
        let (status, answer) = call(method, addr, &path, r, body.clone()).await;
        assert_eq!(status, want, "{method} {path} {body:?}: {answer}");
        assert!(answer["error"]["message"].is_string(), "{answer}");
    }
    // Headers that are not `Bearer <token>`.
    for header in ["Basic cm9vdDpyb290", "Bearer", "lh_1_abc"] {
        let r = reqwest::Client::new()
            .get(format!("http://{addr}/v1/locks"))
            .header("authorization", header)
            .send()
            .await
            .expect("send");
        assert_eq!(r.status().as_u16(), 401, "{header}");
    }
    // The jobs token's auth changes are refused before anything else.
    let (status, _) = call("DELETE", addr, "/v1/auth/tokens/1", Some(&jobs), None).await;
    assert_eq!(status, 403);
    let (_, after) = call("GET", addr, "/v1/auth", Some(&root), None).await;
    assert_eq!(before, after, "a refused change changed auth");
}

/// Each node's answer to a describe with `token`: its code.
async fn answers(cluster: &Cluster, token: &str) -> Vec<String> {
    let mut out = Vec::new();
    for node in &cluster.nodes {
        let mut c = grpc_as(node.url(), token).await;
        let answer = c
            .describe_lock(pb::DescribeLockRequest {
                key: "jobs/a".into(),
            })
            .await;
        out.push(answer.map_or_else(|s| code(&s), |_| "ok".to_string()));
    }
    out
}

#[tokio::test]
async fn a_revoked_token_is_refused_on_every_node_and_auth_survives_restarts() {
    let _one = common::serial().await;
    let mut cluster = Cluster::start(3);
    let leader = cluster.wait_leader();
    let addr = cluster.nodes[leader].addr.clone();
    let root = enable(&addr).await;
    let jobs = jobs_token(&addr, &root).await;
    let (status, _) = acquire(&addr, Some(&jobs), "jobs/a").await;
    assert_eq!(status, 200);

    let (status, _) = call("DELETE", &addr, "/v1/auth/tokens/2", Some(&root), None).await;
    assert_eq!(status, 200);
    // At once: the leader refuses it, and no node acts for it (a follower
    // that has not applied the revocation yet sends it to the leader).
    let now = answers(&cluster, &jobs).await;
    assert_eq!(now[leader], "unauthenticated", "{now:?}");
    assert!(
        now.iter()
            .all(|c| c == "unauthenticated" || c == "not_leader"),
        "{now:?}"
    );
    // Within a heartbeat or so every node has applied it.
    let start = Instant::now();
    loop {
        let all = answers(&cluster, &jobs).await;
        if all.iter().all(|c| c == "unauthenticated") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "{all:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, _) = acquire(&addr, Some(&jobs), "jobs/b").await;
    assert_eq!(status, 401);

    // Every node killed and restarted: auth is still on, root still works,
    // the revoked token is still refused, the role is still there.
    for i in 0..3 {
        cluster.kill(i);
    }
    for i in 0..3 {
        cluster.restart(i);
    }
    let leader = cluster.wait_leader();
    let addr = cluster.nodes[leader].addr.clone();
    let (status, state) = call("GET", &addr, "/v1/auth", Some(&root), None).await;
    assert_eq!(status, 200, "{state}");
    assert_eq!(state["enabled"], true);
    assert!(state["roles"]
        .as_array()
        .expect("roles")
        .iter()
        .any(|r| r["name"] == "jobs"));
    let whats: Vec<&str> = state["audit"]
        .as_array()
        .expect("audit")
        .iter()
        .filter_map(|a| a["what"].as_str())
        .collect();
    assert!(
        whats.iter().any(|w| w.contains("token 2 \"jobs\" revoked")),
        "{whats:?}"
    );
    assert_eq!(acquire(&addr, Some(&jobs), "jobs/c").await.0, 401);
    assert_eq!(acquire(&addr, None, "jobs/c").await.0, 401);
    assert_eq!(acquire(&addr, Some(&root), "jobs/c").await.0, 200);
}

/// A describe over HTTP from `source` (an address on this machine).
async fn describe_from(source: &str, addr: &str, token: Option<&str>) -> (u16, Value) {
    let client = reqwest::Client::builder()
        .local_address(source.parse::<std::net::IpAddr>().expect("ip"))
        .build()
        .expect("client");
    let mut request = client.get(format!("http://{addr}/v1/locks/jobs/a"));
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let r = request.send().await.expect("send");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn require_auth_serves_only_this_machine_until_auth_is_on() {
    let server = Leaseholdd::start_with(&["--require-auth"]);
    let addr = server.addr.as_str();
    // 127.0.0.2 stands for another machine: it is not the address it
    // connects to (127.0.0.1).
    let (status, body) = describe_from("127.0.0.2", addr, None).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("leasehold auth enable")),
        "{body}"
    );
    let (status, _) = describe_from("127.0.0.1", addr, None).await;
    assert_eq!(status, 200);
    // Turning auth on from elsewhere is refused too; from here it works.
    let r = reqwest::Client::builder()
        .local_address("127.0.0.2".parse::<std::net::IpAddr>().expect("ip"))
        .build()
        .expect("client")
        .post(format!("http://{addr}/v1/auth/enable"))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 401);
    let root = enable(addr).await;
    let (status, _) = describe_from("127.0.0.2", addr, Some(&root)).await;
    assert_eq!(status, 200);
    let (status, _) = describe_from("127.0.0.1", addr, None).await;
    assert_eq!(status, 401);
}

/// `auth enable` or a token creation whose answer was lost is sent again
/// with the same secret: answered with the same token, nothing made twice.
#[tokio::test]
async fn a_token_request_sent_again_with_its_secret_makes_one_token() {
    let server = Leaseholdd::start();
    let addr = server.addr.as_str();
    let secret = "0123456789abcdef0123456789abcdef";
    let enable = json!({ "secret": secret });
    let (status, first) = call("POST", addr, "/v1/auth/enable", None, Some(enable.clone())).await;
    assert_eq!(status, 200, "{first}");
    let (status, again) = call("POST", addr, "/v1/auth/enable", None, Some(enable)).await;
    assert_eq!((status, &again), (200, &first));
    let root = first["token"].as_str().expect("root").to_string();
    assert!(root.ends_with(secret), "{root}");
    // Another secret, with no token: refused as anyone's call is now; with
    // the root token: auth is on already.
    let other = json!({ "secret": "f".repeat(32) });
    let path = "/v1/auth/enable";
    assert_eq!(
        call("POST", addr, path, None, Some(other.clone())).await.0,
        401
    );
    assert_eq!(
        call("POST", addr, path, Some(&root), Some(other)).await.0,
        400
    );

    let made = json!({ "name": "ci", "role": "root", "secret": "s".repeat(40) });
    let (_, one) = call(
        "POST",
        addr,
        "/v1/auth/tokens",
        Some(&root),
        Some(made.clone()),
    )
    .await;
    let (_, two) = call("POST", addr, "/v1/auth/tokens", Some(&root), Some(made)).await;
    assert_eq!(one, two);
    let (_, state) = call("GET", addr, "/v1/auth", Some(&root), None).await;
    assert_eq!(state["tokens"].as_array().map(Vec::len), Some(2), "{state}");
    // Secrets that are too short or carry other characters are refused.
    for bad in ["short", "has spaces in it, and more than 32 chars!"] {
        let body = json!({ "name": "x", "role": "root", "secret": bad });
        assert_eq!(
            call("POST", addr, "/v1/auth/tokens", Some(&root), Some(body))
                .await
                .0,
            400
        );
    }
}

/// An HTTP watch whose token is revoked ends with an `error` event whose
/// data is the JSON error body every other refusal has.
#[tokio::test]
async fn a_watch_ended_by_a_revoked_token_says_why_in_json() {
    let server = Leaseholdd::start();
    let addr = server.addr.as_str();
    let root = enable(addr).await;
    let jobs = jobs_token(addr, &root).await;
    let watch = common::RawWatch::open(addr, "/v1/watch?prefix=jobs/", Some(&jobs)).await;
    let (status, body) = call("DELETE", addr, "/v1/auth/tokens/2", Some(&root), None).await;
    assert_eq!(status, 200, "{body}");
    let error = watch.error().await;
    assert_eq!(error["error"]["code"], "unauthenticated", "{error}");
    assert!(error["error"]["message"].is_string(), "{error}");
}
