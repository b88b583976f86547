//! Client connections: the protocol a connection speaks, and the limits that
//! keep idle, slow or too many connections from starving everyone else.
//!
//! - A new connection has [`Limits::header_timeout`] to send its first byte,
//!   and an HTTP/1 request as long to send its headers (a slow-loris client
//!   is closed, not kept).
//! - A connection with no call in flight (an open watch or waiting acquire
//!   counts as one) is closed after [`Limits::idle_timeout`], on every
//!   protocol but a peer's framed stream of appends (`raft::transport::framed`, which
//!   lasts as long as its leader's replication session): after a polite
//!   close (HTTP/2's GOAWAY) it has [`CLOSE_GRACE`] to go, so an HTTP/2
//!   client that sent only its preface or part of a request cannot hold it
//!   open until the next ping. Clients reconnect on their next call, so
//!   this costs them nothing.
//! - An HTTP/1 request hyper cannot parse (a bad `Transfer-Encoding`,
//!   headers too large) gets the JSON error body every other answer has
//!   ([`JsonParseErrors`]), not an empty one.
//! - At most [`Limits::max_connections`] are open at once; past it a new
//!   connection is closed at once, with one log line each time the cap is
//!   reached, so open file descriptors stay below the process's limit and
//!   `/health` keeps answering once the idle ones time out.
//! - HTTP/2 connections are pinged, so a waiter whose machine vanished is
//!   found out and its wait withdrawn.
//! - On a port that speaks TLS only, a plaintext connection is answered in
//!   its own protocol with `tls_required` (an HTTP 400, a gRPC status, or a
//!   framed error with id 0) and closed, so the client can say "use
//!   https://" and knows nothing was done. Refused connections and failed
//!   handshakes are logged at WARN, at most once per [`REFUSALS_EVERY`].

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes, HttpBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tower::ServiceExt;

use crate::api::Local;
use crate::service::LockService;
use crate::tls::{ClientSubject, PeerCertificate, Tls};

/// At most one log line per this long for refused connections of a kind;
/// the line counts the ones it stands for.
pub const REFUSALS_EVERY: Duration = Duration::from_secs(10);

/// Logs refusals of one kind, at most once per [`REFUSALS_EVERY`].
struct Refusals {
    /// Since the process started, in milliseconds, when the last line went out.
    last_ms: AtomicU64,
    /// Refusals since then.
    unlogged: AtomicU64,
}

impl Refusals {
    const fn new() -> Refusals {
        Refusals {
            last_ms: AtomicU64::new(0),
            unlogged: AtomicU64::new(0),
        }
    }

    fn note(&self, from: Option<std::net::SocketAddr>, what: &str, why: &str) {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        let now = u64::try_from(START.get_or_init(Instant::now).elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let last = self.last_ms.load(Ordering::Relaxed);
        let every = REFUSALS_EVERY.as_millis() as u64;
        let due = last == 0 || now.saturating_sub(last) >= every;
        if !due
            || self
                .last_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            self.unlogged.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let more = self.unlogged.swap(0, Ordering::Relaxed);
        let from = from.map_or("?".to_string(), |a| a.to_string());
        if more > 0 {
            tracing::warn!(%from, "{what}: {why} (and {more} more since the last such line)");
        } else {
            tracing::warn!(%from, "{what}: {why}");
        }
    }
}

static PLAINTEXT: Refusals = Refusals::new();
static HANDSHAKES: Refusals = Refusals::new();

/// The answer to a plaintext connection on a port that speaks TLS only.
fn tls_required() -> crate::service::ApiError {
    crate::service::ApiError::TlsRequired(
        "this port speaks TLS only: use https:// (with --cacert if its CA is not the system's)"
            .into(),
    )
}

/// Answers a plaintext framed client with one error frame (id 0: for the
/// connection, not a call) and closes; reads what the client sent first,
/// so closing does not reset the connection before the client reads it.
async fn refuse_frames(mut stream: TcpStream) {
    use tokio::io::AsyncWriteExt;
    let mut out = bytes::BytesMut::new();
    let frame = leasehold_proto::frame::Frame::new(
        0,
        leasehold_proto::frame::REPLY_ERROR,
        &leasehold_proto::v1::ErrorReply::from(tls_required()),
    );
    if tokio_util::codec::Encoder::encode(
        &mut leasehold_proto::frame::FrameCodec::replies(),
        frame,
        &mut out,
    )
    .is_err()
    {
        return;
    }
    let _ = stream.write_all(&out).await;
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    let drain = async { while matches!(stream.read(&mut sink).await, Ok(1..)) {} };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
}

/// Answers every request of a plaintext HTTP or gRPC client with
/// `tls_required`.
fn plaintext_refusal() -> axum::Router {
    axum::Router::new().fallback(|request: axum::extract::Request| async move {
        use axum::response::IntoResponse;
        if crate::api::http::is_grpc(&request) {
            return tonic::Status::from(tls_required())
                .into_http()
                .map(axum::body::Body::new);
        }
        tls_required().into_response()
    })
}

/// Connection limits.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Open connections at most; more are closed at once.
    pub max_connections: usize,
    /// Time to send the first byte, and an HTTP/1 request's headers.
    pub header_timeout: Duration,
    /// A connection with nothing in flight for this long is closed.
    pub idle_timeout: Duration,
}

