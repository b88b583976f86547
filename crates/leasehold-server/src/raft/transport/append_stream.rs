//! Appends to a follower as one stream with several in flight.
//!
//! openraft hands a replication session a stream of append requests, one
//! for whatever was appended since the last; answers must come back in the
//! order the requests went. Sent one at a time, each append waits a round
//! trip and the follower's flush before the next may leave. On a transport
//! that carries streams in order (gRPC: one HTTP/2 stream, `AppendStream` in
//! `proto/raft.proto`), up to [`APPENDS_IN_FLIGHT`] go out before the first
//! answer, and the follower's Raft takes them in order and answers each once
//! it is flushed. When that many are unanswered the next request waits for
//! a place and no more are made (back-pressure: what is appended meanwhile
//! goes out as one bigger request later; one is made ahead, see [`pump`]). The oldest unanswered request must be answered
//! within the session's soft deadline, or the stream fails and openraft
//! starts another (as a single call that is not answered in time does).
//!
//! openraft sends an append with no entries each time the commit index moves
//! and nothing new waits to go: at one caller that is one more message to
//! each follower, and one more answer, per commit, sent just before the
//! leader answers its caller. Such an append is held back for up to
//! [`HOLD_COMMIT_ONLY`]: if the next append goes on from the same place
//! (same leader, same previous entry, a commit index no lower) it carries the
//! commit instead, and the held one is answered from its answer (below). A
//! held append that nothing follows goes out when its time is up.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use openraft::async_runtime::WatchReceiver;
use openraft::base::{BoxFuture, BoxStream};
use openraft::errors::{Fatal, NetworkError, RPCError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{AppendEntriesRequest, StreamAppendResult};
use openraft::OptionalSend;
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use super::peer::retry_after;
use super::{decode, encode, AnswerStream, Transport, TransportError};
use super::{Heard, PeerError};
use crate::raft::{LogId, NodeId, Raft, TypeConfig};

/// Appends sent to one follower and not yet answered, at most.
pub(in crate::raft) const APPENDS_IN_FLIGHT: usize = 16;
/// A stream that sends nothing yet must be open within this long (as long
/// as a connection may take: `transport::CONNECT_TIMEOUT`).
const OPEN_WITHIN: Duration = Duration::from_millis(500);
/// An append with no entries waits at most this long for one that can carry
/// it. A follower learns of a commit this much later when nothing follows;
/// nothing waits for that but its own applying.
const HOLD_COMMIT_ONLY: Duration = Duration::from_millis(2);

type Answers = BoxStream<'static, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>;

/// What the requests side and the answers side of one stream share.
struct InFlight {
    /// Free places in the window; closed when the answers side is dropped
    /// ([`Closing`]), so the requests side sends no more.
    window: Semaphore,
    /// The unanswered requests, oldest first.
    sent: Mutex<VecDeque<Sent>>,
    /// Wakes the answers side when a request goes out with none in flight.
    first_sent: Notify,
    /// Why the requests side stopped early, if it did.
    broken: Mutex<Option<String>>,
}

impl InFlight {
    fn new() -> Self {
        InFlight {
            window: Semaphore::new(APPENDS_IN_FLIGHT),
            sent: Mutex::default(),
            first_sent: Notify::new(),
            broken: Mutex::default(),
        }
    }
}

/// A request on the wire.
struct Sent {
    at: Instant,
    /// Held appends it carries (see the module doc), answered before it.
    riders: Riders,
}

/// Appends with no entries that were not sent because the request after
/// them carries them: all with the same previous entry.
#[derive(Clone, Copy, Default)]
struct Riders {
    count: usize,
    prev: Option<LogId>,
}

impl Riders {
    /// What the follower would have answered each of them, given its answer
    /// to the request that carried them. That request went on from the
    /// same previous entry with a commit index no lower, so a follower that
    /// takes it has that entry (it matches up to it), and one that refuses
    /// it for a conflict at that entry would have refused them alike. One
    /// that refuses it for a higher vote may have taken them before its vote
    /// rose; they are refused too, which claims nothing it did not do, and
    /// the session ends at the first refusal either way.
    fn answers(
        self,
        carrier: &StreamAppendResult<TypeConfig>,
    ) -> impl Iterator<Item = StreamAppendResult<TypeConfig>> + '_ {
        (0..self.count).map(move |_| match carrier {
            Ok(matching) => Ok(self.prev.min(*matching)),
            Err(refused) => Err(refused.clone()),
        })
    }
}

