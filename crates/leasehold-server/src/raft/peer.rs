//! Raft between nodes: the calls, encoded once, and the [`Transport`] that
//! carries them: the `leasehold.raft.v1.RaftPeer` gRPC service
//! (`proto/raft.proto`) on each node's one port between processes
//! ([`super::grpc`]), or a simulated network inside one process.
//!
//! Each call carries one openraft request or response, bincode-encoded
//! (every node of a cluster runs the same build). Appends go as a stream,
//! several in flight ([`super::append_stream`]); between processes without
//! peer certificates, as frames on a connection of their own
//! ([`super::framed`]). Snapshots go in chunks of
//! at most 3 MiB (openraft's `snapshot_max_chunk_size`), so a snapshot of a
//! million held locks crosses as a few dozen calls. A call is cut off at the
//! soft deadline openraft gives it; a peer that cannot be connected to is
//! reported unreachable, and openraft backs off from it (100, 200, 400 ms,
//! then every 500 ms). A node that listens on a specific address makes its
//! connections to peers from that address too, so a peer (or a
//! fault-injecting proxy in front of it) can tell the nodes apart by their
//! source address.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::StreamExt;
use openraft::async_runtime::WatchReceiver;
use openraft::errors::{
    Fatal, NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::v2::RaftNetworkV2;
use openraft::network::{stream_append_sequential, Backoff, RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::OptionalSend;
use prometheus_client::metrics::counter::Counter;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::append_stream::{pipelined, serve_stream, Peer};
use super::format;
use super::hash_check::TableMarks;
pub(super) use super::snapshot_chunks::IncomingSnapshot;
use super::snapshot_chunks::{receive_chunk, SnapshotChunk};
use super::{Consensus, Node, NodeId, Raft, Snapshot, SnapshotData, TypeConfig, Vote};

/// The largest message between peers: an append of 64 entries of up to
/// 1,024 commands each, or one 3 MiB snapshot chunk, fits with room.
pub(super) const MAX_MESSAGE: usize = 64 * 1024 * 1024;
/// Time to connect to a peer.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a probe waits for its answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

fn codec() -> impl bincode::Options {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_limit(MAX_MESSAGE as u64)
}

/// A message for a peer: [`format::peer_header`], then bincode.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, String> {
    use bincode::Options;
    let mut out = format::peer_header().to_vec();
    codec()
        .serialize_into(&mut out, value)
        .map_err(|e| format!("encode: {e}"))?;
    Ok(out)
}

/// A message from a peer, refused if its format is not this build's.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    use bincode::Options;
    codec()
        .deserialize(format::unframe_peer_message(bytes)?)
        .map_err(|e| format!("not a raft message: {e}"))
}

/// A call from one node to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerCall {
    /// Raft's append-entries (and heartbeat).
    Append,
    /// Raft's request for a vote.
    Vote,
    /// Whether the peer would vote for this node, asked before campaigning.
    PreVote,
    /// One chunk of a snapshot ([`SnapshotChunk`]).
    Snapshot,
    /// The leader hands leadership to the peer.
    TransferLeader,
    /// What a node says of itself ([`ProbeReply`]), asked while forming a
    /// group and before a membership change.
    Probe,
    /// A node's latest membership ([`MembershipReply`]).
    Membership,
    /// A node's latest table hash (`hash_check::Mark`).
    TableMark,
}

/// How a call to a peer failed before an answer came back.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TransportError {
    /// The peer could not be reached; the call was not delivered.
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// Delivered or not, no answer came back.
    #[error("{0}")]
    Failed(String),
}

/// Carries encoded calls to peers. Between processes this is gRPC
/// ([`GrpcTransport`]); a simulation carries them over its own network.
pub trait Transport: Send + Sync + 'static {
    /// Sends `payload` as `call` to node `to` at `addr` and returns its
    /// answer, encoded. The caller bounds how long it waits.
    fn call(
        &self,
        to: NodeId,
        addr: &str,
        call: PeerCall,
        payload: Vec<u8>,
    ) -> BoxFuture<'static, Result<Vec<u8>, TransportError>>;

    /// Whether [`Transport::append_stream`] works; without it appends go
    /// one call at a time.
    fn streams_appends(&self) -> bool {
        false
    }

    /// Opens a stream of appends to node `to` at `addr`: each of `requests`
    /// is delivered in order, and the answers come back in the same order.
    fn append_stream(
        &self,
        _to: NodeId,
        _addr: &str,
        _requests: futures::stream::BoxStream<'static, Vec<u8>>,
    ) -> BoxFuture<'static, Result<AnswerStream, TransportError>> {
        Box::pin(std::future::ready(Err(TransportError::Failed(
            "this transport carries no streams".into(),
        ))))
    }
}

