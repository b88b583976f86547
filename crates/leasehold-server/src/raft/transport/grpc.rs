//! The peer transport between processes: the `leasehold.raft.v1.RaftPeer`
//! gRPC service (`proto/raft.proto`) each node serves on its one port
//! ([`PeerService`]), and the client end that calls it ([`GrpcTransport`]):
//! one lazily connected channel per peer, over mutual TLS when the node has
//! peer certificates, from the node's own listen address when it has one.
//! Appends go as one stream per replication session: framed on a connection
//! of its own when the node has no peer certificates and the peer speaks it
//! ([`super::framed`]), else as the bidirectional `AppendStream`; every other
//! call is unary.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::StreamExt;
use leasehold_proto::raft::raft_peer_client::RaftPeerClient;
use leasehold_proto::raft::raft_peer_server::{RaftPeer, RaftPeerServer};
use leasehold_proto::raft::PeerMessage;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::{Request, Response, Status};

use crate::metrics::TransportLabel;
use crate::tls::{names_node, peer_name, PeerCertificate, PeerFiles, Tls};

use super::append_stream::serve_stream;
use super::framed::{self, AbortOnDrop, Opened, Refusals};
use super::peer::serve;
use super::peer::PeerEndpoint;
use super::snapshot_chunks::IncomingSnapshot;
use super::{AnswerStream, PeerCall, Transport, TransportError, CONNECT_TIMEOUT, MAX_MESSAGE};
use crate::raft::storage::cluster_id::{self, ClusterId};
use crate::raft::{NodeId, Raft};

impl PeerEndpoint<'_> {
    /// The gRPC peer service to serve beside the client API; with
    /// `require_certificates`, it answers a Raft call only over a connection
    /// whose peer certificate names the node the call comes from.
    pub fn grpc_service(self, require_certificates: bool) -> RaftPeerServer<PeerService> {
        RaftPeerServer::new(PeerService {
            raft: self.consensus.raft.clone(),
            incoming: self.consensus.incoming.clone(),
            marks: self.consensus.shared.marks.clone(),
            cluster: self.consensus.shared.context.cluster.clone(),
            require_certificates,
        })
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
    }
}

/// The gRPC server end, over this node's Raft.
pub struct PeerService {
    raft: Raft,
    incoming: IncomingSnapshot,
    marks: std::sync::Arc<crate::raft::state_machine::marks::TableMarks>,
    cluster: Arc<ClusterId>,
    require_certificates: bool,
}

impl PeerService {
    /// The certificate a call came with, if one is needed and there is one.
    // tonic's handlers answer with a `Status`; it is what they return.
    #[allow(clippy::result_large_err)]
    fn certificate<T>(&self, request: &Request<T>) -> Result<Option<PeerCertificate>, Status> {
        let certificate = request.extensions().get::<PeerCertificate>().cloned();
        if self.require_certificates && certificate.is_none() {
            return Err(Status::unauthenticated(
                "raft calls need a connection with a peer certificate (mutual TLS under the peer CA)",
            ));
        }
        Ok(certificate)
    }

    /// Whether the caller belongs to this node's cluster (see
    /// [`crate::raft::storage::cluster_id`]).
    #[allow(clippy::result_large_err)]
    fn same_cluster<T>(&self, request: &Request<T>, from_leader: bool) -> Result<(), Status> {
        let theirs = request
            .metadata()
            .get(cluster_id::METADATA_KEY)
            .and_then(|v| v.to_str().ok());
        self.cluster
            .check(cluster_id::parse(theirs), from_leader)
            .map_err(Status::failed_precondition)
    }

    async fn answer(
        &self,
        call: PeerCall,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        let certificate = self.certificate(&request)?;
        // Asked before a node belongs to any group: not checked.
        if !matches!(call, PeerCall::Probe | PeerCall::Membership) {
            let from_leader = matches!(call, PeerCall::Append | PeerCall::Snapshot);
            self.same_cluster(&request, from_leader)?;
        }
        let refused = std::sync::OnceLock::new();
        let sender = |id: NodeId| {
            sent_by(certificate.as_ref(), id).inspect_err(|why| {
                let _ = refused.set(why.clone());
            })
        };
        let payload = &request.get_ref().bincode;
        match serve(
            &self.raft,
            &self.incoming,
            &self.marks,
            call,
            payload,
            sender,
        )
        .await
        {
            Ok(bincode) => Ok(Response::new(PeerMessage { bincode })),
            Err(e) if refused.get().is_some() => Err(Status::permission_denied(e)),
            Err(e) => Err(Status::invalid_argument(e)),
        }
    }
}

