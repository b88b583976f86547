//! Appends to a follower as one stream with several in flight.
//!
//! openraft hands a replication session a stream of append requests, one
//! for whatever was appended since the last; answers must come back in the
//! order the requests went. Sent one at a time, each append waits a round
//! trip and the follower's flush before the next may leave. On a transport
//! that carries streams in order (gRPC: one HTTP/2 stream, `AppendStream` in
//! `proto/raft.proto`), up to [`APPENDS_IN_FLIGHT`] go out before the first
//! answer, and the follower's Raft takes them in order and answers each once
//! it is flushed. When that many are unanswered the session stops reading
//! requests (back-pressure: what is appended meanwhile goes out as one
//! bigger request later). The oldest unanswered request must be answered
//! within the session's soft deadline, or the stream fails and openraft
//! starts another (as a single call that is not answered in time does).

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use openraft::base::{BoxFuture, BoxStream};
use openraft::errors::{Fatal, NetworkError, RPCError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{AppendEntriesRequest, StreamAppendResult};
use openraft::OptionalSend;
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;

use super::peer::{decode, encode, AnswerStream, Heard, PeerError, Transport, TransportError};
use super::{NodeId, Raft, TypeConfig};

/// Appends sent to one follower and not yet answered, at most.
pub(super) const APPENDS_IN_FLIGHT: usize = 16;
/// A stream that sends nothing yet must be open within this long (as long
/// as a connection may take: `peer::CONNECT_TIMEOUT`).
const OPEN_WITHIN: Duration = Duration::from_millis(500);

type Answers = BoxStream<'static, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>;

/// What the requests side and the answers side of one stream share.
struct InFlight {
    /// Free places in the window; closed when the answers side is dropped
    /// ([`Closing`]), so the requests side sends no more.
    window: Semaphore,
    /// When each unanswered request was sent, oldest first.
    sent: Mutex<VecDeque<Instant>>,
    /// Wakes the answers side when a request goes out with none in flight.
    first_sent: Notify,
    /// Why the requests side stopped early, if it did.
    broken: Mutex<Option<String>>,
}

/// Streams `input` to `peer` over `transport`, pipelined, and returns the
/// answers in order.
pub(super) fn pipelined<S>(
    transport: &dyn Transport,
    peer: Peer,
    input: S,
    option: RPCOption,
) -> BoxFuture<'static, Result<Answers, RPCError<TypeConfig>>>
where
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + OptionalSend + Unpin + 'static,
{
    let within = option.soft_ttl();
    let in_flight = Arc::new(InFlight {
        window: Semaphore::new(APPENDS_IN_FLIGHT),
        sent: Mutex::default(),
        first_sent: Notify::new(),
        broken: Mutex::default(),
    });
    let requests = {
        let in_flight = in_flight.clone();
        input
            .then(move |request| {
                let in_flight = in_flight.clone();
                async move {
                    // Closed: the answers side is gone, send no more.
                    in_flight.window.acquire().await.ok()?.forget();
                    match encode(&request) {
                        Ok(bytes) => {
                            let mut sent = in_flight.sent.lock();
                            sent.push_back(Instant::now());
                            if sent.len() == 1 {
                                in_flight.first_sent.notify_one();
                            }
                            Some(bytes)
                        }
                        Err(e) => {
                            *in_flight.broken.lock() = Some(e);
                            None
                        }
                    }
                }
            })
            .take_while(|bytes| std::future::ready(bytes.is_some()))
            .filter_map(std::future::ready)
            .boxed()
    };
    // Not waited for here: the first requests go out with the opening, and
    // the deadline of the oldest unanswered one covers the opening too. A
    // stream that opens sending nothing must open within OPEN_WITHIN.
    let opening = Opened::Opening(
        transport.append_stream(peer.target, &peer.addr, requests),
        Instant::now() + within.max(OPEN_WITHIN),
    );
    let state = (opening, Closing(in_flight), peer);
    let answers = futures::stream::unfold(Some(state), move |state| async move {
        let (mut answers, in_flight, peer) = state?;
        let answer = next_answer(&mut answers, &in_flight.0, &peer, within).await?;
        let go_on = matches!(answer, Ok(Ok(_)));
        Some((answer, go_on.then_some((answers, in_flight, peer))))
    });
    Box::pin(std::future::ready(Ok(answers.boxed() as Answers)))
}

/// The transport's stream, while it opens and once it is open.
enum Opened {
    /// Opening, to be open by the instant.
    Opening(
        BoxFuture<'static, Result<AnswerStream, TransportError>>,
        Instant,
    ),
    Open(AnswerStream),
}

/// Waits for the next answer; `None` once the stream has ended cleanly.
async fn next_answer(
    answers: &mut Opened,
    in_flight: &InFlight,
    peer: &Peer,
    within: Duration,
) -> Option<Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>> {
    loop {
        let oldest = in_flight.sent.lock().front().copied();
        let deadline = tokio::time::sleep_until(oldest.map_or_else(Instant::now, |t| t + within));
        let answer = match answers {
            Opened::Opening(opening, by) => {
                let by = oldest.map_or(*by, |t| (*by).min(t + within));
                tokio::select! {
                    opened = opening => match opened {
                        Ok(open) => {
                            *answers = Opened::Open(open);
                            continue;
                        }
                        Err(e) => return Some(Err(peer.transport_error(e))),
                    },
                    _ = tokio::time::sleep_until(by) => {
                        return Some(Err(peer.network("the stream of appends did not open in time".into())));
                    }
                    _ = in_flight.first_sent.notified(), if oldest.is_none() => continue,
                }
            }
            Opened::Open(open) => tokio::select! {
                answer = open.next() => answer,
                _ = deadline, if oldest.is_some() => {
                    return Some(Err(peer.network(format!("an append was not answered within {within:?}"))));
                }
                _ = in_flight.first_sent.notified(), if oldest.is_none() => continue,
            },
        };
        let Some(answer) = answer else {
            if let Some(why) = in_flight.broken.lock().take() {
                return Some(Err(peer.network(why)));
            }
            // Ended with appends unanswered: the connection broke.
            let unanswered = in_flight.sent.lock().len();
            return (unanswered > 0).then(|| {
                Err(peer.network(format!(
                    "the stream of appends ended with {unanswered} unanswered"
                )))
            });
        };
        in_flight.sent.lock().pop_front();
        in_flight.window.add_permits(1);
        let bytes = match answer {
            Ok(bytes) => bytes,
            Err(e) => return Some(Err(peer.transport_error(e))),
        };
        let answer: Result<StreamAppendResult<TypeConfig>, Fatal<TypeConfig>> = match decode(&bytes)
        {
            Ok(answer) => answer,
            Err(why) => return Some(Err(peer.network(why))),
        };
        return Some(match answer {
            Ok(result) => {
                peer.answered();
                Ok(result)
            }
            // Its Raft has stopped: back off from it as from one that is down.
            Err(fatal) => Err(peer.unreachable(fatal.to_string())),
        });
    }
}

/// Held by the answers side: closes the window when it is dropped.
struct Closing(Arc<InFlight>);

impl Drop for Closing {
    fn drop(&mut self) {
        self.0.window.close();
    }
}

/// The peer a stream goes to, for its errors and its "heard" mark.
pub(super) struct Peer {
    pub target: NodeId,
    pub addr: String,
    pub heard: Arc<Heard>,
}

impl Peer {
    fn error(&self, message: String) -> PeerError {
        PeerError {
            target: self.target,
            addr: self.addr.clone(),
            message,
        }
    }

    fn network(&self, message: String) -> RPCError<TypeConfig> {
        RPCError::Network(NetworkError::new(&self.error(message)))
    }

    fn unreachable(&self, message: String) -> RPCError<TypeConfig> {
        RPCError::Unreachable(Unreachable::new(&self.error(message)))
    }

    fn transport_error(&self, e: TransportError) -> RPCError<TypeConfig> {
        match e {
            TransportError::Unreachable(why) => self.unreachable(why),
            TransportError::Failed(why) => self.network(why),
        }
    }

    fn answered(&self) {
        self.heard.answered(self.target);
    }
}

/// The follower's end: takes the encoded requests of one stream in order,
/// hands them to its Raft (which answers each once it is flushed), and
/// returns the encoded answers in the same order. A request that cannot be
/// decoded, or that `sender` refuses, ends the stream with that error.
pub(super) fn serve_stream(
    raft: &Raft,
    requests: impl Stream<Item = Result<Vec<u8>, String>> + Send + Unpin + 'static,
    sender: impl Fn(NodeId) -> Result<(), String> + Send + Sync + 'static,
) -> BoxStream<'static, Result<Vec<u8>, String>> {
    let refused = Arc::new(Mutex::new(None::<String>));
    let input = {
        let refused = refused.clone();
        requests
            .map(move |request| {
                let rpc = request.and_then(|bytes| {
                    let rpc: AppendEntriesRequest<TypeConfig> = decode(&bytes)?;
                    sender(rpc.vote.leader_id.node_id)?;
                    Ok(rpc)
                });
                rpc.map_err(|why| *refused.lock() = Some(why)).ok()
            })
            .take_while(|rpc| std::future::ready(rpc.is_some()))
            .filter_map(std::future::ready)
    };
    let answers = raft.stream_append(input).map(|answer| encode(&answer));
    let ended = futures::stream::once(async move { refused.lock().take() })
        .filter_map(|why| std::future::ready(why.map(Err)));
    answers.chain(ended).boxed()
}