/// The requests side: takes openraft's requests in order, holds back those
/// with no entries (see the module doc), and sends each within the window.
struct Requests<S> {
    input: S,
    in_flight: Arc<InFlight>,
    /// An append with no entries, the appends it carries, and until when it
    /// may wait.
    held: Option<(AppendEntriesRequest<TypeConfig>, Riders, Instant)>,
    /// A request taken from `input` that the held one could not ride on.
    next: Option<AppendEntriesRequest<TypeConfig>>,
    input_ended: bool,
}

impl<S> Requests<S>
where
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Unpin,
{
    fn new(input: S, in_flight: Arc<InFlight>) -> Self {
        Requests {
            input,
            in_flight,
            held: None,
            next: None,
            input_ended: false,
        }
    }

    /// The next request to send, with the held appends it carries; `None`
    /// once the input has ended and nothing is held.
    async fn next_to_send(&mut self) -> Option<(AppendEntriesRequest<TypeConfig>, Riders)> {
        loop {
            let request = match self.next.take() {
                Some(request) => request,
                None => match (&self.held, self.input_ended) {
                    (_, true) => return self.held.take().map(|(held, riders, _)| (held, riders)),
                    (None, false) => match self.input.next().await {
                        Some(request) => request,
                        None => {
                            self.input_ended = true;
                            continue;
                        }
                    },
                    (Some((_, _, until)), false) => {
                        let until = *until;
                        tokio::select! {
                            biased;
                            request = self.input.next() => match request {
                                Some(request) => request,
                                None => {
                                    self.input_ended = true;
                                    continue;
                                }
                            },
                            _ = tokio::time::sleep_until(until) => {
                                return self.held.take().map(|(held, riders, _)| (held, riders));
                            }
                        }
                    }
                },
            };
            let (riders, until) = match self.held.take() {
                Some((held, riders, until)) if carries(&request, &held) => (
                    Riders {
                        count: riders.count + 1,
                        prev: held.prev_log_id,
                    },
                    until,
                ),
                Some((held, riders, _)) => {
                    self.next = Some(request);
                    return Some((held, riders));
                }
                None => (Riders::default(), Instant::now() + HOLD_COMMIT_ONLY),
            };
            if request.entries.is_empty() {
                self.held = Some((request, riders, until));
                continue;
            }
            return Some((request, riders));
        }
    }

    /// Waits for a place in the window and encodes the next request.
    async fn send_next(&mut self) -> Option<Vec<u8>> {
        let (request, riders) = self.next_to_send().await?;
        // Closed: the answers side is gone, send no more.
        self.in_flight.window.acquire().await.ok()?.forget();
        match encode(&request) {
            Ok(bytes) => {
                let mut sent = self.in_flight.sent.lock();
                sent.push_back(Sent {
                    at: Instant::now(),
                    riders,
                });
                if sent.len() == 1 {
                    self.in_flight.first_sent.notify_one();
                }
                Some(bytes)
            }
            Err(e) => {
                *self.in_flight.broken.lock() = Some(e);
                None
            }
        }
    }
}

