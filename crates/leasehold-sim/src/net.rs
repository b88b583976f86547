//! The simulated network between hosts: seeded delay and loss, one-way and
//! symmetric cuts, and the inboxes of the nodes that are up.
//!
//! A message is a request and its answer, each leg routed on its own: a cut
//! or a loss on the way there means the request is never delivered; on the
//! way back, that it was served and the caller never hears. Either way the
//! caller waits until its own timeout, as over TCP. A node that is down
//! refuses at once (after the delay), as a closed port does.

use parking_lot::{Mutex, MutexGuard};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use leasehold_core::{Fence, Grant, LeaseId, RequestId};
use leasehold_server::raft::{AnswerStream, NodeId, PeerCall, Transport, TransportError};
use leasehold_server::service::{AcquireArgs, ApiError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{mpsc, oneshot};

/// A call a client makes to a node: the lock service's operations.
#[derive(Debug, Clone)]
pub enum ClientCall {
    /// A new lease.
    Grant {
        /// Its TTL.
        ttl_ms: u64,
        /// Who holds it.
        holder: String,
        /// Makes a retry safe.
        request_id: RequestId,
    },
    /// Renew a lease.
    KeepAlive(LeaseId),
    /// Take (or wait for) a key.
    Acquire(AcquireArgs),
    /// Release a key held with a token.
    Release {
        /// The key.
        key: String,
        /// The holder's token.
        fence: Fence,
        /// Makes a retry safe.
        request_id: RequestId,
    },
    /// Save a checkpoint with a held key.
    SaveCheckpoint {
        /// The key.
        key: String,
        /// The holder's token.
        fence: Fence,
        /// The bytes.
        data: Vec<u8>,
    },
    /// End a lease.
    Revoke(LeaseId),
    /// Who holds a key (a linearizable read).
    Describe(String),
}

/// A node's answer to a [`ClientCall`].
#[derive(Debug, Clone)]
pub enum ClientAnswer {
    /// The lease granted.
    Lease(LeaseId),
    /// Renewed, released or revoked.
    Done,
    /// A key granted.
    Granted(Grant),
    /// The token of a key's holder, if it is held.
    Holder(Option<Fence>),
}

/// What arrives in a node's inbox. The node answers through
/// [`Net::answer_peer`] or [`Net::answer_client`] with the call's id.
pub enum Envelope {
    /// From a peer.
    Peer {
        /// The call's id.
        id: u64,
        /// Which call.
        call: PeerCall,
        /// Encoded request.
        payload: Vec<u8>,
    },
    /// From a client.
    Client {
        /// The call's id.
        id: u64,
        /// The call.
        call: ClientCall,
    },
    /// A stream of appends from a peer: encoded requests in the order sent,
    /// and where the answers go, in the same order.
    Stream {
        /// The requests as they arrive.
        requests: mpsc::UnboundedReceiver<Vec<u8>>,
        /// The answers, sent back as they are made.
        answers: mpsc::UnboundedSender<Result<Vec<u8>, String>>,
    },
}

/// Where a call's answer goes. Kept by the network, not by the node, so
/// that a node's crash fails its callers in the order they called (tokio
/// drops a runtime's tasks in an order that depends on task ids, which are
/// global to the process).
enum Waiting {
    Peer(oneshot::Sender<Result<Vec<u8>, String>>),
    Client(oneshot::Sender<Result<ClientAnswer, ApiError>>),
}

/// How a message fared, counted by kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Legs routed.
    pub sent: u64,
    /// Legs dropped by a cut.
    pub cut: u64,
    /// Legs dropped at random.
    pub lost: u64,
    /// Requests refused because the node was down.
    pub refused: u64,
    /// Of those, streams (of appends) refused.
    pub refused_streams: u64,
    /// Streams (of appends) opened.
    pub streams_opened: u64,
    /// Vote and pre-vote calls made (campaigns).
    pub votes_asked: u64,
}

/// Shared by every host of one world.
#[derive(Clone)]
pub struct Net {
    inner: Arc<Mutex<NetState>>,
}

