//! The wire's small print: every HTTP error is the documented JSON body, a
//! body is exactly one JSON value, limits are the same on every route, an
//! undecodable gRPC message is the caller's fault, one lease has one answer,
//! a restart logs no error, and `/metrics` follows Prometheus naming.

mod common;

use leasehold_testkit::Leaseholdd;
use serde_json::{json, Value};

async fn request(method: reqwest::Method, url: String, body: Option<&str>) -> (u16, String, Value) {
    let mut r = reqwest::Client::new().request(method, url);
    if let Some(b) = body {
        r = r
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let response = r.send().await.expect("send");
    let status = response.status().as_u16();
    let kind = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let text = response.text().await.expect("body");
    let v = serde_json::from_str(&text).unwrap_or_else(|_| json!({ "not json": text }));
    (status, kind, v)
}

fn assert_json_error(what: &str, got: (u16, String, Value), status: u16, code: &str) {
    let (s, kind, body) = got;
    assert_eq!(s, status, "{what}: {body}");
    assert!(
        kind.starts_with("application/json"),
        "{what}: content-type {kind:?}"
    );
    assert_eq!(body["error"]["code"], code, "{what}: {body}");
    assert!(body["error"]["message"].is_string(), "{what}: {body}");
}

#[tokio::test]
async fn every_http_error_is_a_json_body() {
    let server = Leaseholdd::start();
    let url = |p: &str| format!("{}{p}", server.url());
    use reqwest::Method;
    assert_json_error(
        "unknown path",
        request(Method::POST, url("/v1/lock/x"), Some("{}")).await,
        404,
        "not_found",
    );
    assert_json_error(
        "unknown GET",
        request(Method::GET, url("/nope"), None).await,
        404,
        "not_found",
    );
    assert_json_error(
        "wrong method",
        request(Method::DELETE, url("/v1/acquire"), None).await,
        405,
        "method_not_allowed",
    );
    assert_json_error(
        "undecodable path",
        request(Method::GET, url("/v1/locks/%FF"), None).await,
        400,
        "invalid_argument",
    );
    assert_json_error(
        "not a lease id",
        request(Method::GET, url("/v1/leases/abc"), None).await,
        400,
        "invalid_argument",
    );
    assert_json_error(
        "trailing bytes",
        request(
            Method::POST,
            url("/v1/leases"),
            Some(r#"{"ttl_ms":30000}]"#),
        )
        .await,
        400,
        "invalid_argument",
    );
    assert_json_error(
        "two values",
        request(
            Method::POST,
            url("/v1/leases"),
            Some(r#"{"ttl_ms":30000}{"ttl_ms":1}"#),
        )
        .await,
        400,
        "invalid_argument",
    );
    let (_, _, leases) = request(Method::GET, url("/v1/leases"), None).await;
    assert_eq!(
        leases["leases"],
        json!([]),
        "a refused body granted nothing"
    );
    // A body without a content type is still JSON.
    let response = reqwest::Client::new()
        .post(url("/v1/leases"))
        .body(r#"{"ttl_ms":30000}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);

    // One prefix limit for lists and watches.
    let long = "p".repeat(10_000);
    assert_json_error(
        "long list prefix",
        request(Method::GET, url(&format!("/v1/locks?prefix={long}")), None).await,
        400,
        "invalid_argument",
    );
    assert_json_error(
        "long watch prefix",
        request(Method::GET, url(&format!("/v1/watch?prefix={long}")), None).await,
        400,
        "invalid_argument",
    );
}

/// A lease that ended gets one answer, whoever asks.
#[tokio::test]
async fn a_revoked_lease_gets_one_answer_everywhere() {
    let server = Leaseholdd::start();
    let url = |p: &str| format!("{}{p}", server.url());
    use reqwest::Method;
    let (_, _, lease) = request(Method::POST, url("/v1/leases"), Some(r#"{"ttl_ms":30000}"#)).await;
    let id = lease["lease"].as_u64().unwrap();
    request(Method::DELETE, url(&format!("/v1/leases/{id}")), None).await;
    let keepalive = request(
        Method::POST,
        url(&format!("/v1/leases/{id}/keepalive")),
        None,
    )
    .await;
    let describe = request(Method::GET, url(&format!("/v1/leases/{id}")), None).await;
    assert_json_error("keepalive", keepalive, 410, "lease_expired");
    assert_json_error("describe", describe, 410, "lease_expired");
    let never = request(Method::GET, url("/v1/leases/999999"), None).await;
    assert_json_error("never granted", never, 404, "lease_not_found");

    let mut c = common::grpc(&server).await;
    let status = c
        .describe_lease(leasehold_proto::v1::DescribeLeaseRequest { lease_id: id })
        .await
        .unwrap_err();
    assert_eq!(common::code(&status), "lease_expired");
}

/// Bytes that are not a protobuf message: `INVALID_ARGUMENT`, not `INTERNAL`.
/// A method the server does not have: `UNIMPLEMENTED`.
#[tokio::test]
async fn undecodable_grpc_messages_are_invalid_arguments() {
    use bytes::{Buf, BufMut};
    use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

    #[derive(Default)]
    struct Raw;
    impl Codec for Raw {
        type Encode = Vec<u8>;
        type Decode = Vec<u8>;
        type Encoder = Raw;
        type Decoder = Raw;
        fn encoder(&mut self) -> Raw {
            Raw
        }
        fn decoder(&mut self) -> Raw {
            Raw
        }
    }
    impl Encoder for Raw {
        type Item = Vec<u8>;
        type Error = tonic::Status;
        fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
            dst.put_slice(&item);
            Ok(())
        }
    }
    impl Decoder for Raw {
        type Item = Vec<u8>;
        type Error = tonic::Status;
        fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
            let v = src.chunk().to_vec();
            src.advance(v.len());
            Ok(Some(v))
        }
    }

    let server = Leaseholdd::start();
    let channel = tonic::transport::Channel::from_shared(server.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    let call = |path: &'static str| {
        let mut grpc = grpc.clone();
        async move {
            grpc.ready().await.unwrap();
            grpc.unary(
                tonic::Request::new(vec![0xff, 0xff, 0xff]),
                axum::http::uri::PathAndQuery::from_static(path),
                Raw,
            )
            .await
        }
    };
    let status = call("/leasehold.v1.Leasehold/Acquire").await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert_eq!(common::code(&status), "invalid_argument");
    let status = call("/leasehold.v1.Leasehold/NoSuchMethod")
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unimplemented, "{status:?}");
    grpc.ready().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_logs_no_error() {
    let mut server = Leaseholdd::start();
    server.crash_and_restart();
    server.process.terminate();
    let log = server.process.output();
    assert!(!log.contains("ERROR"), "{log}");
}

#[tokio::test]
async fn metrics_follow_prometheus_naming() {
    let server = Leaseholdd::start();
    let url = |p: &str| format!("{}{p}", server.url());
    use reqwest::Method;
    request(
        Method::POST,
        url("/v1/acquire"),
        Some(r#"{"key":"m","ttl_ms":30000}"#),
    )
    .await;
    request(
        Method::POST,
        url("/v1/acquire"),
        Some(r#"{"key":"m","ttl_ms":30000}"#),
    )
    .await;
    let text = reqwest::get(url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        r#"leasehold_requests_total{op="acquire",code="ok"} 1"#,
        r#"leasehold_requests_total{op="acquire",code="held"} 1"#,
        r#"leasehold_lock_events_total{kind="acquired"} 1"#,
        "leasehold_locks_held 1",
        "leasehold_leases 1",
        "leasehold_is_leader 1",
        "# EOF",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    }
    assert!(
        text.contains("leasehold_request_duration_seconds_bucket{"),
        "{text}"
    );
    assert!(
        text.contains("# UNIT leasehold_table_time_seconds seconds"),
        "{text}"
    );
    // Every counter's samples end in _total; no _ms anywhere.
    let counters: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    assert!(!counters.is_empty());
    for name in counters {
        for sample in text
            .lines()
            .filter(|l| !l.starts_with('#') && l.starts_with(name))
        {
            assert!(
                sample.starts_with(&format!("{name}_total")),
                "counter sample without _total: {sample}"
            );
        }
    }
    assert!(!text.contains("_ms"), "{text}");
}
