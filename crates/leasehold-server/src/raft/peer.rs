//! Raft between nodes: the `leasehold.raft.v1.RaftPeer` gRPC service
//! (`proto/raft.proto`) on each node's one port, and the client that calls it.
//!
//! Each call carries one openraft request or response, bincode-encoded
//! (every node of a cluster runs the same build). Snapshots go in chunks of
//! at most 3 MiB (openraft's `snapshot_max_chunk_size`), so a snapshot of a
//! million held locks crosses as a few dozen calls. A call is cut off at the
//! soft deadline openraft gives it; a peer that cannot be connected to is
//! reported unreachable, and openraft backs off from it (100 ms, doubling to
//! 1.6 s). A node that listens on a specific address makes its connections to
//! peers from that address too, so a peer (or a fault-injecting proxy in
//! front of it) can tell the nodes apart by their source address.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use leasehold_proto::raft::raft_peer_client::RaftPeerClient;
use leasehold_proto::raft::raft_peer_server::{RaftPeer, RaftPeerServer};
use leasehold_proto::raft::PeerMessage;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::Raft;
use prometheus_client::metrics::counter::Counter;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use super::{Consensus, Node, NodeId, TypeConfig};

/// The largest message between peers: an append of 64 entries of up to
/// 1,024 commands each, or one 3 MiB snapshot chunk, fits with room.
const MAX_MESSAGE: usize = 64 * 1024 * 1024;
/// Time to connect to a peer.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

fn codec() -> impl bincode::Options {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_limit(MAX_MESSAGE as u64)
}

/// Statuses, as tonic's handlers return them.
#[allow(clippy::result_large_err)]
fn encode<T: Serialize>(value: &T) -> Result<PeerMessage, Status> {
    use bincode::Options;
    codec()
        .serialize(value)
        .map(|bincode| PeerMessage { bincode })
        .map_err(|e| Status::internal(format!("encode: {e}")))
}

#[allow(clippy::result_large_err)]
fn decode<T: DeserializeOwned>(message: &PeerMessage) -> Result<T, Status> {
    use bincode::Options;
    codec()
        .deserialize(&message.bincode)
        .map_err(|e| Status::invalid_argument(format!("not a raft message: {e}")))
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

/// The server end, over this node's Raft.
pub struct PeerService {
    raft: Raft<TypeConfig>,
}

impl Consensus {
    /// The peer service to serve beside the client API.
    pub fn peer_service(&self) -> RaftPeerServer<PeerService> {
        RaftPeerServer::new(PeerService {
            raft: self.raft.clone(),
        })
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
    }
}

#[tonic::async_trait]
impl RaftPeer for PeerService {
    async fn append_entries(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        let rpc: AppendEntriesRequest<TypeConfig> = decode(request.get_ref())?;
        encode(&self.raft.append_entries(rpc).await).map(Response::new)
    }

    async fn vote(&self, request: Request<PeerMessage>) -> Result<Response<PeerMessage>, Status> {
        let rpc: VoteRequest<NodeId> = decode(request.get_ref())?;
        encode(&self.raft.vote(rpc).await).map(Response::new)
    }

    async fn install_snapshot(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        let rpc: InstallSnapshotRequest<TypeConfig> = decode(request.get_ref())?;
        encode(&self.raft.install_snapshot(rpc).await).map(Response::new)
    }

    async fn probe(&self, _request: Request<PeerMessage>) -> Result<Response<PeerMessage>, Status> {
        let initialized = self
            .raft
            .is_initialized()
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let m = self.raft.metrics().borrow().clone();
        encode(&ProbeReply {
            initialized,
            term: m.current_term,
            leader: m.current_leader,
        })
        .map(Response::new)
    }
}

fn channel(addr: &str, source: Option<IpAddr>) -> Option<Channel> {
    let endpoint = Channel::from_shared(format!("http://{addr}"))
        .ok()?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true);
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

fn client(channel: Channel) -> RaftPeerClient<Channel> {
    RaftPeerClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
}

/// Asks the node at `addr` about itself; `None` if it does not answer soon.
pub(super) async fn probe(addr: &str) -> Option<ProbeReply> {
    let mut c = client(channel(addr, None)?);
    let call = c.probe(PeerMessage::default());
    let reply = tokio::time::timeout(Duration::from_secs(1), call)
        .await
        .ok()?
        .ok()?;
    decode(reply.get_ref()).ok()
}

/// The client end: one per peer, made by openraft as it needs them.
#[derive(Clone, Default)]
pub struct PeerNetwork {
    /// The local address connections are made from (`None`: any).
    pub source: Option<IpAddr>,
    /// Counts the snapshot chunks sent (a metric).
    pub snapshot_chunks: Counter,
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> PeerClient {
        PeerClient {
            target,
            addr: node.addr.clone(),
            client: channel(&node.addr, self.source).map(client),
            snapshot_chunks: self.snapshot_chunks.clone(),
        }
    }
}

/// Calls one peer.
pub struct PeerClient {
    target: NodeId,
    addr: String,
    /// `None` if the address is not one (the peer is then unreachable).
    client: Option<RaftPeerClient<Channel>>,
    snapshot_chunks: Counter,
}

#[derive(Debug, thiserror::Error)]
#[error("peer {target} at {addr}: {message}")]
struct PeerError {
    target: NodeId,
    addr: String,
    message: String,
}

#[derive(Clone, Copy)]
enum Rpc {
    Append,
    Vote,
    Snapshot,
}

impl PeerClient {
    async fn call<Req, Resp, E>(
        &mut self,
        rpc: Rpc,
        request: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, Node, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let error = |message: String| PeerError {
            target: self.target,
            addr: self.addr.clone(),
            message,
        };
        let Some(client) = self.client.as_mut() else {
            return Err(RPCError::Unreachable(Unreachable::new(&error(
                "not an address".into(),
            ))));
        };
        let message = encode(request)
            .map_err(|s| RPCError::Network(NetworkError::new(&error(s.message().to_string()))))?;
        let call = async {
            match rpc {
                Rpc::Append => client.append_entries(message).await,
                Rpc::Vote => client.vote(message).await,
                Rpc::Snapshot => client.install_snapshot(message).await,
            }
        };
        let reply = match tokio::time::timeout(option.soft_ttl(), call).await {
            Ok(Ok(reply)) => reply.into_inner(),
            Ok(Err(status)) if status.code() == tonic::Code::Unavailable => {
                return Err(RPCError::Unreachable(Unreachable::new(&error(
                    status.message().to_string(),
                ))))
            }
            Ok(Err(status)) => {
                return Err(RPCError::Network(NetworkError::new(&error(
                    status.message().to_string(),
                ))))
            }
            Err(_) => {
                return Err(RPCError::Network(NetworkError::new(&error(format!(
                    "no answer within {:?}",
                    option.soft_ttl()
                )))))
            }
        };
        let answer: Result<Resp, RaftError<NodeId, E>> = decode(&reply)
            .map_err(|s| RPCError::Network(NetworkError::new(&error(s.message().to_string()))))?;
        answer.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        self.call(Rpc::Append, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, Node, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.snapshot_chunks.inc();
        self.call(Rpc::Snapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        self.call(Rpc::Vote, &rpc, &option).await
    }

    /// 100, 200, 400 ms, then every 500 ms: a restarted peer hears from the
    /// leader within half a second (see `node::allow_elections`).
    fn backoff(&self) -> Backoff {
        Backoff::new((0..).map(|i: u32| Duration::from_millis((100u64 << i.min(3)).min(500))))
    }
}