struct NetState {
    rng: StdRng,
    inboxes: BTreeMap<String, mpsc::UnboundedSender<Envelope>>,
    /// (from, to) pairs whose messages are dropped.
    cuts: BTreeSet<(String, String)>,
    loss: f64,
    delay: (Duration, Duration),
    /// Extra delay on every leg to these hosts.
    slow: BTreeMap<String, Duration>,
    /// Calls delivered and not yet answered, by id: the callee and where
    /// the answer goes.
    waiting: BTreeMap<u64, (String, Waiting)>,
    next_id: u64,
    stats: NetStats,
}

enum Leg {
    Drop,
    After(Duration),
}

/// Why a message got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetError {
    /// The node is down: nothing was delivered.
    Refused,
    /// Delivered, and the node died before answering.
    Reset,
}

impl Net {
    /// A network whose delays and losses come from `seed`.
    pub fn new(seed: u64, delay: (Duration, Duration)) -> Net {
        Net {
            inner: Arc::new(Mutex::new(NetState {
                rng: StdRng::seed_from_u64(seed),
                inboxes: BTreeMap::new(),
                cuts: BTreeSet::new(),
                loss: 0.0,
                delay,
                slow: BTreeMap::new(),
                waiting: BTreeMap::new(),
                next_id: 0,
                stats: NetStats::default(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, NetState> {
        self.inner.lock()
    }

    /// Opens `addr`'s inbox (a node starting).
    pub fn listen(&self, addr: &str) -> mpsc::UnboundedReceiver<Envelope> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.lock().inboxes.insert(addr.to_string(), tx);
        rx
    }

    /// Closes `addr`'s inbox (a node dying): every call it had not
    /// answered fails, in the order the calls were made.
    pub fn close(&self, addr: &str) {
        let mut state = self.lock();
        state.inboxes.remove(addr);
        let gone: Vec<u64> = state
            .waiting
            .iter()
            .filter(|(_, (to, _))| to == addr)
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            state.waiting.remove(&id);
        }
    }

    /// A node's answer to peer call `id`.
    pub fn answer_peer(&self, id: u64, answer: Result<Vec<u8>, String>) {
        if let Some((_, Waiting::Peer(tx))) = self.lock().waiting.remove(&id) {
            let _ = tx.send(answer);
        }
    }

    /// A node's answer to client call `id`.
    pub fn answer_client(&self, id: u64, answer: Result<ClientAnswer, ApiError>) {
        if let Some((_, Waiting::Client(tx))) = self.lock().waiting.remove(&id) {
            let _ = tx.send(answer);
        }
    }

    /// Drops every message from `from` to `to` until [`Net::heal`].
    pub fn cut(&self, from: &str, to: &str) {
        self.lock().cuts.insert((from.to_string(), to.to_string()));
    }

    /// Lifts every cut and every slowdown.
    pub fn heal(&self) {
        let mut state = self.lock();
        state.cuts.clear();
        state.slow.clear();
    }

    /// Slows every leg to `to` by `extra`, until [`Net::heal`].
    pub fn slow_down(&self, to: &str, extra: Duration) {
        self.lock().slow.insert(to.to_string(), extra);
    }

    /// Sets the share of legs lost at random.
    pub fn set_loss(&self, loss: f64) {
        self.lock().loss = loss;
    }

    /// Sets the range each leg's delay is drawn from.
    pub fn set_delay(&self, delay: (Duration, Duration)) {
        self.lock().delay = delay;
    }

    /// The range each leg's delay is drawn from now.
    pub fn delay(&self) -> (Duration, Duration) {
        self.lock().delay
    }

    /// Counts so far.
    pub fn stats(&self) -> NetStats {
        self.lock().stats.clone()
    }

    fn leg(&self, from: &str, to: &str) -> Leg {
        let mut state = self.lock();
        state.stats.sent += 1;
        if state.cuts.contains(&(from.to_string(), to.to_string())) {
            state.stats.cut += 1;
            return Leg::Drop;
        }
        let loss = state.loss;
        if loss > 0.0 && state.rng.gen_bool(loss) {
            state.stats.lost += 1;
            return Leg::Drop;
        }
        let (low, high) = state.delay;
        let delay = if high > low {
            state.rng.gen_range(low..=high)
        } else {
            low
        };
        let extra = state.slow.get(to).copied().unwrap_or_default();
        Leg::After(delay + extra)
    }

    async fn travel(&self, from: &str, to: &str) {
        match self.leg(from, to) {
            Leg::Drop => futures::future::pending::<()>().await,
            Leg::After(delay) => tokio::time::sleep(delay).await,
        }
    }

    /// Sends a message one way (a write to the resource): true once it
    /// arrived, false once the sender gave up on it (`patience` after a drop).
    pub async fn arrive(&self, from: &str, to: &str, patience: Duration) -> bool {
        match self.leg(from, to) {
            Leg::Drop => {
                tokio::time::sleep(patience).await;
                false
            }
            Leg::After(delay) => {
                tokio::time::sleep(delay).await;
                true
            }
        }
    }

    /// Delivers a call to `to`'s inbox and waits for the answer. Never
    /// returns if either leg is dropped: the caller bounds the wait.
    async fn exchange<T>(
        &self,
        from: &str,
        to: &str,
        envelope: impl FnOnce(u64) -> Envelope,
        waiting: impl FnOnce(oneshot::Sender<T>) -> Waiting,
    ) -> Result<T, NetError> {
        self.travel(from, to).await;
        let (tx, rx) = oneshot::channel();
        let delivered = {
            let mut state = self.lock();
            let id = state.next_id;
            state.next_id += 1;
            let sent = state
                .inboxes
                .get(to)
                .is_some_and(|inbox| inbox.send(envelope(id)).is_ok());
            if sent {
                state.waiting.insert(id, (to.to_string(), waiting(tx)));
            } else {
                state.stats.refused += 1;
            }
            sent
        };
        if !delivered {
            return Err(NetError::Refused);
        }
        let answer = rx.await.map_err(|_| NetError::Reset)?;
        self.travel(to, from).await;
        Ok(answer)
    }

    /// Opens an ordered stream from `from` to `to`, as one TCP connection
    /// carries one: each message takes its own seeded delay but never passes
    /// the one before it, so several are in flight at once. A dropped
    /// message stalls that direction for good (the caller's deadline ends
    /// the stream, as over TCP); a node that dies ends its side. Never
    /// returns if the opening leg is dropped.
    async fn open_stream(
        &self,
        from: &str,
        to: &str,
        requests: futures::stream::BoxStream<'static, Vec<u8>>,
    ) -> Result<mpsc::UnboundedReceiver<Result<Vec<u8>, String>>, NetError> {
        self.travel(from, to).await;
        let (to_node, at_node) = mpsc::unbounded_channel();
        let (from_node, back) = mpsc::unbounded_channel();
        let delivered = {
            let mut state = self.lock();
            let sent = state.inboxes.get(to).is_some_and(|inbox| {
                inbox
                    .send(Envelope::Stream {
                        requests: at_node,
                        answers: from_node,
                    })
                    .is_ok()
            });
            if sent {
                state.stats.streams_opened += 1;
            } else {
                state.stats.refused += 1;
                state.stats.refused_streams += 1;
            }
            sent
        };
        if !delivered {
            return Err(NetError::Refused);
        }
        let (answers, at_caller) = mpsc::unbounded_channel();
        tokio::spawn(
            self.clone()
                .pipe(from.to_string(), to.to_string(), requests, to_node),
        );
        let back = tokio_stream_of(back);
        tokio::spawn(
            self.clone()
                .pipe(to.to_string(), from.to_string(), back, answers),
        );
        Ok(at_caller)
    }

    /// Carries `input` from `from` to `to` into `output`, in order, each
    /// message after its own delay (never before the one ahead of it).
    async fn pipe<T: Send + 'static>(
        self,
        from: String,
        to: String,
        mut input: futures::stream::BoxStream<'static, T>,
        output: mpsc::UnboundedSender<T>,
    ) {
        use futures::StreamExt;
        let (timed, mut arriving) = mpsc::unbounded_channel::<(tokio::time::Instant, T)>();
        // Ends when the sender ends the stream (after what is on the way
        // arrived) or the receiver drops it; a dropped message stalls it.
        let deliver = async {
            loop {
                tokio::select! {
                    next = arriving.recv() => {
                        let Some((at, message)) = next else { return };
                        tokio::time::sleep_until(at).await;
                        if output.send(message).is_err() {
                            return;
                        }
                    }
                    () = output.closed() => return,
                }
            }
        };
        let send = async {
            let mut last = tokio::time::Instant::now();
            while let Some(message) = input.next().await {
                match self.leg(&from, &to) {
                    Leg::Drop => {
                        futures::future::pending::<()>().await;
                    }
                    Leg::After(delay) => {
                        last = last.max(tokio::time::Instant::now() + delay);
                        if timed.send((last, message)).is_err() {
                            return;
                        }
                    }
                }
            }
            drop(timed);
            futures::future::pending::<()>().await;
        };
        tokio::select! {
            () = deliver => {}
            () = send => {}
        }
    }

    /// A client's call to node `to`.
    pub async fn call_node(
        &self,
        from: &str,
        to: &str,
        call: ClientCall,
    ) -> Result<Result<ClientAnswer, ApiError>, NetError> {
        self.exchange(
            from,
            to,
            |id| Envelope::Client { id, call },
            Waiting::Client,
        )
        .await
    }
}

/// A node's transport to its peers over the simulated network.
pub struct SimTransport {
    /// The sending node's address.
    pub from: String,
    /// The network.
    pub net: Net,
}

/// A channel's receiving end as a stream.
fn tokio_stream_of<T: Send + 'static>(
    mut rx: mpsc::UnboundedReceiver<T>,
) -> futures::stream::BoxStream<'static, T> {
    Box::pin(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)))
}

