//! The framed protocol's server side ([`leasehold_proto::frame`]).
//!
//! One task per connection reads requests, runs them concurrently and writes
//! each reply as its call finishes; replies that are ready together leave in
//! one write. A connection that breaks the protocol (bad preamble, oversized
//! frame) is closed; a request that cannot be decoded gets an
//! `invalid_argument` reply and changes nothing.

use bytes::{Bytes, BytesMut};
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use leasehold_proto::frame::{Frame, FrameCodec, Op, PREAMBLE, REPLY_ERROR, REPLY_OK};
use leasehold_proto::v1 as pb;
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio_util::codec::{Encoder, FramedRead};

use super::calls;
use crate::service::{ApiError, LockService};

/// Calls one connection may have in flight; beyond it, reading pauses (with
/// requests of at most 128 KiB, at most 32 MiB held per connection).
const MAX_IN_FLIGHT: usize = 256;

fn decode<M: Message + Default>(body: Bytes) -> Result<M, ApiError> {
    M::decode(body).map_err(|e| ApiError::invalid("body", e))
}

async fn call(service: &LockService, op: Op, body: Bytes) -> Result<Vec<u8>, ApiError> {
    Ok(match op {
        Op::Grant => calls::grant(service, decode(body)?).await?.encode_to_vec(),
        Op::KeepAlive => calls::keep_alive(service, decode(body)?)
            .await?
            .encode_to_vec(),
        Op::KeepAliveMany => calls::keep_alive_many(service, decode(body)?)
            .await?
            .encode_to_vec(),
        Op::Revoke => calls::revoke(service, decode(body)?).await?.encode_to_vec(),
        Op::Acquire => {
            let request: pb::AcquireRequest = decode(body)?;
            if request.wait_ms != 0 {
                // A caller that gives up needs to withdraw its wait, and a
                // frame has no stream to reset: waits go over gRPC.
                return Err(ApiError::invalid(
                    "wait_ms",
                    "the framed protocol only tries once (wait_ms = 0); wait over gRPC",
                ));
            }
            calls::acquire(service, request).await?.encode_to_vec()
        }
        Op::Release => calls::release(service, decode(body)?)
            .await?
            .encode_to_vec(),
        Op::SaveCheckpoint => calls::save_checkpoint(service, decode(body)?)
            .await?
            .encode_to_vec(),
        // Handled in order by the connection's loop, never here.
        Op::Authenticate => {
            return Err(ApiError::Internal("authenticate out of order".into()));
        }
    })
}

async fn answer(service: LockService, request: Frame) -> Frame {
    let result = match Op::try_from(request.tag) {
        Ok(op) => call(&service, op, request.body).await,
        Err(tag) => Err(ApiError::invalid("op", format!("unknown operation {tag}"))),
    };
    match result {
        Ok(body) => Frame {
            id: request.id,
            tag: REPLY_OK,
            body: body.into(),
        },
        Err(e) => Frame::new(request.id, REPLY_ERROR, &pb::ErrorReply::from(e)),
    }
}

/// Takes an authenticate frame: the connection acts for its token from
/// here on, if the token is good now; otherwise nothing changes.
async fn authenticate(service: &mut LockService, request: Frame) -> Frame {
    let checked = match decode::<pb::AuthenticateRequest>(request.body) {
        Ok(r) => {
            let next = service.with_bearer(Some(&r.token));
            next.check_token().await.map(|()| next)
        }
        Err(e) => Err(e),
    };
    match checked {
        Ok(next) => {
            *service = next;
            Frame {
                id: request.id,
                tag: REPLY_OK,
                body: pb::AuthenticateResponse {}.encode_to_vec().into(),
            }
        }
        Err(e) => Frame::new(request.id, REPLY_ERROR, &pb::ErrorReply::from(e)),
    }
}

/// How long a framed connection may take to send its preamble, and stay
/// with nothing in flight.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// For the preamble.
    pub header: std::time::Duration,
    /// With no call in flight.
    pub idle: std::time::Duration,
}

/// Serves one connection (its two halves) whose first byte was the preamble's, until the
/// client closes it or `stop` turns true (calls in flight then finish first).
///
/// The preamble must come within `timeouts.header`. The connection is
/// closed when nothing was in flight for `timeouts.idle`; the client opens
/// a new one on its next call.
pub async fn serve<R, W>(
    mut read: R,
    mut write: W,
    mut service: LockService,
    timeouts: Timeouts,
    mut stop: watch::Receiver<bool>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    // Refusals held back for a caller past its rate take a quarter of the
    // places at most: a renewal sent behind a flood is still read.
    service = service.for_connection(MAX_IN_FLIGHT);
    let mut preamble = [0u8; PREAMBLE.len()];
    match tokio::time::timeout(timeouts.header, read.read_exact(&mut preamble)).await {
        Ok(Ok(_)) if &preamble == PREAMBLE => {}
        _ => return,
    }
    let mut requests = FramedRead::new(read, FrameCodec::requests());
    let mut in_flight = FuturesUnordered::new();
    let mut out = BytesMut::new();
    let mut replies = FrameCodec::replies();
    let mut reading = true;
    // Idle is checked on a slow tick against the time of the last call, not
    // with a timer reset per call: a reset per request showed up in the
    // server's CPU per acquire.
    let mut check = tokio::time::interval(timeouts.idle / 2);
    check.tick().await;
    let mut last_call = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = check.tick(), if in_flight.is_empty() => {
                if last_call.elapsed() >= timeouts.idle {
                    return;
                }
            }
            request = requests.next(), if reading && in_flight.len() < MAX_IN_FLIGHT => {
                match request {
                    Some(Ok(frame)) if frame.tag == Op::Authenticate as u8 => {
                        last_call = tokio::time::Instant::now();
                        let reply = authenticate(&mut service, frame).await;
                        in_flight.push(futures::future::ready(reply).boxed());
                    }
                    Some(Ok(frame)) => {
                        last_call = tokio::time::Instant::now();
                        in_flight.push(answer(service.clone(), frame).boxed());
                    }
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "closing a framed connection");
                        reading = false;
                    }
                    None => reading = false,
                }
            }
            Some(reply) = in_flight.next() => {
                let mut next = Some(reply);
                while let Some(reply) = next {
                    let id = reply.id;
                    if let Err(e) = replies.encode(reply, &mut out) {
                        let e = ApiError::Internal(format!("reply too large: {e}"));
                        let fallback = Frame::new(id, REPLY_ERROR, &pb::ErrorReply::from(e));
                        if replies.encode(fallback, &mut out).is_err() {
                            return;
                        }
                    }
                    next = in_flight.next().now_or_never().flatten();
                }
                if write.write_all(&out).await.is_err() {
                    return;
                }
                out.clear();
                last_call = tokio::time::Instant::now();
            }
            _ = crate::shutdown::stopped(&mut stop), if reading => reading = false,
        }
        if !reading && in_flight.is_empty() {
            return;
        }
    }
}
