//! Helpers shared by the integration tests: short names for the calls every
//! test makes.
#![allow(dead_code)]

use leasehold_proto::v1 as pb;
use leasehold_testkit::Leaseholdd;
use pb::leasehold_client::LeaseholdClient;
use tonic::transport::Channel;

pub type Grpc = LeaseholdClient<Channel>;

pub async fn grpc(server: &Leaseholdd) -> Grpc {
    LeaseholdClient::connect(server.url())
        .await
        .expect("connect gRPC")
}

/// Grants a lease and returns its id.
pub async fn lease(c: &mut Grpc, ttl_ms: u64, holder: &str) -> u64 {
    c.grant(pb::GrantRequest {
        ttl_ms,
        holder: holder.into(),
        ..Default::default()
    })
    .await
    .expect("grant")
    .into_inner()
    .lease_id
}

/// Takes `key` under `lease` at once and returns the fencing token.
pub async fn take(c: &mut Grpc, lease: u64, key: &str) -> u64 {
    c.acquire(pb::AcquireRequest {
        lease_id: lease,
        key: key.into(),
        ..Default::default()
    })
    .await
    .expect("acquire")
    .into_inner()
    .fence
}

/// The lock as the server describes it.
pub async fn describe(c: &mut Grpc, key: &str) -> pb::LockInfo {
    c.describe_lock(pb::DescribeLockRequest { key: key.into() })
        .await
        .expect("describe")
        .into_inner()
}

/// The code in a status's `leasehold-code` metadata.
pub fn code(status: &tonic::Status) -> String {
    status
        .metadata()
        .get("leasehold-code")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

/// A bare framed-protocol connection: frames go out exactly as given.
pub struct RawFrames {
    pub write: tokio::net::tcp::OwnedWriteHalf,
    pub read: tokio_util::codec::FramedRead<
        tokio::net::tcp::OwnedReadHalf,
        leasehold_proto::frame::FrameCodec,
    >,
}

impl RawFrames {
    /// Connects and sends the preamble.
    pub async fn connect(server: &Leaseholdd) -> RawFrames {
        use tokio::io::AsyncWriteExt;
        let addr = server.url().trim_start_matches("http://").to_string();
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (read, mut write) = stream.into_split();
        write
            .write_all(leasehold_proto::frame::PREAMBLE)
            .await
            .expect("preamble");
        RawFrames {
            write,
            read: tokio_util::codec::FramedRead::new(
                read,
                leasehold_proto::frame::FrameCodec::replies(),
            ),
        }
    }

    /// Sends `frames` in one write.
    pub async fn send(&mut self, frames: Vec<leasehold_proto::frame::Frame>) {
        use tokio::io::AsyncWriteExt;
        use tokio_util::codec::Encoder;
        let mut out = bytes::BytesMut::new();
        for f in frames {
            leasehold_proto::frame::FrameCodec::requests()
                .encode(f, &mut out)
                .expect("encode");
        }
        self.write.write_all(&out).await.expect("send");
    }

    /// The next reply, or `None` once the server closed the connection.
    pub async fn next(&mut self) -> Option<leasehold_proto::frame::Frame> {
        use futures::StreamExt;
        match tokio::time::timeout(std::time::Duration::from_secs(10), self.read.next()).await {
            Ok(Some(Ok(f))) => Some(f),
            Ok(_) => None,
            Err(_) => panic!("no reply within 10 s"),
        }
    }

    /// Replies to `n` requests, by id.
    pub async fn replies(
        &mut self,
        n: usize,
    ) -> std::collections::HashMap<u64, leasehold_proto::frame::Frame> {
        let mut out = std::collections::HashMap::new();
        while out.len() < n {
            let f = self.next().await.expect("a reply");
            out.insert(f.id, f);
        }
        out
    }
}

/// A reply's error, decoded; panics on a success.
pub fn frame_error(frame: &leasehold_proto::frame::Frame) -> pb::ErrorReply {
    use prost::Message;
    assert_eq!(
        frame.tag,
        leasehold_proto::frame::REPLY_ERROR,
        "expected an error reply"
    );
    pb::ErrorReply::decode(frame.body.clone()).expect("error reply")
}

/// A reply's message, decoded; panics on an error.
pub fn frame_ok<M: prost::Message + Default>(frame: &leasehold_proto::frame::Frame) -> M {
    assert_eq!(
        frame.tag,
        leasehold_proto::frame::REPLY_OK,
        "expected success, got {:?}",
        frame_error(frame)
    );
    M::decode(frame.body.clone()).expect("reply")
}

/// POSTs `body` as JSON to `addr` (`host:port`); the status and the JSON answer.
pub async fn post(addr: &str, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let r = reqwest::Client::new()
        .post(format!("http://{addr}{path}"))
        .json(&body)
        .send()
        .await
        .expect("send");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(serde_json::Value::Null))
}

