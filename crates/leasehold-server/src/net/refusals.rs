//! Connections refused: a plaintext client on a port that speaks TLS only
//! is answered in its own protocol with `tls_required`, and refusals are
//! logged at most once per [`REFUSALS_EVERY`] for each kind.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// At most one log line per this long for refused connections of a kind;
/// the line counts the ones it stands for.
pub const REFUSALS_EVERY: Duration = Duration::from_secs(10);

/// Logs refusals of one kind, at most once per [`REFUSALS_EVERY`].
pub(super) struct Refusals {
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

    pub(super) fn note(&self, from: Option<std::net::SocketAddr>, what: &str, why: &str) {
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

pub(super) static PLAINTEXT: Refusals = Refusals::new();
pub(super) static HANDSHAKES: Refusals = Refusals::new();

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
pub(super) async fn refuse_frames(mut stream: TcpStream) {
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
pub(super) fn plaintext_refusal() -> axum::Router {
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