/// One answer of a stream of appends, as gRPC sends it.
#[allow(clippy::result_large_err)]
fn stream_message(answer: Result<Vec<u8>, String>) -> Result<PeerMessage, Status> {
    answer
        .map(|bincode| PeerMessage { bincode })
        .map_err(Status::invalid_argument)
}

/// Whether a call that says it comes from node `id` may: over mutual TLS,
/// only if the connection's certificate names that node.
fn sent_by(certificate: Option<&PeerCertificate>, id: NodeId) -> Result<(), String> {
    match certificate {
        Some(cert) if !names_node(cert, id) => {
            let why = format!(
                "the peer certificate does not name node {id} ({}), the node this call comes from",
                peer_name(id)
            );
            tracing::warn!(node = id, "refused a raft call: {why}");
            Err(why)
        }
        _ => Ok(()),
    }
}

#[tonic::async_trait]
impl RaftPeer for PeerService {
    type AppendStreamStream = futures::stream::BoxStream<'static, Result<PeerMessage, Status>>;

    async fn append_stream(
        &self,
        request: Request<tonic::Streaming<PeerMessage>>,
    ) -> Result<Response<Self::AppendStreamStream>, Status> {
        let certificate = self.certificate(&request)?;
        self.same_cluster(&request, true)?;
        let requests = request
            .into_inner()
            .map(|m| m.map(|m| m.bincode).map_err(|s| s.message().to_string()));
        let sender = move |id: NodeId| sent_by(certificate.as_ref(), id);
        let answers = serve_stream(&self.raft, requests, sender).map(stream_message);
        Ok(Response::new(answers.boxed()))
    }

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

    async fn table_mark(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        self.answer(PeerCall::TableMark, request).await
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
        let stream = super::framed::connect(&format!("{host}:{port}"), Some(source)).await?;
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
    /// This node's cluster, named on every call.
    cluster: Arc<ClusterId>,
    /// By node and address: the channel, and the TLS load it was made with.
    channels: Mutex<HashMap<(NodeId, String), Made>>,
    /// Each peer's reachability, so a failure is logged once per reason (a
    /// certificate that does not name the peer, say), not per retry.
    health: Arc<Mutex<HashMap<NodeId, PeerHealth>>>,
    /// Peers that do not speak framed streams of appends.
    unframed: Arc<Refusals>,
    /// Streams of appends opened, by transport (a metric).
    streams: Family<TransportLabel, Counter>,
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
    pub fn new(
        source: Option<IpAddr>,
        tls: Option<Arc<Tls>>,
        cluster: Arc<ClusterId>,
    ) -> GrpcTransport {
        GrpcTransport {
            source,
            tls,
            cluster,
            channels: Mutex::default(),
            health: Arc::default(),
            unframed: Arc::default(),
            streams: Family::default(),
        }
    }

    /// Counts the streams of appends it opens in `streams`, by transport.
    pub fn counting_streams(self, streams: Family<TransportLabel, Counter>) -> GrpcTransport {
        GrpcTransport { streams, ..self }
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
        let cluster = self.cluster.get();
        Box::pin(async move {
            let Some(mut client) = client else {
                return Err(TransportError::Unreachable("not an address".into()));
            };
            let message = of_cluster(PeerMessage { bincode: payload }, cluster);
            let reply = match call {
                PeerCall::Append => client.append_entries(message).await,
                PeerCall::Vote => client.vote(message).await,
                PeerCall::PreVote => client.pre_vote(message).await,
                PeerCall::Snapshot => client.install_snapshot(message).await,
                PeerCall::TransferLeader => client.transfer_leader(message).await,
                PeerCall::Probe => client.probe(message).await,
                PeerCall::Membership => client.membership(message).await,
                PeerCall::TableMark => client.table_mark(message).await,
            };
            match reply {
                Ok(reply) => {
                    health.lock().entry(to).or_default().answered(to, &addr);
                    Ok(reply.into_inner().bincode)
                }
                Err(status) => Err(GrpcTransport::failure(&health, to, &addr, &status)),
            }
        })
    }

    fn streams_appends(&self) -> bool {
        true
    }

    fn append_stream(
        &self,
        to: NodeId,
        addr: &str,
        requests: futures::stream::BoxStream<'static, Vec<u8>>,
    ) -> BoxFuture<'static, Result<AnswerStream, TransportError>> {
        let client = self.client(to, addr);
        let health = self.health.clone();
        let addr = addr.to_string();
        let cluster = self.cluster.get();
        // Without peer certificates, framed on a connection of its own if
        // the peer speaks it (see `framed`); over gRPC if it does not, or
        // if it closes the connection before greeting back.
        let framed = (self.tls.as_ref().and_then(|t| t.peer_client()).is_none()
            && self.unframed.worth_asking(to, &addr))
        .then(|| (self.source, self.unframed.clone()));
        let streams = self.streams.clone();
        let opened = move |transport| {
            streams.get_or_create(&TransportLabel { transport }).inc();
        };
        Box::pin(async move {
            let Some(mut client) = client else {
                return Err(TransportError::Unreachable("not an address".into()));
            };
            let (requests, framed_closed) = match framed {
                Some((source, unframed)) => {
                    match framed::open(to, &addr, source, cluster, requests, &unframed).await {
                        Opened::Open(answers) => {
                            health.lock().entry(to).or_default().answered(to, &addr);
                            opened("framed");
                            return Ok(answers);
                        }
                        Opened::NotSpoken(requests) => (requests, None),
                        Opened::Closed(requests, why) => (requests, Some(why)),
                        Opened::Unreachable(why) => {
                            let mut health = health.lock();
                            health.entry(to).or_default().failed(to, &addr, why.clone());
                            return Err(TransportError::Unreachable(why));
                        }
                    }
                }
                None => (requests, None),
            };
            match open_append_stream(&mut client, requests, cluster).await {
                Ok((answers, forwarding)) => {
                    health.lock().entry(to).or_default().answered(to, &addr);
                    opened("grpc");
                    if let Some(why) = framed_closed {
                        // Reachable, but not framed this time.
                        tracing::info!(peer = to, %addr, error = %why, "a framed stream of appends was closed where gRPC's opened: this stream goes over gRPC");
                    }
                    Ok(answer_stream(answers, forwarding, health, to, addr))
                }
                Err(status) => Err(GrpcTransport::failure(&health, to, &addr, &status)),
            }
        })
    }
}