/// One HTTP call to `addr` as `token`: the status and the JSON answer.
pub async fn call(
    method: &str,
    addr: &str,
    path: &str,
    token: Option<&str>,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
    let mut request = reqwest::Client::new().request(method, format!("http://{addr}{path}"));
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    if let Some(b) = body {
        request = request.json(&b);
    }
    let r = request.send().await.expect("send");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(serde_json::Value::Null))
}

/// One cluster at a time within a test binary: three to five servers are
/// all two cores take.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

/// A watch read over a plain HTTP/1.1 connection, to see how it ends.
pub struct RawWatch {
    stream: tokio::net::TcpStream,
    seen: String,
}

impl RawWatch {
    /// Opens `path` (`/v1/watch?...`) on `addr`, with `bearer` if given,
    /// and reads until its headers are in: the watch is then registered.
    pub async fn open(addr: &str, path: &str, bearer: Option<&str>) -> RawWatch {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let auth = bearer.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n");
        stream.write_all(request.as_bytes()).await.expect("send");
        let mut seen = String::new();
        let mut buf = [0u8; 65536];
        while !seen.contains("\r\n\r\n") {
            let n = stream.read(&mut buf).await.expect("read");
            assert!(n > 0, "closed early: {seen}");
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
        RawWatch { stream, seen }
    }

    /// The data of the `error` event the watch ends with, as JSON.
    pub async fn error(mut self) -> serde_json::Value {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 65536];
        let data = tokio::time::timeout(std::time::Duration::from_secs(20), async {
            loop {
                if let Some(event) = self.seen.split("event: error\n").nth(1) {
                    if let Some(line) = event.lines().find(|l| l.starts_with("data: ")) {
                        return line["data: ".len()..].to_string();
                    }
                }
                let n = self.stream.read(&mut buf).await.expect("read");
                assert!(n > 0, "closed without an error event");
                self.seen.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
        .await
        .expect("an error event");
        serde_json::from_str(&data).expect("JSON error data")
    }
}

/// A watch over HTTP (server-sent events), read event by event.
pub struct SseWatch {
    response: reqwest::Response,
    buffered: String,
}

impl SseWatch {
    /// Opens `path` (`/v1/watch?...`) on `addr` with extra `headers`; the
    /// status and JSON body of a refusal.
    pub async fn open(
        addr: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<SseWatch, (u16, serde_json::Value)> {
        let mut request = reqwest::Client::new().get(format!("http://{addr}{path}"));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.expect("send");
        let status = response.status().as_u16();
        if status != 200 {
            let body = response.json().await.expect("a JSON error body");
            return Err((status, body));
        }
        Ok(SseWatch {
            response,
            buffered: String::new(),
        })
    }

    /// The next `n` events: each one's id and its data as JSON (an `error`
    /// event's too, with the id empty).
    pub async fn events(&mut self, n: usize) -> Vec<(String, serde_json::Value)> {
        let mut out = Vec::new();
        tokio::time::timeout(std::time::Duration::from_secs(20), async {
            while out.len() < n {
                if let Some(end) = self.buffered.find("\n\n") {
                    let block: String = self.buffered.drain(..end + 2).collect();
                    let mut id = None;
                    let mut data = None;
                    for line in block.lines() {
                        if let Some(v) = line.strip_prefix("id: ") {
                            id = Some(v.to_string());
                        } else if let Some(v) = line.strip_prefix("data: ") {
                            data = Some(serde_json::from_str(v).expect("JSON data"));
                        }
                    }
                    // A keep-alive comment has no data.
                    if let Some(data) = data {
                        out.push((id.unwrap_or_default(), data));
                    }
                    continue;
                }
                let chunk = self.response.chunk().await.expect("read");
                let chunk = chunk.unwrap_or_else(|| panic!("ended after {} events", out.len()));
                self.buffered.push_str(&String::from_utf8_lossy(&chunk));
            }
        })
        .await
        .expect("the events within 20 s");
        out
    }
}
