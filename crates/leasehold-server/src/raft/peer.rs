//! Raft between nodes: the calls, encoded once, and the [`Transport`] that
//! carries them: the `leasehold.raft.v1.RaftPeer` gRPC service
//! (`proto/raft.proto`) on each node's one port between processes
//! ([`GrpcTransport`]), or a simulated network inside one process.
//!
//! Each call carries one openraft request or response, bincode-encoded
//! (every node of a cluster runs the same build). Snapshots go in chunks of
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
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use leasehold_proto::raft::raft_peer_client::RaftPeerClient;
use leasehold_proto::raft::raft_peer_server::{RaftPeer, RaftPeerServer};
use leasehold_proto::raft::PeerMessage;
use openraft::async_runtime::WatchReceiver;
use openraft::errors::{
    Fatal, NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::v2::RaftNetworkV2;
use openraft::network::{Backoff, RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::OptionalSend;
use prometheus_client::metrics::counter::Counter;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::{Request, Response, Status};

use crate::tls::{names_node, peer_name, PeerCertificate, PeerFiles, Tls};

pub(super) use super::snapshot_chunks::IncomingSnapshot;
use super::snapshot_chunks::{receive_chunk, SnapshotChunk};
use super::{Consensus, Node, NodeId, Raft, Snapshot, SnapshotData, TypeConfig, Vote};

/// The largest message between peers: an append of 64 entries of up to
/// 1,024 commands each, or one 3 MiB snapshot chunk, fits with room.
const MAX_MESSAGE: usize = 64 * 1024 * 1024;
/// Time to connect to a peer.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a probe waits for its answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

fn codec() -> impl bincode::Options {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_limit(MAX_MESSAGE as u64)
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, String> {
    use bincode::Options;
    codec().serialize(value).map_err(|e| format!("encode: {e}"))
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    use bincode::Options;
    codec()
        .deserialize(bytes)
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
}

/// What a node says of itself to a peer forming a group.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbeReply {
    /// Whether it belongs to an initialized group.
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
        serve(&self.raft, &self.incoming, call, payload, |_| Ok(())).await
    }

    /// The gRPC peer service to serve beside the client API; with
    /// `require_certificates`, it answers a Raft call only over a connection
    /// whose peer certificate names the node the call comes from.
    pub fn peer_service(&self, require_certificates: bool) -> RaftPeerServer<PeerService> {
        RaftPeerServer::new(PeerService {
            raft: self.raft.clone(),
            incoming: self.incoming.clone(),
            require_certificates,
        })
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
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

/// Serves one call; `sender` checks that the node the call says it comes
/// from (the leader or candidate in its vote) may send it.
async fn serve(
    raft: &Raft,
    incoming: &IncomingSnapshot,
    call: PeerCall,
    payload: &[u8],
    sender: impl Fn(NodeId) -> Result<(), String>,
) -> Result<Vec<u8>, String> {
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
            let initialized = raft.is_initialized().await.map_err(|e| e.to_string())?;
            let m = raft.metrics().borrow_watched().clone();
            encode(&ProbeReply {
                initialized,
                term: m.current_term,
                leader: m.current_leader,
            })
        }
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

/// The gRPC server end, over this node's Raft.
pub struct PeerService {
    raft: Raft,
    incoming: IncomingSnapshot,
    require_certificates: bool,
}

impl PeerService {
    async fn answer(
        &self,
        call: PeerCall,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        let certificate = request.extensions().get::<PeerCertificate>().cloned();
        if self.require_certificates && certificate.is_none() {
            return Err(Status::unauthenticated(
                "raft calls need a connection with a peer certificate (mutual TLS under the peer CA)",
            ));
        }
        let refused = std::sync::OnceLock::new();
        let sender = |id: NodeId| match &certificate {
            Some(cert) if !names_node(cert, id) => {
                let why = format!(
                    "the peer certificate does not name node {id} ({}), the node this call comes from",
                    peer_name(id)
                );
                tracing::warn!(node = id, "refused a raft call: {why}");
                let _ = refused.set(why.clone());
                Err(why)
            }
            _ => Ok(()),
        };
        let payload = &request.get_ref().bincode;
        match serve(&self.raft, &self.incoming, call, payload, sender).await {
            Ok(bincode) => Ok(Response::new(PeerMessage { bincode })),
            Err(e) if refused.get().is_some() => Err(Status::permission_denied(e)),
            Err(e) => Err(Status::invalid_argument(e)),
        }
    }
}

#[tonic::async_trait]
impl RaftPeer for PeerService {
    async fn append_entries(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        self.answer(PeerCall::Append, request).await
    }

    async fn vote(&self, request: Request<PeerMessage>) -> Result<Response<PeerMessage>, Status> {
        self.answer(PeerCall::Vote, request).await
    }

    async fn pre_vote(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        self.answer(PeerCall::PreVote, request).await
    }

    async fn install_snapshot(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        self.answer(PeerCall::Snapshot, request).await
    }

    async fn transfer_leader(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        self.answer(PeerCall::TransferLeader, request).await
    }

    async fn probe(&self, request: Request<PeerMessage>) -> Result<Response<PeerMessage>, Status> {
        self.answer(PeerCall::Probe, request).await
    }

    async fn membership(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        self.answer(PeerCall::Membership, request).await
    }
}

fn channel(
    to: NodeId,
    addr: &str,
    source: Option<IpAddr>,
    tls: Option<&PeerFiles>,
) -> Option<Channel> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint = Channel::from_shared(format!("{scheme}://{addr}"))
        .ok()?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true);
    if let Some(tls) = tls {
        // The peer must show a certificate for the node it is meant to be.
        let config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&tls.ca))
            .identity(Identity::from_pem(&tls.cert, &tls.key))
            .domain_name(peer_name(to));
        endpoint = endpoint.tls_config(config).ok()?;
    }
    let Some(source) = source else {
        return Some(endpoint.connect_lazy());
    };
    let connect = tower::service_fn(move |uri: tonic::codegen::http::Uri| async move {
        let host = uri.host().unwrap_or_default().to_string();
        let port = uri.port_u16().unwrap_or(80);
        let target = tokio::net::lookup_host((host.as_str(), port))
            .await?
            .find(|a| a.is_ipv4() == source.is_ipv4())
            .ok_or_else(|| std::io::Error::other(format!("no address for {host}")))?;
        let socket = match source {
            IpAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            IpAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        socket.bind(SocketAddr::new(source, 0))?;
        socket.set_nodelay(true)?;
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(target))
            .await
            .map_err(|_| std::io::Error::other("connect timed out"))??;
        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
    });
    Some(endpoint.connect_with_connector_lazy(connect))
}