/// What openraft takes back from a stream of appends.
type AppendAnswers<'s> = openraft::base::BoxStream<
    's,
    Result<openraft::raft::StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>,
>;

/// The answers of a stream of appends, in the order of the requests.
pub type AnswerStream = futures::stream::BoxStream<'static, Result<Vec<u8>, TransportError>>;

/// What a node says of itself to a peer forming a group.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbeReply {
    /// Whether it belongs to a group: it holds a log entry or a snapshot
    /// (a vote alone does not count).
    pub initialized: bool,
    /// Its current term.
    pub term: u64,
    /// The leader it knows of.
    pub leader: Option<NodeId>,
}

/// A node's latest membership, as it answers a peer that asks.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MembershipReply {
    /// The log index of the entry that made it (`None`: never one).
    pub index: Option<u64>,
    /// Whether that entry is committed (applied here).
    pub committed: bool,
    /// Its voters and learners.
    pub members: Vec<NodeId>,
}

impl Consensus {
    /// Answers a call from a peer: the encoded answer, or why the call
    /// could not be served. Every transport's server end calls this.
    pub async fn serve_peer(&self, call: PeerCall, payload: &[u8]) -> Result<Vec<u8>, String> {
        let marks = &self.shared.marks;
        serve(&self.raft, &self.incoming, marks, call, payload, |_| Ok(())).await
    }

    /// Serves a stream of appends from a peer (every transport's server
    /// end of [`Transport::append_stream`]): answers in the order of the
    /// requests.
    pub fn serve_append_stream(
        &self,
        requests: futures::stream::BoxStream<'static, Vec<u8>>,
    ) -> futures::stream::BoxStream<'static, Result<Vec<u8>, String>> {
        serve_stream(&self.raft, requests.map(Ok), |_| Ok(()))
    }

    /// Asks node `id` at `addr` about itself; `None` if it does not answer soon.
    pub(super) async fn probe(&self, id: NodeId, addr: &str) -> Option<ProbeReply> {
        let call = self.transport.call(id, addr, PeerCall::Probe, Vec::new());
        let reply = tokio::time::timeout(PROBE_TIMEOUT, call).await.ok()?.ok()?;
        decode(&reply).ok()
    }

    /// Asks node `id` at `addr` for its latest membership; `None` if it does
    /// not answer soon (or is of a build that does not know the call).
    pub(super) async fn membership_of(&self, id: NodeId, addr: &str) -> Option<MembershipReply> {
        let call = self
            .transport
            .call(id, addr, PeerCall::Membership, Vec::new());
        let reply = tokio::time::timeout(PROBE_TIMEOUT, call).await.ok()?.ok()?;
        decode(&reply).ok()
    }
}

/// Refuses a call that says it comes from this node itself: the cluster
/// lists this node's address under another id too (added twice), so it is
/// calling itself, and openraft would take its own append as another
/// leader's (it asserts against that, and the node would stop).
pub(super) fn not_from_self(me: NodeId, from: NodeId) -> Result<(), String> {
    if from == me {
        return Err(format!(
            "a raft call from node {me} to itself: the cluster lists this node's address under another id too; remove that member"
        ));
    }
    Ok(())
}