impl Transport for SimTransport {
    fn call(
        &self,
        _to: NodeId,
        addr: &str,
        call: PeerCall,
        payload: Vec<u8>,
    ) -> BoxFuture<'static, Result<Vec<u8>, TransportError>> {
        if matches!(call, PeerCall::Vote | PeerCall::PreVote) {
            self.net.lock().stats.votes_asked += 1;
        }
        let (net, from, to) = (self.net.clone(), self.from.clone(), addr.to_string());
        Box::pin(async move {
            let answer = net
                .exchange(
                    &from,
                    &to,
                    |id| Envelope::Peer { id, call, payload },
                    Waiting::Peer,
                )
                .await;
            match answer {
                Ok(Ok(bytes)) => Ok(bytes),
                Ok(Err(e)) => Err(TransportError::Failed(e)),
                Err(NetError::Refused) => Err(TransportError::Unreachable(format!("{to} is down"))),
                Err(NetError::Reset) => Err(TransportError::Failed(format!("{to} died"))),
            }
        })
    }

    fn streams_appends(&self) -> bool {
        true
    }

    fn append_stream(
        &self,
        _to: NodeId,
        addr: &str,
        requests: futures::stream::BoxStream<'static, Vec<u8>>,
    ) -> BoxFuture<'static, Result<AnswerStream, TransportError>> {
        let (net, from, to) = (self.net.clone(), self.from.clone(), addr.to_string());
        Box::pin(async move {
            match net.open_stream(&from, &to, requests).await {
                Ok(answers) => {
                    let answers = tokio_stream_of(answers);
                    Ok(Box::pin(futures::StreamExt::map(answers, |answer| {
                        answer.map_err(TransportError::Failed)
                    })) as AnswerStream)
                }
                Err(_) => Err(TransportError::Unreachable(format!("{to} is down"))),
            }
        })
    }
}