impl Limits {
    /// What the framed protocol needs of them.
    fn frames(&self) -> crate::api::frames::Timeouts {
        crate::api::frames::Timeouts {
            header: self.header_timeout,
            idle: self.idle_timeout,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 10_000,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
        }
    }
}

/// How long a connection closed for being idle, or for a shutdown, has to
/// finish its polite close before it is dropped. Nothing is in flight on an
/// idle one, so the close is only the peer's acknowledgement.
pub const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// How often an HTTP/2 connection is pinged, and how long a ping may go unanswered.
const H2_PING_EVERY: Duration = Duration::from_secs(20);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(10);

/// Counts open connections against the cap.
#[derive(Clone)]
pub struct Gate {
    open: Arc<AtomicUsize>,
    /// Set while the cap is reached, so it is logged once per episode.
    full: Arc<AtomicBool>,
    max: usize,
}

/// One admitted connection; frees its place when dropped.
pub struct Admitted {
    gate: Gate,
    service: LockService,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let left = self.gate.open.fetch_sub(1, Ordering::SeqCst) - 1;
        self.service.context().metrics.connections.dec();
        if left < self.gate.max / 10 * 9 && self.gate.full.swap(false, Ordering::SeqCst) {
            tracing::info!(open = left, "connections below the cap again");
        }
    }
}

impl Gate {
    /// A cap of `max` open connections.
    pub fn new(max: usize) -> Gate {
        Gate {
            open: Arc::new(AtomicUsize::new(0)),
            full: Arc::new(AtomicBool::new(false)),
            max: max.max(1),
        }
    }

    /// A place for one more connection, or `None` at the cap.
    pub fn admit(&self, service: &LockService) -> Option<Admitted> {
        let metrics = &service.context().metrics;
        let admitted = self
            .open
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.max).then_some(n + 1)
            })
            .is_ok();
        if !admitted {
            metrics.refused.inc();
            if !self.full.swap(true, Ordering::SeqCst) {
                tracing::warn!(
                    max_connections = self.max,
                    "connection cap reached: closing new connections until some close (raise --max-connections, or find the client that opens so many)"
                );
            }
            return None;
        }
        metrics.connections.inc();
        Some(Admitted {
            gate: self.clone(),
            service: service.clone(),
        })
    }
}

/// Calls in flight on one connection and when the last one ended.
#[derive(Clone)]
struct Activity {
    in_flight: Arc<AtomicUsize>,
    /// Milliseconds since `epoch` when the connection last went quiet.
    quiet_since: Arc<AtomicU64>,
    epoch: Instant,
}

/// One call in flight; its end marks the connection quiet if it was the last.
struct Busy(Activity);