impl GrpcTransport {
    /// How a call's status reads to the caller; a peer that cannot be
    /// reached is noted in its health.
    fn failure(
        health: &Mutex<HashMap<NodeId, PeerHealth>>,
        to: NodeId,
        addr: &str,
        status: &Status,
    ) -> TransportError {
        if status.code() == tonic::Code::Unavailable {
            let why = reason(status);
            health
                .lock()
                .entry(to)
                .or_default()
                .failed(to, addr, why.clone());
            TransportError::Unreachable(why)
        } else {
            TransportError::Failed(reason(status))
        }
    }
}

/// The answers of a gRPC stream of appends, as the transport gives them.
fn answer_stream(
    answers: tonic::Streaming<PeerMessage>,
    forwarding: AbortOnDrop,
    health: Arc<Mutex<HashMap<NodeId, PeerHealth>>>,
    to: NodeId,
    addr: String,
) -> AnswerStream {
    answers
        .map(move |answer| {
            // Held by the stream, so the forwarding stops when it is dropped.
            let _forwarding = &forwarding;
            match answer {
                Ok(message) => Ok(message.bincode),
                Err(status) => Err(GrpcTransport::failure(&health, to, &addr, &status)),
            }
        })
        .boxed()
}

/// Opens the gRPC stream; `requests` are forwarded into it in order (the
/// channel between holds one, so the stream's back-pressure reaches them)
/// until the returned guard is dropped. None is asked for before the peer
/// has answered the opening (its handler answers before it reads a
/// message): asking reads entries from the log, and a stream to a peer
/// that is down is opened again every few tens of milliseconds.
async fn open_append_stream(
    client: &mut RaftPeerClient<Channel>,
    mut requests: futures::stream::BoxStream<'static, Vec<u8>>,
    cluster: Option<u64>,
) -> Result<(tonic::Streaming<PeerMessage>, AbortOnDrop), Status> {
    let (forward, messages) = tokio::sync::mpsc::channel(1);
    let (opened, open) = tokio::sync::oneshot::channel::<()>();
    let forwarding = tokio::spawn(async move {
        if open.await.is_err() {
            return;
        }
        while let Some(bincode) = requests.next().await {
            if forward.send(PeerMessage { bincode }).await.is_err() {
                break;
            }
        }
    });
    // Dropped with the answers: openraft's request stream is then dropped
    // too, not left waiting for entries to send on a stream nobody reads.
    let guard = AbortOnDrop(forwarding.abort_handle());
    let messages = tokio_stream::wrappers::ReceiverStream::new(messages);
    let request = of_cluster(messages, cluster);
    let answers = client.append_stream(request).await?.into_inner();
    let _ = opened.send(());
    Ok((answers, guard))
}

