//! HTTP/1.1 and HTTP/2 (JSON and gRPC) on one connection: calls in flight
//! counted so an idle connection is closed, and HTTP/2 pings.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes, HttpBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tower::ServiceExt;

use super::json_errors::JsonParseErrors;
use super::limits::{Limits, CLOSE_GRACE};
use crate::api::Local;
use crate::tls::{ClientSubject, PeerCertificate};

/// How often an HTTP/2 connection is pinged, and how long a ping may go unanswered.
const H2_PING_EVERY: Duration = Duration::from_secs(20);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(10);

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

/// What a TLS client showed in its handshake.
#[derive(Default)]
pub(super) struct Shown {
    /// A peer's certificate (signed by the peer CA), for Raft calls.
    pub peer: Option<PeerCertificate>,
    /// A client certificate's subject, for the audit trail.
    pub subject: Option<ClientSubject>,
}

/// Serves HTTP/1.1 or HTTP/2 on one connection until it closes, goes idle
/// or the server stops.
pub(super) async fn serve_http<S>(
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
