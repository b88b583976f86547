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
//!   (`json_errors`), not an empty one.
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
//!
//! - `limits`: the connection cap and the timeouts ([`Limits`]).
//! - `refusals`: plaintext refused on a TLS-only port, and the log lines.
//! - `http`: HTTP/1.1 and HTTP/2 on a connection, idle tracking, pings.
//! - `json_errors`: hyper's own parse-error answers given a JSON body.
//! - `prefixed`: a stream with its sniffed first byte put back.

mod http;
mod json_errors;
mod limits;
mod prefixed;
mod refusals;

use std::sync::Arc;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::api::Local;
use crate::service::LockService;
use crate::tls::{ClientSubject, Tls};
use http::{serve_http, Shown};
pub use limits::{raise_fd_limit, Admitted, Gate, Limits, CLOSE_GRACE};
use prefixed::Prefixed;
pub use refusals::REFUSALS_EVERY;
use refusals::{plaintext_refusal, refuse_frames, HANDSHAKES, PLAINTEXT};

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
            let consensus = service.consensus();
            let serving = consensus.peers().serve_framed(
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