/// A call's request, naming the caller's cluster if it has one.
fn of_cluster<T>(message: T, cluster: Option<u64>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(id) = cluster {
        if let Ok(value) = format!("{id:016x}").parse() {
            request
                .metadata_mut()
                .insert(cluster_id::METADATA_KEY, value);
        }
    }
    request
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use openraft::errors::Fatal;
    use openraft::raft::{StreamAppendError, StreamAppendResult};
    use tokio::net::TcpListener;

    use super::*;
    use crate::raft::transport::decode;
    use crate::raft::{leading_single_node, stale_append, TypeConfig};

    const WITHIN: Duration = Duration::from_secs(5);

    /// A stream of one append that any node that has voted refuses, kept
    /// open.
    fn stale_appends() -> futures::stream::BoxStream<'static, Vec<u8>> {
        futures::stream::iter(vec![stale_append()])
            .chain(futures::stream::pending())
            .boxed()
    }

    #[tokio::test]
    async fn a_peer_that_closes_framed_connections_gets_each_stream_over_grpc() {
        let dir = tempfile::tempdir().expect("tempdir");
        let consensus = leading_single_node(dir.path()).await;
        // A peer that serves gRPC and closes framed connections unanswered
        // (at its connection cap, or behind something that passes only
        // HTTP).
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let framed_asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let asked = framed_asked.clone();
        let incoming = futures::stream::unfold(listener, move |listener| {
            let asked = asked.clone();
            async move {
                loop {
                    let (stream, _) = listener.accept().await.ok()?;
                    let mut first = [0u8; 1];
                    stream.peek(&mut first).await.ok()?;
                    if first[0] != framed::HELLO[0] {
                        return Some((Ok::<_, std::io::Error>(stream), listener));
                    }
                    asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        });
        let service = consensus.peers().grpc_service(false);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming),
        );
        let streams = Family::<TransportLabel, Counter>::default();
        let cluster = consensus.shared.context.cluster.clone();
        let transport = GrpcTransport::new(None, None, cluster).counting_streams(streams.clone());
        for _ in 0..2 {
            let opening = transport.append_stream(2, &addr, stale_appends());
            let mut answers = tokio::time::timeout(WITHIN, opening)
                .await
                .expect("opened within 5 s")
                .expect("opened over gRPC");
            let answer = tokio::time::timeout(WITHIN, answers.next())
                .await
                .expect("an answer within 5 s")
                .expect("an answer")
                .expect("an answer, not an error");
            let answer: Result<StreamAppendResult<TypeConfig>, Fatal<TypeConfig>> =
                decode(&answer).expect("an encoded answer");
            assert!(matches!(answer, Ok(Err(StreamAppendError::HigherVote(_)))));
        }
        let count = |transport| streams.get_or_create(&TransportLabel { transport }).get();
        assert_eq!((count("framed"), count("grpc")), (0, 2));
        // Asked for framed each time: a closed greeting is no lasting
        // verdict (the peer may have been at its cap, or stopping).
        assert_eq!(framed_asked.load(std::sync::atomic::Ordering::SeqCst), 2);
        consensus.shutdown().await;
    }

    #[tokio::test]
    async fn a_grpc_stream_to_a_peer_that_is_down_asks_for_no_request() {
        // A port nothing listens on.
        let addr = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind")
            .local_addr()
            .expect("addr");
        let channel = Channel::from_shared(format!("http://{addr}"))
            .expect("an address")
            .connect_lazy();
        let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = asked.clone();
        let requests = futures::stream::poll_fn(move |_| {
            // Each request asked for is entries read from the log.
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::task::Poll::Ready(Some(stale_append()))
        })
        .boxed();
        let opened = tokio::time::timeout(
            WITHIN,
            open_append_stream(&mut RaftPeerClient::new(channel), requests, None),
        )
        .await
        .expect("an outcome within 5 s");
        assert!(opened.is_err());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_peer_that_takes_the_connection_and_says_nothing_is_unreachable_for_now() {
        let dir = tempfile::tempdir().expect("tempdir");
        let consensus = leading_single_node(dir.path()).await;
        // Listening, never accepting: its kernel takes connections, as for
        // a process still opening its data, or paused.
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let streams = Family::<TransportLabel, Counter>::default();
        let cluster = consensus.shared.context.cluster.clone();
        let transport = GrpcTransport::new(None, None, cluster).counting_streams(streams.clone());
        let opening = transport.append_stream(2, &addr, stale_appends());
        let opened = tokio::time::timeout(WITHIN, opening)
            .await
            .expect("an outcome within 5 s");
        assert!(
            matches!(&opened, Err(TransportError::Unreachable(why)) if why.contains("greeting")),
            "{:?}",
            opened.err()
        );
        // Not sent over gRPC instead: it would wait on the same process.
        let count = |transport| streams.get_or_create(&TransportLabel { transport }).get();
        assert_eq!((count("framed"), count("grpc")), (0, 0));
        // Asked for framed again next time.
        assert!(transport.unframed.worth_asking(2, &addr));
        drop(listener);
        consensus.shutdown().await;
    }
}