/// Serves one call; `sender` checks that the node the call says it comes
/// from (the leader or candidate in its vote) may send it.
pub(super) async fn serve(
    raft: &Raft,
    incoming: &IncomingSnapshot,
    marks: &TableMarks,
    call: PeerCall,
    payload: &[u8],
    sender: impl Fn(NodeId) -> Result<(), String>,
) -> Result<Vec<u8>, String> {
    let me = raft.metrics().borrow_watched().id;
    let sender = |from: NodeId| {
        not_from_self(me, from)?;
        sender(from)
    };
    match call {
        PeerCall::Append => {
            let rpc: AppendEntriesRequest<TypeConfig> = decode(payload)?;
            sender(rpc.vote.leader_id.node_id)?;
            encode(&raft.append_entries(rpc).await)
        }
        PeerCall::Vote => {
            let rpc: VoteRequest<TypeConfig> = decode(payload)?;
            sender(rpc.vote.leader_id.node_id)?;
            encode(&raft.vote(rpc).await)
        }
        PeerCall::PreVote => {
            let rpc: VoteRequest<TypeConfig> = decode(payload)?;
            sender(rpc.vote.leader_id.node_id)?;
            encode(&raft.pre_vote(rpc).await)
        }
        PeerCall::Snapshot => {
            let chunk: SnapshotChunk = decode(payload)?;
            sender(chunk.vote.leader_id.node_id)?;
            let answer: Result<Option<SnapshotResponse<TypeConfig>>, Fatal<TypeConfig>> =
                match receive_chunk(incoming, chunk)? {
                    Some((vote, snapshot)) => {
                        raft.install_full_snapshot(vote, snapshot).await.map(Some)
                    }
                    None => Ok(None),
                };
            encode(&answer)
        }
        PeerCall::TransferLeader => {
            let rpc: TransferLeaderRequest<TypeConfig> = decode(payload)?;
            sender(rpc.from_leader().leader_id.node_id)?;
            encode(&raft.handle_transfer_leader(rpc).await)
        }
        PeerCall::Probe => {
            let m = raft.metrics().borrow_watched().clone();
            // A node whose Raft stopped is not up, whatever it holds.
            m.running_state.as_ref().map_err(|e| e.to_string())?;
            encode(&ProbeReply {
                // An entry or a snapshot, not only a vote: a node that voted
                // for the first candidate and got none of its entries holds
                // none of the group's state (openraft's `is_initialized`
                // counts the vote; the term says it voted). The metrics hold
                // the loaded state: starting a node waits for its Raft's
                // `is_initialized`, which its core answers after publishing
                // them, before the peer service is started.
                initialized: m.last_log_index.is_some(),
                term: m.current_term,
                leader: m.current_leader,
            })
        }
        PeerCall::TableMark => encode(&marks.latest()),
        PeerCall::Membership => {
            let m = raft.metrics().borrow_watched().clone();
            let index = m.membership_config.log_id().as_ref().map(|l| l.index);
            let applied = m.last_applied.as_ref().map(|l| l.index);
            encode(&MembershipReply {
                index,
                committed: index.is_some() && index <= applied,
                members: m
                    .membership_config
                    .membership()
                    .nodes()
                    .map(|(id, _)| *id)
                    .collect(),
            })
        }
    }
}

/// When each peer last answered one of this node's Raft calls: on the
/// leader, which members it hears from (a heartbeat goes every
/// `--heartbeat`, so a member heard from long ago is cut off or down).
pub(super) struct Heard {
    /// A member unheard for longer than this is reported unreachable.
    pub within: Duration,
    last: Mutex<HashMap<NodeId, tokio::time::Instant>>,
}

impl Heard {
    /// Reports a member unheard for longer than `within` as unreachable.
    pub fn new(within: Duration) -> Heard {
        Heard {
            within,
            last: Mutex::default(),
        }
    }

    pub(super) fn answered(&self, peer: NodeId) {
        let now = tokio::time::Instant::now();
        self.last.lock().insert(peer, now);
    }

    /// How long ago `peer` last answered; `None` if it never has.
    pub fn since(&self, peer: NodeId) -> Option<Duration> {
        let last = *self.last.lock().get(&peer)?;
        Some(last.elapsed())
    }
}

/// openraft's view of the peers: one [`PeerClient`] per peer, made as it
/// needs them, all over one transport.
#[derive(Clone)]
pub(super) struct PeerNetwork {
    pub transport: Arc<dyn Transport>,
    /// Counts the snapshot chunks sent (a metric).
    pub snapshot_chunks: Counter,
    /// When each peer last answered.
    pub heard: Arc<Heard>,
    /// Snapshots sent so far (see [`PeerClient`]).
    pub snapshots_sent: Arc<std::sync::atomic::AtomicU64>,
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> PeerClient {
        PeerClient {
            target,
            addr: node.addr.clone(),
            transport: self.transport.clone(),
            snapshot_chunks: self.snapshot_chunks.clone(),
            snapshots_sent: self.snapshots_sent.clone(),
            heard: self.heard.clone(),
        }
    }
}

/// Calls one peer.
pub(super) struct PeerClient {
    target: NodeId,
    addr: String,
    transport: Arc<dyn Transport>,
    snapshot_chunks: Counter,
    /// Snapshots this node started sending, to tell the sendings apart.
    snapshots_sent: Arc<std::sync::atomic::AtomicU64>,
    heard: Arc<Heard>,
}

#[derive(Debug, thiserror::Error)]
#[error("peer {target} at {addr}: {message}")]
pub(super) struct PeerError {
    pub target: NodeId,
    pub addr: String,
    pub message: String,
}

impl PeerClient {
    fn error(&self, message: String) -> PeerError {
        PeerError {
            target: self.target,
            addr: self.addr.clone(),
            message,
        }
    }