/// A peer's channel (`None`: its address is not one), and the TLS load it
/// was made with.
type Made = (u64, Option<Channel>);

/// gRPC to each peer's `RaftPeer` service, one lazily connected channel per
/// peer, over mutual TLS when the node has peer certificates.
#[derive(Default)]
pub struct GrpcTransport {
    /// The local address connections are made from (`None`: any).
    pub source: Option<IpAddr>,
    tls: Option<Arc<Tls>>,
    /// By node and address: the channel, and the TLS load it was made with.
    channels: Mutex<HashMap<(NodeId, String), Made>>,
    /// Each peer's reachability, so a failure is logged once per reason (a
    /// certificate that does not name the peer, say), not per retry.
    health: Arc<Mutex<HashMap<NodeId, PeerHealth>>>,
}

/// How long a peer that has never answered may go on not answering before
/// it is worth a warning: nodes of a new cluster start one after another.
const FIRST_ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// What the transport knows of one peer's reachability.
#[derive(Default)]
struct PeerHealth {
    /// It has answered since this node started.
    answered: bool,
    /// Why the last calls failed, since when, and whether that was logged
    /// at WARN.
    failing: Option<(String, std::time::Instant, bool)>,
}

impl PeerHealth {
    fn answered(&mut self, to: NodeId, addr: &str) {
        if let Some((_, _, warned)) = self.failing.take() {
            if warned {
                tracing::info!(peer = to, %addr, "peer reachable again");
            } else {
                tracing::info!(peer = to, %addr, "peer reachable");
            }
        }
        self.answered = true;
    }