impl Activity {
    fn new() -> Activity {
        Activity {
            in_flight: Arc::new(AtomicUsize::new(0)),
            quiet_since: Arc::new(AtomicU64::new(0)),
            epoch: Instant::now(),
        }
    }

    fn enter(&self) -> Busy {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        Busy(self.clone())
    }

    /// How long nothing has been in flight, or `None` if something is.
    fn idle_for(&self) -> Option<Duration> {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let since = Duration::from_millis(self.quiet_since.load(Ordering::SeqCst));
        Some(self.epoch.elapsed().saturating_sub(since))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let now = self.0.epoch.elapsed().as_millis() as u64;
        self.0.quiet_since.store(now, Ordering::SeqCst);
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that keeps its call counted as in flight until it ends
/// (a watch stream, a gRPC stream's trailers).
struct Tracked {
    inner: Body,
    _busy: Busy,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Resolves once `idle_for` has been true for `limit`.
async fn idle(activity: &Activity, limit: Duration) {
    loop {
        let wait = match activity.idle_for() {
            Some(idle) if idle >= limit => return,
            Some(idle) => limit - idle,
            None => limit,
        };
        tokio::time::sleep(wait.max(Duration::from_millis(10))).await;
    }
}

/// Serves one connection: TLS first if it opens with a handshake (and the
/// node has TLS); inside, the framed protocol if its first byte is the
/// preamble's, HTTP/1.1 or HTTP/2 (JSON and gRPC) otherwise. A peer's
/// framed stream of appends (`raft::transport::framed`) comes without TLS only. When clients
/// must use TLS, a plaintext connection is closed at once.
pub async fn serve(
    stream: TcpStream,
    app: axum::Router,
    service: LockService,
    limits: Limits,
    tls: Option<Arc<Tls>>,
    mut stop: watch::Receiver<bool>,
    _admitted: Admitted,
) {
    // Small request/response frames: without TCP_NODELAY, Nagle's algorithm can
    // hold a response back until the client's delayed ACK.
    let _ = stream.set_nodelay(true);
    let local = local_of(&stream);
    let service = service.from_local(local.0);
    let mut first = [0u8; 1];
    tokio::select! {
        peeked = tokio::time::timeout(limits.header_timeout, stream.peek(&mut first)) => match peeked {
            Ok(Ok(1..)) => {}
            _ => return,
        },
        _ = crate::shutdown::stopped(&mut stop) => return,
    }
    let must_tls = tls.as_ref().is_some_and(|t| t.clients_need_tls());
    let from = stream.peer_addr().ok();
    let peers_need_certificates = tls.as_ref().is_some_and(|t| t.peers_need_certificates());
    let Some(tls) = tls.filter(|_| first[0] == crate::tls::HANDSHAKE) else {
        if must_tls {
            PLAINTEXT.note(
                from,
                "refused a plaintext connection",
                "this port speaks TLS only (the client should use https://)",
            );
            if first[0] == leasehold_proto::frame::PREAMBLE[0] {
                return refuse_frames(stream).await;
            }
            let limits = Limits {
                idle_timeout: limits.header_timeout,
                ..limits
            };
            return serve_http(
                stream,
                Shown::default(),
                local,
                plaintext_refusal(),
                limits,
                stop,
            )
            .await;
        }
        if first[0] == crate::raft::transport::framed::HELLO[0] {
            let serving = service.consensus().serve_framed(
                stream,
                peers_need_certificates,
                limits.header_timeout,
            );
            tokio::select! {
                () = serving => {}
                _ = crate::shutdown::stopped(&mut stop) => {}
            }
            return;
        }
        if first[0] == leasehold_proto::frame::PREAMBLE[0] {
            let (read, write) = stream.into_split();
            return crate::api::frames::serve(read, write, service, limits.frames(), stop).await;
        }
        return serve_http(stream, Shown::default(), local, app, limits, stop).await;
    };
    let opened = async {
        let (mut stream, peer) = match tls.accept(stream, limits.header_timeout).await {
            Ok(accepted) => accepted,
            Err(e) => {
                HANDSHAKES.note(from, "refused a TLS handshake", &format!("{e:#}"));
                return Err(e);
            }
        };
        let subject = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|certs| certs.first())
            .and_then(crate::tls::subject)
            .map(|s| ClientSubject(Arc::from(s)));
        let mut first = [0u8; 1];
        tokio::time::timeout(limits.header_timeout, stream.read_exact(&mut first)).await??;
        anyhow::Ok((Prefixed::new(first[0], stream), peer, subject))
    };
    let (stream, peer, subject) = tokio::select! {
        opened = opened => match opened {
            Ok(opened) => opened,
            Err(e) => {
                tracing::debug!(error = %e, "closing a TLS connection");
                return;
            }
        },
        _ = crate::shutdown::stopped(&mut stop) => return,
    };
    if stream.first == Some(leasehold_proto::frame::PREAMBLE[0]) {
        let (read, write) = tokio::io::split(stream);
        let service = service.with_certificate(subject.map(|s| s.0));
        return crate::api::frames::serve(read, write, service, limits.frames(), stop).await;
    }
    let shown = Shown { peer, subject };
    serve_http(stream, shown, local, app, limits, stop).await
}

/// Whether `stream` comes from this machine: from the very address it
/// connects to (`127.0.0.1` to `127.0.0.1`, or the host's own address to
/// itself).
fn local_of(stream: &TcpStream) -> Local {
    let (Ok(peer), Ok(own)) = (stream.peer_addr(), stream.local_addr()) else {
        return Local(false);
    };
    Local(peer.ip() == own.ip())
}
/// What a TLS client showed in its handshake.
#[derive(Default)]
struct Shown {
    /// A peer's certificate (signed by the peer CA), for Raft calls.
    peer: Option<PeerCertificate>,
    /// A client certificate's subject, for the audit trail.
    subject: Option<ClientSubject>,
}

/// Serves HTTP/1.1 or HTTP/2 on one connection until it closes, goes idle
/// or the server stops.
async fn serve_http<S>(
    stream: S,
    shown: Shown,
    local: Local,
    app: axum::Router,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Activity::new();
    let calls = activity.clone();
    let service = hyper::service::service_fn(move |mut request: hyper::Request<_>| {
        let busy = calls.enter();
        if let Some(peer) = &shown.peer {
            request.extensions_mut().insert(peer.clone());
        }
        if let Some(subject) = &shown.subject {
            request.extensions_mut().insert(subject.clone());
        }
        request.extensions_mut().insert(local);
        let call = app.clone().oneshot(request);
        async move {
            let response = call.await?;
            Ok::<_, std::convert::Infallible>(
                response.map(|inner| Body::new(Tracked { inner, _busy: busy })),
            )
        }
    });
    let mut http = auto::Builder::new(TokioExecutor::new());
    http.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    http.http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(H2_PING_EVERY))
        .keep_alive_timeout(H2_PING_TIMEOUT);
    let io = TokioIo::new(JsonParseErrors::new(stream));
    let conn = http.serve_connection_with_upgrades(io, service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = idle(&activity, limits.idle_timeout) => {
            // An HTTP/2 connection still in its handshake, or waiting for
            // the peer to acknowledge the GOAWAY, would otherwise stay
            // until its next ping times out.
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(CLOSE_GRACE, conn).await;
        }
        _ = crate::shutdown::stopped(&mut stop) => {
            // Calls in flight may finish; the server bounds the wait.
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// hyper answers an HTTP/1 request it cannot parse (a bad
/// `Transfer-Encoding`, headers too large, a URI too long) by itself,
/// before the router sees it, with a status and an empty body. This puts
/// the JSON error body every other answer has into that response. It
/// rewrites only a write that is a whole response head with an error
/// status, `content-length: 0` and no `content-type` (the router never
/// sends an error like that), and leaves HTTP/2 connections alone. It
/// reports itself as not vectored, so hyper hands it each response head
/// in one piece.
struct JsonParseErrors<S> {
    inner: S,
    /// The first bytes read, to tell HTTP/2's preface (`PRI * HTTP/2.0`).
    first: Vec<u8>,
    /// A rewritten response, and how much of it is written.
    pending: Option<(Vec<u8>, usize)>,
}

impl<S> JsonParseErrors<S> {
    fn new(inner: S) -> JsonParseErrors<S> {
        JsonParseErrors {
            inner,
            first: Vec::with_capacity(3),
            pending: None,
        }
    }

    fn http2(&self) -> bool {
        self.first.starts_with(b"PRI")
    }
}

/// The response `head` with a JSON error body, if it is one of hyper's own
/// bodiless error answers.
fn with_json_body(head: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(head.strip_suffix(b"\r\n\r\n")?).ok()?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next()?;
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| status_line.strip_prefix("HTTP/1.0 "))?;
    let code: u16 = status.get(..3)?.parse().ok()?;
    let headers: Vec<&str> = lines.collect();
    let named = |h: &str, name: &str| {
        h.split_once(':')
            .is_some_and(|(n, _)| n.trim().eq_ignore_ascii_case(name))
    };
    let empty = headers.iter().any(|h| {
        named(h, "content-length") && h.split_once(':').is_some_and(|(_, v)| v.trim() == "0")
    });
    if !(400..600).contains(&code) || !empty || headers.iter().any(|h| named(h, "content-type")) {
        return None;
    }
    let message = match code {
        431 => "the request's headers are too large".to_string(),
        414 => "the request's URI is too long".to_string(),
        _ => "the request is not valid HTTP/1.1 (a malformed request line or header; the only Transfer-Encoding accepted is chunked): fix the client's request".to_string(),
    };
    let body = serde_json::json!({
        "error": { "code": "invalid_argument", "message": message }
    })
    .to_string();
    let mut out = format!(
        "{status_line}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for h in headers.iter().filter(|h| !named(h, "content-length")) {
        out.push_str(h);
        out.push_str("\r\n");
    }
    out.push_str("\r\n");
    out.push_str(&body);
    Some(out.into_bytes())
}

impl<S: AsyncWrite + Unpin> JsonParseErrors<S> {
    /// Writes out a rewritten response, if one is waiting.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while let Some((bytes, written)) = &mut self.pending {
            if *written == bytes.len() {
                self.pending = None;
                break;
            }
            match Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()))
                }
                Poll::Ready(Ok(n)) => *written += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for JsonParseErrors<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.inner).poll_read(cx, buf);
        if self.first.len() < 3 {
            let want = 3 - self.first.len();
            let new = &buf.filled()[before..];
            let take = new.len().min(want);
            let head = new[..take].to_vec();
            self.first.extend_from_slice(&head);
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for JsonParseErrors<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.drain(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        }
        if !self.http2() {
            if let Some(rewritten) = with_json_body(buf) {
                // Taken whole; written out here or by the next flush.
                self.pending = Some((rewritten, 0));
                if let Poll::Ready(Err(e)) = self.drain(cx) {
                    return Poll::Ready(Err(e));
                }
                return Poll::Ready(Ok(buf.len()));
            }
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.drain(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut self.inner).poll_flush(cx),
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.drain(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut self.inner).poll_shutdown(cx),
            other => other,
        }
    }
}

/// A stream with its first byte, already read to tell the protocol, put
/// back in front.
struct Prefixed<S> {
    first: Option<u8>,
    inner: S,
}

impl<S> Prefixed<S> {
    fn new(first: u8, inner: S) -> Prefixed<S> {
        Prefixed {
            first: Some(first),
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if buf.remaining() > 0 {
            if let Some(first) = self.first.take() {
                buf.put_slice(&[first]);
                return Poll::Ready(Ok(()));
            }
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Raises this process's soft limit on open files to its hard limit, and
/// returns the limit in force.
pub fn raise_fd_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit write and read only the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return None;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    Some(limit.rlim_cur)
}