    /// Sends `request` and decodes the answer, waiting at most `within`.
    /// A peer whose Raft answers with an error (it has stopped) counts as
    /// unreachable: openraft backs off from it as from one that is down.
    async fn call<Req, Resp, E>(
        &mut self,
        call: PeerCall,
        request: &Req,
        within: Duration,
    ) -> Result<Resp, RPCError<TypeConfig>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned + 'static,
    {
        let network = |this: &Self, message: String| {
            RPCError::Network(NetworkError::new(&this.error(message)))
        };
        let payload = encode(request).map_err(|m| network(self, m))?;
        let sent = self.transport.call(self.target, &self.addr, call, payload);
        let reply = match tokio::time::timeout(within, sent).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(TransportError::Unreachable(message))) => {
                return Err(RPCError::Unreachable(Unreachable::new(
                    &self.error(message),
                )))
            }
            Ok(Err(TransportError::Failed(message))) => return Err(network(self, message)),
            Err(_) => return Err(network(self, format!("no answer within {within:?}"))),
        };
        let answer: Result<Resp, E> = decode(&reply).map_err(|m| network(self, m))?;
        match answer {
            // Any answer of its Raft, a refusal included, shows the peer up.
            Ok(answer) => {
                self.heard.answered(self.target);
                Ok(answer)
            }
            Err(e) => Err(RPCError::Unreachable(Unreachable::new(
                &self.error(e.to_string()),
            ))),
        }
    }
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = SnapshotData;

    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<'s, Result<AppendAnswers<'s>, RPCError<TypeConfig>>>
    where
        S: futures::Stream<Item = AppendEntriesRequest<TypeConfig>>
            + OptionalSend
            + Unpin
            + 'static,
    {
        // A stream of one request (openraft's heartbeats are) goes as one
        // call: opening a stream for it would cost more than it saves.
        let at_most_one = matches!(input.size_hint().1, Some(n) if n <= 1);
        if at_most_one || !self.transport.streams_appends() {
            return stream_append_sequential(self, input, option);
        }
        let peer = Peer {
            target: self.target,
            addr: self.addr.clone(),
            heard: self.heard.clone(),
        };
        let opened = pipelined(&*self.transport, peer, input, option);
        Box::pin(async move { opened.await.map(|answers| answers as AppendAnswers<'s>) })
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call::<_, _, RaftError<TypeConfig>>(PeerCall::Append, &rpc, option.soft_ttl())
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call::<_, _, RaftError<TypeConfig>>(PeerCall::Vote, &rpc, option.soft_ttl())
            .await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call::<_, _, RaftError<TypeConfig>>(PeerCall::PreVote, &rpc, option.soft_ttl())
            .await
    }

    /// Sends the snapshot in chunks of at most `--snapshot-chunk-bytes`, each
    /// with the time openraft allows a whole install, and stops at once when
    /// replication to this peer ends.
    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl std::future::Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let size = option.snapshot_chunk_size().unwrap_or(3 << 20).max(1);
        let within = option.hard_ttl();
        let Snapshot { meta, snapshot } = snapshot;
        let total = snapshot.len();
        let mut cancel = std::pin::pin!(cancel);
        let sending = self
            .snapshots_sent
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut offset = 0;
        loop {
            let end = (offset + size).min(total);
            let chunk = SnapshotChunk {
                vote,
                meta: meta.clone(),
                sending,
                offset: offset as u64,
                data: snapshot[offset..end].to_vec(),
                done: end == total,
            };
            self.snapshot_chunks.inc();
            let answer = tokio::select! {
                closed = &mut cancel => return Err(StreamingError::Closed(closed)),
                answer = self.call::<_, Option<SnapshotResponse<TypeConfig>>, Fatal<TypeConfig>>(
                    PeerCall::Snapshot,
                    &chunk,
                    within,
                ) => answer?,
            };
            // An answer before the end: the peer refused (a newer vote).
            if let Some(answer) = answer {
                return Ok(answer);
            }
            if end == total {
                return Err(StreamingError::Network(NetworkError::new(&self.error(
                    "the last snapshot chunk was not answered with an install".into(),
                ))));
            }
            offset = end;
        }
    }

    async fn transfer_leader(
        &mut self,
        rpc: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        // The whole time openraft allows: the peer first waits for its log
        // to hold the leader's last entry.
        self.call::<_, _, Fatal<TypeConfig>>(PeerCall::TransferLeader, &rpc, option.hard_ttl())
            .await
    }

    /// 100, 200, 400 ms, then every 500 ms: a restarted peer hears from the
    /// leader within half a second (see `node::allow_elections`).
    fn backoff(&self) -> Option<Backoff> {
        Some(Backoff::new((0..).map(|i: u32| {
            Duration::from_millis((100u64 << i.min(3)).min(500))
        })))
    }
}