    /// A peer that answered before and now does not is worth a warning at
    /// once, and so is any failure but a refused connection (a certificate
    /// that does not name the peer, say); a peer that refuses connections
    /// and has not answered since this node started (it may still be
    /// starting) only after [`FIRST_ANSWER_WITHIN`].
    fn failed(&mut self, to: NodeId, addr: &str, why: String) {
        let now = std::time::Instant::now();
        match &mut self.failing {
            Some((last, since, warned)) if *last == why => {
                if !*warned && now.duration_since(*since) >= FIRST_ANSWER_WITHIN {
                    *warned = true;
                    tracing::warn!(peer = to, %addr, error = %why, "cannot reach peer: it has not answered since this node started");
                }
            }
            _ => {
                let warn = self.answered || !why.contains("Connection refused");
                if warn {
                    tracing::warn!(peer = to, %addr, error = %why, "cannot reach peer");
                } else {
                    tracing::info!(peer = to, %addr, error = %why, "peer not answering yet");
                }
                let since = self.failing.as_ref().map_or(now, |f| f.1);
                self.failing = Some((why, since, warn));
            }
        }
    }
}

impl GrpcTransport {
    /// Connects from `source` (`None`: any local address), with the peer
    /// certificates of `tls` if it has them.
    pub fn new(source: Option<IpAddr>, tls: Option<Arc<Tls>>) -> GrpcTransport {
        GrpcTransport {
            source,
            tls,
            channels: Mutex::default(),
            health: Arc::default(),
        }
    }

    fn client(&self, to: NodeId, addr: &str) -> Option<RaftPeerClient<Channel>> {
        let tls = self.tls.as_ref().and_then(|t| t.peer_client());
        let generation = tls.as_ref().map_or(0, |t| t.generation);
        let mut channels = self.channels.lock();
        let entry = channels
            .entry((to, addr.to_string()))
            .or_insert_with(|| (generation, channel(to, addr, self.source, tls.as_ref())));
        if entry.0 != generation {
            // Certificates were reloaded: new connections use the new ones.
            *entry = (generation, channel(to, addr, self.source, tls.as_ref()));
        }
        let channel = entry.1.clone()?;
        Some(
            RaftPeerClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE),
        )
    }
}

impl Transport for GrpcTransport {
    fn call(
        &self,
        to: NodeId,
        addr: &str,
        call: PeerCall,
        payload: Vec<u8>,
    ) -> BoxFuture<'static, Result<Vec<u8>, TransportError>> {
        let client = self.client(to, addr);
        let health = self.health.clone();
        let addr = addr.to_string();
        Box::pin(async move {
            let Some(mut client) = client else {
                return Err(TransportError::Unreachable("not an address".into()));
            };
            let message = PeerMessage { bincode: payload };
            let reply = match call {
                PeerCall::Append => client.append_entries(message).await,
                PeerCall::Vote => client.vote(message).await,
                PeerCall::PreVote => client.pre_vote(message).await,
                PeerCall::Snapshot => client.install_snapshot(message).await,
                PeerCall::TransferLeader => client.transfer_leader(message).await,
                PeerCall::Probe => client.probe(message).await,
                PeerCall::Membership => client.membership(message).await,
            };
            let mut health = health.lock();
            let peer = health.entry(to).or_default();
            match reply {
                Ok(reply) => {
                    peer.answered(to, &addr);
                    Ok(reply.into_inner().bincode)
                }
                Err(status) if status.code() == tonic::Code::Unavailable => {
                    let why = reason(&status);
                    peer.failed(to, &addr, why.clone());
                    Err(TransportError::Unreachable(why))
                }
                Err(status) => Err(TransportError::Failed(reason(&status))),
            }
        })
    }
}

/// A status's message and the errors under it (a TLS failure is only named
/// in its sources).
fn reason(status: &Status) -> String {
    let mut why = status.message().to_string();
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        let text = e.to_string();
        if !why.contains(&text) {
            why = format!("{why}: {text}");
        }
        source = e.source();
    }
    why
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

    fn answered(&self, peer: NodeId) {
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
struct PeerError {
    target: NodeId,
    addr: String,
    message: String,
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
