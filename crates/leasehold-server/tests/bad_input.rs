//! Bad input gets a clear, typed error and changes nothing, over gRPC, HTTP
//! and the framed protocol.

mod common;

use leasehold_proto::v1 as pb;
use leasehold_testkit::Leaseholdd;
use serde_json::{json, Value};
use tonic::Code;

/// Drops the fields that change with the passing of time alone.
fn timeless(mut v: Value) -> Value {
    match &mut v {
        Value::Object(map) => {
            map.remove("ttl_left_ms");
            for x in map.values_mut() {
                *x = timeless(x.take());
            }
        }
        Value::Array(items) => {
            for x in items.iter_mut() {
                *x = timeless(x.take());
            }
        }
        _ => {}
    }
    v
}

/// What must not change: the locks, the leases, the next token.
async fn state(server: &Leaseholdd) -> (Value, Value, String) {
    let locks = timeless(
        reqwest::get(format!("{}/v1/locks", server.url()))
            .await
            .unwrap()
            .json()
            .await
            .unwrap(),
    );
    let leases = timeless(
        reqwest::get(format!("{}/v1/leases", server.url()))
            .await
            .unwrap()
            .json()
            .await
            .unwrap(),
    );
    let metrics: String = reqwest::get(format!("{}/metrics", server.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let fence = metrics
        .lines()
        .find(|l| l.starts_with("leasehold_fence_next"))
        .unwrap_or("")
        .to_string();
    (locks, leases, fence)
}

#[tokio::test]
async fn grpc_rejects_bad_input_with_typed_errors() {
    let server = Leaseholdd::start();
    let mut c = common::grpc(&server).await;
    let lease = common::lease(&mut c, 60_000, "h").await;
    let fence = common::take(&mut c, lease, "held").await;
    let before = state(&server).await;

    let acq = |key: &str| pb::AcquireRequest {
        lease_id: lease,
        key: key.into(),
        ..Default::default()
    };
    let cases: Vec<(&str, Result<(), tonic::Status>, Code, &str)> = vec![
        (
            "empty key",
            c.acquire(acq("")).await.map(drop),
            Code::InvalidArgument,
            "invalid_argument",
        ),
        (
            "513-byte key",
            c.acquire(acq(&"k".repeat(513))).await.map(drop),
            Code::InvalidArgument,
            "invalid_argument",
        ),
        (
            "control char in key",
            c.acquire(acq("a\u{0}b")).await.map(drop),
            Code::InvalidArgument,
            "invalid_argument",
        ),
        (
            "ttl 0",
            c.grant(pb::GrantRequest {
                ttl_ms: 0,
                holder: String::new(),
                ..Default::default()
            })
            .await
            .map(drop),
            Code::InvalidArgument,
            "invalid_argument",
        ),
        (
            "ttl over the maximum",
            c.grant(pb::GrantRequest {
                ttl_ms: 24 * 3600 * 1000 + 1,
                holder: String::new(),
                ..Default::default()
            })
            .await
            .map(drop),
            Code::InvalidArgument,
            "invalid_argument",
        ),
        (
            "holder too long",
            c.grant(pb::GrantRequest {
                ttl_ms: 1000,
                holder: "h".repeat(257),
                ..Default::default()
            })
            .await
            .map(drop),
            Code::InvalidArgument,
            "invalid_argument",
        ),
        (
            "unknown lease",
            c.acquire(pb::AcquireRequest {
                lease_id: 9_999,
                key: "x".into(),
                ..Default::default()
            })
            .await
            .map(drop),
            Code::NotFound,
            "lease_not_found",
        ),
        (
            "renew unknown lease",
            c.keep_alive(pb::KeepAliveRequest { lease_id: 9_999 })
                .await
                .map(drop),
            Code::NotFound,
            "lease_not_found",
        ),
        (
            "stale token",
            c.release(pb::ReleaseRequest {
                key: "held".into(),
                fence: fence + 100,
                request_id: 0,
            })
            .await
            .map(drop),
            Code::FailedPrecondition,
            "stale_fence",
        ),
        (
            "checkpoint over 64 KiB",
            c.save_checkpoint(pb::SaveCheckpointRequest {
                key: "held".into(),
                fence,
                data: vec![0; 64 * 1024 + 1],
            })
            .await
            .map(drop),
            Code::InvalidArgument,
            "invalid_argument",
        ),
        (
            "wait over the maximum",
            c.acquire(pb::AcquireRequest {
                lease_id: lease,
                key: "x".into(),
                wait_ms: u64::MAX,
                ..Default::default()
            })
            .await
            .map(drop),
            Code::InvalidArgument,
            "invalid_argument",
        ),
        (
            "lock-delay over the maximum",
            c.acquire(pb::AcquireRequest {
                lease_id: lease,
                key: "x".into(),
                lock_delay_ms: 61_000,
                ..Default::default()
            })
            .await
            .map(drop),
            Code::InvalidArgument,
            "invalid_argument",
        ),
        (
            "describe unknown lease",
            c.describe_lease(pb::DescribeLeaseRequest { lease_id: 0 })
                .await
                .map(drop),
            Code::NotFound,
            "lease_not_found",
        ),
        (
            "list after a huge key",
            c.list_locks(pb::ListLocksRequest {
                prefix: String::new(),
                limit: 1,
                start_after: "k".repeat(600),
                held_only: false,
            })
            .await
            .map(drop),
            Code::InvalidArgument,
            "invalid_argument",
        ),
        (
            "list with a huge prefix",
            c.list_locks(pb::ListLocksRequest {
                prefix: "p".repeat(600),
                limit: 1,
                start_after: String::new(),
                held_only: false,
            })
            .await
            .map(drop),
            Code::InvalidArgument,
            "invalid_argument",
        ),
    ];
    // Refused by tonic before the call reaches us: still with its code.
    let oversized = c
        .save_checkpoint(pb::SaveCheckpointRequest {
            key: "held".into(),
            fence,
            data: vec![0; 5 << 20],
        })
        .await
        .map(drop);
    let mut cases = cases;
    cases.push((
        "a message over the size limit",
        oversized,
        Code::OutOfRange,
        "invalid_argument",
    ));
    for (what, result, grpc_code, wire_code) in cases {
        let err = result.expect_err(what);
        assert_eq!(err.code(), grpc_code, "{what}: {err:?}");
        assert_eq!(common::code(&err), wire_code, "{what}");
        assert!(!err.message().is_empty(), "{what}: no message");
    }
    assert_eq!(state(&server).await, before, "bad input changed state");
    assert!(server.process.pid().is_some());
    c.keep_alive(pb::KeepAliveRequest { lease_id: lease })
        .await
        .expect("server still serves");
}

#[tokio::test]
async fn http_rejects_bad_input_with_typed_errors() {
    let server = Leaseholdd::start();
    let http = reqwest::Client::new();
    let url = |p: &str| format!("{}{p}", server.url());
    let r: Value = http
        .post(url("/v1/acquire"))
        .json(&json!({"key": "held", "ttl_ms": 60000}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let (lease, fence) = (r["lease"].as_u64().unwrap(), r["fence"].as_u64().unwrap());
    let before = state(&server).await;

    let raw = |path: &str, body: &str| {
        http.post(url(path))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    let cases: Vec<(&str, reqwest::Response, u16, &str)> = vec![
        (
            "malformed JSON",
            raw("/v1/acquire", "{\"key\": ").await.unwrap(),
            400,
            "invalid_argument",
        ),
        (
            "not JSON at all",
            raw("/v1/release", "release it").await.unwrap(),
            400,
            "invalid_argument",
        ),
        (
            "unknown field",
            raw("/v1/release", r#"{"key":"held","fence":1,"force":true}"#)
                .await
                .unwrap(),
            400,
            "invalid_argument",
        ),
        (
            "wrong type",
            raw("/v1/release", r#"{"key":"held","fence":"one"}"#)
                .await
                .unwrap(),
            400,
            "invalid_argument",
        ),
        (
            "negative number",
            raw("/v1/leases", r#"{"ttl_ms":-5}"#).await.unwrap(),
            400,
            "invalid_argument",
        ),
        (
            "empty key",
            raw("/v1/acquire", r#"{"key":"","ttl_ms":1000}"#)
                .await
                .unwrap(),
            400,
            "invalid_argument",
        ),
        (
            "long key",
            raw(
                "/v1/acquire",
                &format!(r#"{{"key":"{}","ttl_ms":1000}}"#, "k".repeat(513)),
            )
            .await
            .unwrap(),
            400,
            "invalid_argument",
        ),
        (
            "ttl 0",
            raw("/v1/leases", r#"{"ttl_ms":0}"#).await.unwrap(),
            400,
            "invalid_argument",
        ),
        (
            "ttl too long",
            raw("/v1/leases", r#"{"ttl_ms":86400001}"#).await.unwrap(),
            400,
            "invalid_argument",
        ),
        (
            "lease and ttl both",
            raw(
                "/v1/acquire",
                &format!(r#"{{"key":"x","lease":{lease},"ttl_ms":5}}"#),
            )
            .await
            .unwrap(),
            400,
            "invalid_argument",
        ),
        (
            "neither lease nor ttl",
            raw("/v1/acquire", r#"{"key":"x"}"#).await.unwrap(),
            400,
            "invalid_argument",
        ),
        (
            "unknown lease",
            raw("/v1/acquire", r#"{"key":"x","lease":9999}"#)
                .await
                .unwrap(),
            404,
            "lease_not_found",
        ),
        (
            "renew unknown lease",
            raw("/v1/leases/9999/keepalive", "").await.unwrap(),
            404,
            "lease_not_found",
        ),
        (
            "lease id not a number",
            raw("/v1/leases/abc/keepalive", "").await.unwrap(),
            400,
            "invalid_argument",
        ),
        (
            "stale token",
            raw(
                "/v1/release",
                &format!(r#"{{"key":"held","fence":{}}}"#, fence + 1),
            )
            .await
            .unwrap(),
            409,
            "stale_fence",
        ),
        (
            "checkpoint over 64 KiB",
            raw(
                "/v1/checkpoint",
                &format!(
                    r#"{{"key":"held","fence":{fence},"data":"{}"}}"#,
                    "x".repeat(64 * 1024 + 1)
                ),
            )
            .await
            .unwrap(),
            400,
            "invalid_argument",
        ),
        (
            "bad base64",
            raw(
                "/v1/checkpoint",
                &format!(r#"{{"key":"held","fence":{fence},"data_base64":"%%%"}}"#),
            )
            .await
            .unwrap(),
            400,
            "invalid_argument",
        ),
        (
            "unknown query parameter",
            http.get(url("/v1/locks?prefx=a")).send().await.unwrap(),
            400,
            "invalid_argument",
        ),
    ];
    for (what, response, status, wire_code) in cases {
        assert_eq!(response.status().as_u16(), status, "{what}");
        let body: Value = response.json().await.unwrap_or(Value::Null);
        assert_eq!(body["error"]["code"], wire_code, "{what}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{what}: {body}"
        );
    }
    // Requests hyper refuses before any route sees them still get the
    // JSON error body.
    for encoding in ["xchunked", "chunked, identity"] {
        let request = format!(
            "POST /v1/acquire HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: {encoding}\r\n\r\n0\r\n\r\n"
        );
        let (status, body) = raw_http(&server.addr, &request);
        assert_eq!(status, 400, "Transfer-Encoding: {encoding}");
        assert_eq!(
            body["error"]["code"], "invalid_argument",
            "{encoding}: {body}"
        );
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("Transfer-Encoding")),
            "{body}"
        );
    }
    let huge = format!(
        "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(600 * 1024)
    );
    let (status, body) = raw_http(&server.addr, &huge);
    assert_eq!(status, 431);
    assert_eq!(body["error"]["code"], "invalid_argument", "{body}");
    assert_eq!(state(&server).await, before, "bad input changed state");
}

/// Sends `request` as it is and reads the answer to the end (the server
/// closes a connection whose request it could not parse): the status and
/// the JSON body (`Null` if it is not JSON).
fn raw_http(addr: &str, request: &str) -> (u16, Value) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    // The server may answer and close before it reads everything.
    let _ = s.write_all(request.as_bytes());
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    (status, body)
}

#[tokio::test]
async fn frames_reject_bad_input_with_typed_errors() {
    use leasehold_proto::frame::{Frame, Op, PREAMBLE};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let server = Leaseholdd::start();
    let mut c = common::grpc(&server).await;
    let lease = common::lease(&mut c, 60_000, "holder").await;
    let fence = common::take(&mut c, lease, "held").await;
    let before = state(&server).await;

    let mut f = common::RawFrames::connect(&server).await;
    let acquire = |key: &str, wait_ms| pb::AcquireRequest {
        lease_id: lease,
        key: key.into(),
        wait_ms,
        ..Default::default()
    };
    let ops = [
        Op::Grant,
        Op::KeepAlive,
        Op::Revoke,
        Op::Acquire,
        Op::Release,
        Op::SaveCheckpoint,
        Op::KeepAliveMany,
    ];
    // Not protobuf, for every operation (ids 11..).
    let mut cases: Vec<(&str, Frame)> = ops
        .iter()
        .zip(11..)
        .map(|(op, id)| {
            let body = bytes::Bytes::from_static(b"\xff\xff\xff\xff");
            (
                "not protobuf",
                Frame {
                    id,
                    tag: *op as u8,
                    body,
                },
            )
        })
        .collect();
    cases.extend([
        (
            "unknown operation",
            Frame {
                id: 2,
                tag: 99,
                body: bytes::Bytes::new(),
            },
        ),
        (
            "a wait, which needs a stream to withdraw",
            Frame::new(3, Op::Acquire as u8, &acquire("free", 1000)),
        ),
        (
            "empty key",
            Frame::new(4, Op::Acquire as u8, &acquire("", 0)),
        ),
        (
            "TTL out of range",
            Frame::new(
                5,
                Op::Grant as u8,
                &pb::GrantRequest {
                    ttl_ms: 1,
                    holder: String::new(),
                    ..Default::default()
                },
            ),
        ),
        (
            "more leases than one call renews",
            Frame::new(
                6,
                Op::KeepAliveMany as u8,
                &pb::KeepAliveManyRequest {
                    lease_ids: (1..=4097).collect(),
                },
            ),
        ),
    ]);
    let n = cases.len();
    f.send(cases.iter().map(|(_, frame)| frame.clone()).collect())
        .await;
    let replies = f.replies(n).await;
    for (what, frame) in &cases {
        let e = common::frame_error(&replies[&frame.id]);
        assert_eq!(e.code, "invalid_argument", "{what}: {e:?}");
        assert!(!e.message.is_empty(), "{what}");
    }
    // The Rust client knows a server from before an operation by these
    // words, and then renews one lease per call.
    let unknown = common::frame_error(&replies[&2]);
    assert!(unknown.message.starts_with("invalid op:"), "{unknown:?}");
    // A stale release is refused with both tokens.
    let stale = pb::ReleaseRequest {
        key: "held".into(),
        fence: fence - 1,
        request_id: 0,
    };
    f.send(vec![Frame::new(9, Op::Release as u8, &stale)]).await;
    let e = common::frame_error(&f.replies(1).await[&9]);
    assert_eq!(e.code, "stale_fence");
    assert_eq!(e.details["current-fence"], fence.to_string());

    // A frame longer than the limit closes that connection only.
    f.write.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    assert!(f.next().await.is_none(), "connection must close");
    // So does a wrong preamble.
    let addr = server.url().trim_start_matches("http://").to_string();
    let mut wrong = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut bad = *PREAMBLE;
    bad[7] = b'9';
    wrong.write_all(&bad).await.unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(wrong.read(&mut buf).await.unwrap_or(0), 0);

    assert_eq!(state(&server).await, before);
    assert_eq!(
        common::describe(&mut c, "held").await.holder.unwrap().fence,
        fence
    );
}

/// Without TLS and client certificates, serving beyond loopback needs
/// --insecure; the refusal is one line and exit code 2, before anything
/// binds, with no backtrace even where RUST_BACKTRACE asks for one.
#[test]
fn a_non_loopback_listen_address_needs_insecure() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = std::process::Command::new(leasehold_testkit::workspace_bin("leaseholdd"))
        .args(["--listen", "0.0.0.0:1", "--data-dir"])
        .arg(dir.path().join("data"))
        .env_remove("LEASEHOLD_INSECURE")
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("run leaseholdd");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "one line, no backtrace: {stderr}"
    );
    assert!(
        stderr.contains("refusing to listen on 0.0.0.0:1, which is not loopback, without TLS (--tls-cert, --tls-key): whoever reaches the port")
            && stderr.contains("--insecure"),
        "{stderr}"
    );
    assert!(
        !dir.path().join("data").exists(),
        "nothing was started: {stderr}"
    );
}

/// A member added at an address the cluster already has (this node's own,
/// here) is refused, and the node serves on. Found by schemathesis: the
/// leader sent appends to itself as to another node, openraft took them
/// for another leader's and stopped, and the node exited.
#[tokio::test]
async fn a_member_at_an_address_already_in_the_cluster_is_refused() {
    let server = Leaseholdd::start();
    for body in [
        json!({"id": 231, "addr": server.addr}),
        json!({"id": 0, "addr": "127.0.0.1:1"}),
    ] {
        let (status, answer) = common::call(
            "POST",
            &server.addr,
            "/v1/cluster/members",
            None,
            Some(body),
        )
        .await;
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["error"]["code"], "invalid_argument", "{answer}");
    }
    let (status, answer) = common::call("GET", &server.addr, "/health", None, None).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["leader"], true, "{answer}");
    let body = json!({"key": "still", "ttl_ms": 10_000});
    let (status, answer) =
        common::call("POST", &server.addr, "/v1/acquire", None, Some(body)).await;
    assert_eq!(status, 200, "{answer}");
}