/// Reads openraft's requests into a channel, each to its end, one ahead.
///
/// openraft makes a request holding its replication's stream lock, and one
/// it is still making (waiting for entries to send) keeps the lock. Its
/// stream left part-way through a request and no longer polled (as the
/// requests side leaves it when a held append's time is up) would keep the
/// next replication session from starting. Here each request is made to
/// its end; the task stops when the input ends, when the requests side is
/// dropped, or when the answers side is ([`Closing`]).
///
/// Nothing is read until the transport first asks for a request, which it
/// does once it has reached the peer: making a request reads its entries
/// from the log, and a session to a peer that is down is started again
/// every half second. With a million live leases that read was megabytes
/// of entries decoded each time, enough to fill a new leader's thread
/// while its old leader stayed down.
fn pump<S>(
    mut input: S,
) -> (
    impl Stream<Item = AppendEntriesRequest<TypeConfig>>,
    AbortHandle,
)
where
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
{
    let (requests, read) = mpsc::channel(1);
    let asked = Arc::new(Notify::new());
    let first_ask = asked.clone();
    let task = tokio::spawn(async move {
        tokio::select! {
            () = first_ask.notified() => {}
            () = requests.closed() => return,
        }
        // Room first, so that a request is made only once it can be taken.
        while let Ok(room) = requests.reserve().await {
            let request = tokio::select! {
                request = input.next() => request,
                () = requests.closed() => return,
            };
            match request {
                Some(request) => room.send(request),
                None => return,
            }
        }
    });
    let mut read = ReceiverStream::new(read);
    let mut asking = Some(asked);
    let requests = futures::stream::poll_fn(move |cx| {
        if let Some(asked) = asking.take() {
            // Kept if the task is not waiting yet.
            asked.notify_one();
        }
        read.poll_next_unpin(cx)
    });
    (requests, task.abort_handle())
}

/// Whether `next` can carry `held` (an append with no entries): it goes on
/// from the same place for the same leader, with a commit index no lower.
fn carries(
    next: &AppendEntriesRequest<TypeConfig>,
    held: &AppendEntriesRequest<TypeConfig>,
) -> bool {
    next.vote == held.vote
        && next.prev_log_id == held.prev_log_id
        && next.leader_commit >= held.leader_commit
}

