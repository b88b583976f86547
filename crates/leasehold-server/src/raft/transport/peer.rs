//! Both ends of Raft's calls between nodes: openraft's network, which
//! sends each call over a [`Transport`] and decodes its answer (a stream of
//! appends where the transport has one), and the dispatch of a call that
//! arrives to the local Raft node.

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
use serde::Serialize;

use super::append_stream::{pipelined, serve_stream, Peer};
use super::snapshot_chunks::{receive_chunk, IncomingSnapshot, SnapshotChunk};
use super::{
    decode, encode, not_from_self, Heard, MembershipReply, PeerCall, PeerError, ProbeReply,
    Transport, TransportError,
};
use crate::raft::state_machine::marks::TableMarks;
use crate::raft::{Consensus, Node, NodeId, Raft, Snapshot, SnapshotData, TypeConfig, Vote};

/// How long a probe waits for its answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// What openraft takes back from a stream of appends.
type AppendAnswers<'s> = openraft::base::BoxStream<
    's,
    Result<openraft::raft::StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>,
>;

/// The server end of Raft's calls between nodes, over this node's Raft
/// ([`Consensus::peers`]): every transport's server end (gRPC, framed
/// streams, a simulation's network) answers through it.
#[derive(Clone, Copy)]
pub struct PeerEndpoint<'a> {
    pub(super) consensus: &'a Consensus,
}

impl PeerEndpoint<'_> {
    /// Answers a call from a peer: the encoded answer, or why the call
    /// could not be served. Every transport's server end calls this.
    pub async fn serve(self, call: PeerCall, payload: &[u8]) -> Result<Vec<u8>, String> {
        let marks = &self.consensus.shared.marks;
        serve(
            &self.consensus.raft,
            &self.consensus.incoming,
            marks,
            call,
            payload,
            |_| Ok(()),
        )
        .await
    }

    /// Serves a stream of appends from a peer (every transport's server
    /// end of [`Transport::append_stream`]): answers in the order of the
    /// requests.
    pub fn serve_append_stream(
        self,
        requests: futures::stream::BoxStream<'static, Vec<u8>>,
    ) -> futures::stream::BoxStream<'static, Result<Vec<u8>, String>> {
        serve_stream(&self.consensus.raft, requests.map(Ok), |_| Ok(()))
    }
}

impl Consensus {
    /// The server end of the calls peers make to this node.
    pub fn peers(&self) -> PeerEndpoint<'_> {
        PeerEndpoint { consensus: self }
    }

    /// Asks node `id` at `addr` about itself; `None` if it does not answer soon.
    pub(in crate::raft) async fn probe(&self, id: NodeId, addr: &str) -> Option<ProbeReply> {
        let call = self.transport.call(id, addr, PeerCall::Probe, Vec::new());
        let reply = tokio::time::timeout(PROBE_TIMEOUT, call).await.ok()?.ok()?;
        decode(&reply).ok()
    }

    /// Asks node `id` at `addr` for its latest membership; `None` if it does
    /// not answer soon (or is of a build that does not know the call).
    pub(in crate::raft) async fn membership_of(
        &self,
        id: NodeId,
        addr: &str,
    ) -> Option<MembershipReply> {
        let call = self
            .transport
            .call(id, addr, PeerCall::Membership, Vec::new());
        let reply = tokio::time::timeout(PROBE_TIMEOUT, call).await.ok()?.ok()?;
        decode(&reply).ok()
    }
}

/// Serves one call; `sender` checks that the node the call says it comes
/// from (the leader or candidate in its vote) may send it.
pub(in crate::raft) async fn serve(
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

/// openraft's view of the peers: one [`PeerClient`] per peer, made as it
/// needs them, all over one transport.
#[derive(Clone)]
pub(in crate::raft) struct PeerNetwork {
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
            failed_opens: Arc::default(),
        }
    }
}

/// How long to wait before trying a peer again after `failures` (at least
/// one) tries in a row failed: 100, 200, 400 ms, then every 500 ms. A peer
/// that is down costs the leader a few tries a second.
pub(in crate::raft) fn retry_after(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(3);
    Duration::from_millis((100u64 << doublings).min(500))
}

/// Calls one peer.
pub(in crate::raft) struct PeerClient {
    target: NodeId,
    addr: String,
    transport: Arc<dyn Transport>,
    snapshot_chunks: Counter,
    /// Snapshots this node started sending, to tell the sendings apart.
    snapshots_sent: Arc<std::sync::atomic::AtomicU64>,
    heard: Arc<Heard>,
    /// Its streams of appends that failed to open in a row.
    failed_opens: Arc<std::sync::atomic::AtomicU32>,
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
            failed_opens: self.failed_opens.clone(),
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

    /// 100, 200, 400 ms, then every 500 ms (see [`retry_after`]).
    fn backoff(&self) -> Option<Backoff> {
        Some(Backoff::new((1..).map(retry_after)))
    }
}
