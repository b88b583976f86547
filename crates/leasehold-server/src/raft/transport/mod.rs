//! Raft between nodes: the calls, encoded once, and the [`Transport`] that
//! carries them: the `leasehold.raft.v1.RaftPeer` gRPC service
//! (`proto/raft.proto`) on each node's one port between processes
//! (`grpc`), or a simulated network inside one process.
//!
//! Each call carries one openraft request or response, bincode-encoded
//! (every node of a cluster runs the same build). Appends go as a stream,
//! several in flight (`append_stream`); between processes without
//! peer certificates, as frames on a connection of their own
//! ([`framed`]). Snapshots go in chunks of
//! at most 3 MiB (openraft's `snapshot_max_chunk_size`), so a snapshot of a
//! million held locks crosses as a few dozen calls. A call is cut off at the
//! soft deadline openraft gives it; a peer that cannot be connected to is
//! reported unreachable, and its appends are tried again after 100, 200
//! and 400 ms, then every 500 ms (openraft's backoff, and for a stream
//! that did not open, `append_stream`'s, which ends as soon as the peer
//! answers a heartbeat; openraft's heartbeats go on, one each heartbeat
//! interval). A node that listens on a specific address makes its
//! connections to peers from that address too, so a peer (or a
//! fault-injecting proxy in front of it) can tell the nodes apart by their
//! source address.
//!
//! - `peer`: both ends of each call: openraft's network (the client) and
//!   the dispatch of a call that arrives (the server).
//! - `append_stream`: appends pipelined over one stream, several in flight.
//! - [`framed`]: those streams as length-prefixed frames on a connection
//!   of their own, beside gRPC on the same port.
//! - `grpc`: the gRPC service and the transport between processes.
//! - `snapshot_chunks`: a snapshot sent in chunks, and put back together.

pub(in crate::raft) mod append_stream;
pub mod framed;
pub(in crate::raft) mod grpc;
pub mod peer;
pub(in crate::raft) mod snapshot_chunks;

use std::collections::HashMap;
use std::time::Duration;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::raft::storage::format;
use crate::raft::NodeId;

/// The largest message between peers: an append of 64 entries of up to
/// 1,024 commands each, or one 3 MiB snapshot chunk, fits with room.
pub(in crate::raft) const MAX_MESSAGE: usize = 64 * 1024 * 1024;
/// Time to connect to a peer.
pub(in crate::raft) const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

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
    /// One chunk of a snapshot (`snapshot_chunks::SnapshotChunk`).
    Snapshot,
    /// The leader hands leadership to the peer.
    TransferLeader,
    /// What a node says of itself ([`ProbeReply`]), asked while forming a
    /// group and before a membership change.
    Probe,
    /// A node's latest membership ([`MembershipReply`]).
    Membership,
    /// A node's latest table hash (`state_machine::marks::Mark`).
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
/// ([`GrpcTransport`](crate::raft::GrpcTransport)); a simulation carries them over its own network.
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

/// Refuses a call that says it comes from this node itself: the cluster
/// lists this node's address under another id too (added twice), so it is
/// calling itself, and openraft would take its own append as another
/// leader's (it asserts against that, and the node would stop).
pub(in crate::raft) fn not_from_self(me: NodeId, from: NodeId) -> Result<(), String> {
    if from == me {
        return Err(format!(
            "a raft call from node {me} to itself: the cluster lists this node's address under another id too; remove that member"
        ));
    }
    Ok(())
}

/// When each peer last answered one of this node's Raft calls: on the
/// leader, which members it hears from (a heartbeat goes every
/// `--heartbeat`, so a member heard from long ago is cut off or down).
pub(in crate::raft) struct Heard {
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

    pub(in crate::raft) fn answered(&self, peer: NodeId) {
        let now = tokio::time::Instant::now();
        self.last.lock().insert(peer, now);
    }

    /// How long ago `peer` last answered; `None` if it never has.
    pub fn since(&self, peer: NodeId) -> Option<Duration> {
        let last = *self.last.lock().get(&peer)?;
        Some(last.elapsed())
    }

    /// Waits until `until`, or until `peer` answers after `since` if that
    /// comes first (a peer back up answers the leader's heartbeats).
    pub(in crate::raft) async fn answer_after(
        &self,
        peer: NodeId,
        since: tokio::time::Instant,
        until: tokio::time::Instant,
    ) {
        /// How often the wait looks for an answer.
        const LOOK_EVERY: Duration = Duration::from_millis(20);
        loop {
            let answered = self.last.lock().get(&peer).is_some_and(|at| *at > since);
            let now = tokio::time::Instant::now();
            if answered || now >= until {
                return;
            }
            tokio::time::sleep_until(until.min(now + LOOK_EVERY)).await;
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("peer {target} at {addr}: {message}")]
pub(in crate::raft) struct PeerError {
    pub target: NodeId,
    pub addr: String,
    pub message: String,
}