/// Streams `input` to `peer` over `transport`, pipelined, and returns the
/// answers in order.
pub(in crate::raft) fn pipelined<S>(
    transport: &dyn Transport,
    peer: Peer,
    input: S,
    option: RPCOption,
) -> BoxFuture<'static, Result<Answers, RPCError<TypeConfig>>>
where
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + OptionalSend + Unpin + 'static,
{
    let within = option.soft_ttl();
    // openraft's backoff waits in making a request, and no request is made
    // before the stream is open (see `pump`): a stream that failed to open
    // waits here instead, or it is opened again as fast as it is refused.
    // The wait ends early once the peer answers anything (a heartbeat): it
    // is back, and a leadership handed to it must not wait on this.
    let wait = match peer.failed_opens.load(Ordering::Relaxed) {
        0 => Duration::ZERO,
        failures => retry_after(failures),
    };
    let (heard, target, since) = (peer.heard.clone(), peer.target, Instant::now());
    let in_flight = Arc::new(InFlight::new());
    let (input, pumping) = pump(input);
    let requests = Requests::new(input, in_flight.clone());
    let requests = futures::stream::unfold(requests, |mut requests| async move {
        let bytes = requests.send_next().await?;
        Some((bytes, requests))
    })
    .boxed();
    // Not waited for here: the first requests go out with the opening, and
    // the deadline of the oldest unanswered one covers the opening too. A
    // stream that opens sending nothing must open within OPEN_WITHIN after
    // the wait.
    let open = transport.append_stream(peer.target, &peer.addr, requests);
    let opening = Opened::Opening(
        Box::pin(async move {
            if !wait.is_zero() {
                heard.answer_after(target, since, since + wait).await;
            }
            open.await
        }),
        since + wait + within.max(OPEN_WITHIN),
    );
    let state = (opening, Closing(in_flight, pumping), peer, VecDeque::new());
    let answers = futures::stream::unfold(Some(state), move |state| async move {
        let (mut answers, in_flight, peer, mut ready) = state?;
        let answer = match ready.pop_front() {
            Some(answer) => answer,
            None => {
                let mut riders = Riders::default();
                let answer =
                    next_answer(&mut answers, &in_flight.0, &peer, within, &mut riders).await?;
                match &answer {
                    Ok(carrier) => {
                        ready.extend(riders.answers(carrier).map(Ok));
                        ready.push_back(answer);
                        ready.pop_front()?
                    }
                    Err(_) => answer,
                }
            }
        };
        let go_on = matches!(answer, Ok(Ok(_)));
        Some((answer, go_on.then_some((answers, in_flight, peer, ready))))
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
/// The held appends the answered request carried are left in `riders`.
async fn next_answer(
    answers: &mut Opened,
    in_flight: &InFlight,
    peer: &Peer,
    within: Duration,
    riders: &mut Riders,
) -> Option<Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>> {
    loop {
        let oldest = in_flight.sent.lock().front().map(|sent| sent.at);
        let deadline = tokio::time::sleep_until(oldest.map_or_else(Instant::now, |t| t + within));
        let answer = match answers {
            Opened::Opening(opening, by) => {
                let by = oldest.map_or(*by, |t| (*by).min(t + within));
                tokio::select! {
                    opened = opening => match opened {
                        Ok(open) => {
                            peer.failed_opens.store(0, Ordering::Relaxed);
                            *answers = Opened::Open(open);
                            continue;
                        }
                        Err(e) => {
                            peer.failed_opens.fetch_add(1, Ordering::Relaxed);
                            return Some(Err(peer.transport_error(e)));
                        }
                    },
                    _ = tokio::time::sleep_until(by) => {
                        peer.failed_opens.fetch_add(1, Ordering::Relaxed);
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
        if let Some(sent) = in_flight.sent.lock().pop_front() {
            *riders = sent.riders;
        }
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

/// Held by the answers side: when it is dropped, closes the window (the
/// requests side sends no more) and stops the task reading openraft's
/// requests ([`pump`]).
struct Closing(Arc<InFlight>, AbortHandle);

impl Drop for Closing {
    fn drop(&mut self) {
        self.0.window.close();
        self.1.abort();
    }
}

/// The peer a stream goes to, for its errors and its "heard" mark.
pub(in crate::raft) struct Peer {
    pub target: NodeId,
    pub addr: String,
    pub heard: Arc<Heard>,
    /// Streams to it that failed to open since one last opened, counted
    /// across the sessions of one replication.
    pub failed_opens: Arc<AtomicU32>,
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
pub(in crate::raft) fn serve_stream(
    raft: &Raft,
    requests: impl Stream<Item = Result<Vec<u8>, String>> + Send + Unpin + 'static,
    sender: impl Fn(NodeId) -> Result<(), String> + Send + Sync + 'static,
) -> BoxStream<'static, Result<Vec<u8>, String>> {
    let refused = Arc::new(Mutex::new(None::<String>));
    let me = raft.metrics().borrow_watched().id;
    let input = {
        let refused = refused.clone();
        requests
            .map(move |request| {
                let rpc = request.and_then(|bytes| {
                    let rpc: AppendEntriesRequest<TypeConfig> = decode(&bytes)?;
                    super::not_from_self(me, rpc.vote.leader_id.node_id)?;
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

#[cfg(test)]
mod tests {
    use futures::stream;
    use openraft::raft::StreamAppendError;
    use openraft::EntryPayload;

    use super::*;
    use crate::raft::{CommittedLeaderId, Entry, Vote};

    fn log_id(index: u64) -> LogId {
        LogId::new(
            CommittedLeaderId {
                term: 1,
                node_id: 1,
            },
            index,
        )
    }

    fn id(index: u64) -> Option<LogId> {
        (index > 0).then(|| log_id(index))
    }

    /// An append from leader `term` going on from `prev` with the entries
    /// after it up to `last` (none if `last` is `prev`), and the commit
    /// index `commit`.
    fn append(term: u64, prev: u64, last: u64, commit: u64) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(term, 1),
            prev_log_id: id(prev),
            entries: (prev + 1..=last)
                .map(|index| Entry {
                    log_id: log_id(index),
                    payload: EntryPayload::Blank,
                })
                .collect(),
            leader_commit: id(commit),
        }
    }

    fn requests(
        input: Vec<AppendEntriesRequest<TypeConfig>>,
    ) -> Requests<impl Stream<Item = AppendEntriesRequest<TypeConfig>> + Unpin> {
        Requests::new(
            stream::iter(input).chain(stream::pending()),
            Arc::new(InFlight::new()),
        )
    }

    async fn next(
        requests: &mut Requests<impl Stream<Item = AppendEntriesRequest<TypeConfig>> + Unpin>,
    ) -> (AppendEntriesRequest<TypeConfig>, Riders) {
        tokio::time::timeout(Duration::from_secs(5), requests.next_to_send())
            .await
            .expect("a request to send within 5 s")
            .expect("a request to send")
    }

    #[tokio::test]
    async fn an_append_without_entries_rides_on_the_next_and_is_answered_from_its_answer() {
        let mut requests = requests(vec![
            append(1, 0, 2, 0),
            append(1, 2, 2, 1),
            append(1, 2, 2, 2),
            append(1, 2, 3, 2),
        ]);
        let (first, riders) = next(&mut requests).await;
        assert_eq!((first.entries.len(), riders.count), (2, 0));
        let (second, riders) = next(&mut requests).await;
        assert_eq!(second.prev_log_id, id(2));
        assert_eq!(second.entries.len(), 1);
        assert_eq!((riders.count, riders.prev), (2, id(2)));
        // The follower took entry 3 after 2: it matches up to 2.
        let answers: Vec<_> = riders.answers(&Ok(id(3))).collect();
        assert_eq!(answers, vec![Ok(id(2)), Ok(id(2))]);
    }

    #[test]
    fn riders_are_refused_as_the_append_that_carried_them() {
        let riders = Riders {
            count: 1,
            prev: id(2),
        };
        let conflict = Err(StreamAppendError::Conflict(log_id(2)));
        assert_eq!(
            riders.answers(&conflict).collect::<Vec<_>>(),
            vec![conflict]
        );
        let higher = Err(StreamAppendError::HigherVote(Vote::new(3, 2)));
        assert_eq!(riders.answers(&higher).collect::<Vec<_>>(), vec![higher]);
        // A follower that matched less than the riders' previous entry
        // (it never does) is reported as it answered, not above it.
        assert_eq!(
            riders.answers(&Ok(id(1))).collect::<Vec<_>>(),
            vec![Ok(id(1))]
        );
    }

    #[tokio::test]
    async fn a_held_append_goes_alone_when_nothing_follows_it() {
        let mut requests = requests(vec![append(1, 2, 2, 2)]);
        let (held, riders) = next(&mut requests).await;
        assert_eq!(
            (held.entries.len(), held.leader_commit, riders.count),
            (0, id(2), 0)
        );
    }

    #[tokio::test]
    async fn a_held_append_goes_first_when_the_next_cannot_carry_it() {
        for cannot in [
            // Another leader.
            append(2, 2, 3, 2),
            // Going on from elsewhere.
            append(1, 1, 3, 2),
            // A lower commit index.
            append(1, 2, 3, 1),
        ] {
            let mut requests = requests(vec![append(1, 2, 2, 2), cannot.clone()]);
            let (held, riders) = next(&mut requests).await;
            assert_eq!((held.entries.len(), riders.count), (0, 0));
            let (after, riders) = next(&mut requests).await;
            assert_eq!(
                (
                    after.vote,
                    after.prev_log_id,
                    after.leader_commit,
                    riders.count
                ),
                (cannot.vote, cannot.prev_log_id, cannot.leader_commit, 0)
            );
        }
    }

    #[tokio::test]
    async fn nothing_is_read_from_the_log_until_the_transport_asks() {
        let taken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = taken.clone();
        let input = stream::iter(vec![
            append(1, 0, 2, 0),
            append(1, 2, 3, 0),
            append(1, 3, 4, 0),
        ])
        .inspect(move |_| {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        })
        .chain(stream::pending());
        let (mut requests, pumping) = pump(input);
        // A transport that cannot reach its peer never asks.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(taken.load(std::sync::atomic::Ordering::SeqCst), 0);
        let first = tokio::time::timeout(Duration::from_secs(5), requests.next())
            .await
            .expect("a request within 5 s once asked");
        assert_eq!(first.map(|r| r.entries.len()), Some(2));
        // Once asked, it reads one ahead, no more.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(taken.load(std::sync::atomic::Ordering::SeqCst), 2);
        pumping.abort();
    }

    #[tokio::test]
    async fn a_held_append_goes_when_the_input_ends() {
        let mut requests = Requests::new(
            stream::iter(vec![append(1, 2, 2, 2)]),
            Arc::new(InFlight::new()),
        );
        let (held, _) = next(&mut requests).await;
        assert_eq!(held.leader_commit, id(2));
        assert!(requests.next_to_send().await.is_none());
    }
}
