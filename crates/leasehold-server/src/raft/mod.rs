//! Consensus: the lock table replicated by openraft.
//!
//! Every openraft type stays inside this module; the rest of the server sees
//! [`Consensus`], which proposes lock-table commands stamped with the leader's
//! clock and reads the applied table. A single node is a one-member Raft
//! group, so a cluster is membership plus the peer transport, not a different
//! code path.
//!
//! [`Consensus`] is what the lock service uses: proposals, reads and the
//! leader's clock, and the node's life (start, stop, hand leadership over
//! at a clean stop). Its other roles have types of their own, each a view
//! of the same node: [`Membership`] ([`Consensus::membership`]: the
//! group's status and an operator's changes to it) and [`PeerEndpoint`]
//! ([`Consensus::peers`]: the server end of the calls other nodes make).
//!
//! # Layout
//! The node itself sits here; what it stands on is in three folders.
//! - [`node`]: start-up from injected parts (node id, members, log store,
//!   snapshot store, peer network, clock) and the one-time initialization of a group.
//! - [`leadership`]: the leader's clock and following this node's role.
//! - `batch`: proposals gathered into log entries (group commit).
//! - `state_machine`: the lock table as the state machine, and the marks
//!   of its hash that members compare.
//! - `runtime`: openraft's runtime (tokio), with random draws a simulation
//!   can seed.
//! - [`transport`]: Raft's calls between nodes, their encoding, and what
//!   carries them (gRPC, framed streams of appends, snapshot chunks).
//! - [`storage`]: the data dir: its log, snapshot, format, cluster id and
//!   lock, and `leaseholdd check`.
//! - [`operations`]: what an operator asks of a group: membership (status,
//!   add, remove, transfer), backups and restores, and the hash check of
//!   members' tables.

mod batch;
pub(crate) mod fuzzing;
pub mod leadership;
pub mod node;
pub mod operations;
mod runtime;
mod state_machine;
pub mod storage;
pub mod transport;

use std::sync::Arc;

use parking_lot::Mutex;

use leasehold_core::{Command, LockTable, Outcome, Stamp, Time};
use openraft::async_runtime::WatchReceiver;
use openraft::type_config::alias;
use openraft::{BasicNode, ServerState};
use serde::{Deserialize, Serialize};

use crate::hub::Hub;
pub use leadership::{Clock, SystemClock};
pub use node::{NodeSpec, RaftOptions};
pub use operations::membership::{
    AddressMismatch, ClusterStatus, MemberStatus, Membership, MembershipError,
};
pub use runtime::seed_thread_randomness;
use state_machine::Shared;
pub use state_machine::{AppliedCommand, ApplyTap, StateMachine};
pub use storage::disk::{FsDisk, FsFile, LogDisk, LogFile};
pub use storage::log_store::LogStore;
pub use storage::snapshot_store::{FileSnapshots, MemorySnapshots, SnapshotStore};
pub use transport::grpc::{GrpcTransport, PeerService};
pub use transport::peer::PeerEndpoint;
pub use transport::{AnswerStream, PeerCall, Transport, TransportError};

/// Commands applied since the last snapshot past which a clean stop takes
/// a snapshot first (see [`Consensus::shutdown`]).
const SNAPSHOT_AT_STOP_AFTER: u64 = 10_000;

/// How long a clean stop waits for that snapshot.
const SNAPSHOT_AT_STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// One entry of the replicated log: a batch of commands and the leader's stamp
/// on it (see `batch`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    /// The leader's clock and term when it proposed the batch.
    pub stamp: Stamp,
    /// The changes to the lock table, applied in order.
    pub commands: Vec<Command>,
}

impl std::fmt::Display for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} commands stamped {} in epoch {}",
            self.commands.len(),
            self.stamp.now,
            self.stamp.epoch
        )
    }
}

/// A node's id in its group.
pub type NodeId = u64;
pub(crate) type Node = BasicNode;

openraft::declare_raft_types!(
    /// Leasehold's openraft configuration. The leader id, vote and log id are
    /// openraft's defaults, whose encodings are those of openraft 0.9: data
    /// dirs written under 0.9 read unchanged.
    pub TypeConfig:
        D = Request,
        R = Vec<Outcome>,
        Node = BasicNode,
        AsyncRuntime = runtime::Runtime,
);

/// One log entry.
pub type Entry = alias::EntryOf<TypeConfig>;
/// A log entry's id: its leader's term and node, and its index.
pub type LogId = alias::LogIdOf<TypeConfig>;
/// The leader part of a log id.
#[cfg(test)]
pub(crate) type CommittedLeaderId = alias::CommittedLeaderIdOf<TypeConfig>;
/// A node's vote: the term and the candidate it voted for, and whether that
/// candidate won.
pub type Vote = alias::VoteOf<TypeConfig>;
pub(crate) type StoredMembership = alias::StoredMembershipOf<TypeConfig>;
pub(crate) type SnapshotMeta = alias::SnapshotMetaOf<TypeConfig>;
/// A snapshot's bytes: the encoded lock table.
pub(crate) type SnapshotData = Vec<u8>;
pub(crate) type Snapshot = alias::SnapshotOf<TypeConfig, SnapshotData>;
pub(crate) type Raft = openraft::Raft<TypeConfig, StateMachine>;

/// Why a proposal or a read was not served here.
///
/// `NotLeader`, `Starting` and `Stopped` promise that nothing was proposed:
/// retry anywhere. `Unknown` does not: the command was handed to Raft and may
/// still commit, so only a retry with the same request id is safe.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ConsensusError {
    /// Another node leads (or none does yet); send the request there. Nothing
    /// was proposed.
    #[error("not the leader{}", leader.as_ref().map(|l| format!("; the leader is at {l}")).unwrap_or_default())]
    NotLeader {
        /// The leader's address, when known.
        leader: Option<String>,
    },
    /// This node leads but is still catching up its state; retry shortly.
    /// Nothing was proposed.
    #[error("the leader is starting; retry shortly")]
    Starting,
    /// The Raft node has stopped (a storage failure or shutdown).
    #[error("consensus stopped: {0}")]
    Stopped(String),
    /// Proposed, then cut off before its outcome was known (leadership
    /// lost mid-write, a storage failure): it may or may not take effect.
    #[error("outcome unknown: {0}; retry with the same request id")]
    Unknown(String),
}

/// A running Raft node with the lock table as its state machine.
#[derive(Clone)]
pub struct Consensus {
    raft: Raft,
    shared: Arc<Shared>,
    clock: Arc<dyn Clock>,
    /// Set while this node leads; the stamp of every proposal comes from it.
    leader: Arc<Mutex<Option<leadership::LeaderClock>>>,
    /// Whether `leader` is set, for those that wait for it to change.
    armed: Arc<tokio::sync::watch::Sender<bool>>,
    proposals: batch::Lanes,
    /// Carries this node's calls to its peers (probes; openraft holds its own handle).
    transport: Arc<dyn Transport>,
    /// When each peer last answered this node.
    heard: Arc<transport::Heard>,
    /// The snapshot a leader is sending this node, chunk by chunk.
    incoming: transport::snapshot_chunks::IncomingSnapshot,
    /// Set once a peer's committed membership shows this node was removed
    /// (see `operations::membership`'s `notice_removal`); it then no longer campaigns.
    removed: Arc<std::sync::atomic::AtomicBool>,
    /// Set once this node begins a clean stop ([`Consensus::stand_down`]);
    /// it then no longer campaigns.
    stopping: Arc<std::sync::atomic::AtomicBool>,
    id: NodeId,
}

impl Consensus {
    // `millis_since_quorum_ack` is an age; its replacement is an instant of
    // openraft's runtime, which a simulation's clock does not share.
    #[allow(deprecated)]
    fn not_leader(&self) -> ConsensusError {
        let m = self.raft.metrics().borrow_watched().clone();
        let leader = m.current_leader.and_then(|id| {
            m.membership_config
                .membership()
                .get_node(&id)
                .map(|n| n.addr.clone())
        });
        match m.state {
            // Elected, and its clock not yet armed: a moment.
            ServerState::Leader if m.millis_since_quorum_ack.is_none_or(|ms| ms < 50) => {
                ConsensusError::Starting
            }
            // Leads in name only (no quorum answers): look for another.
            ServerState::Leader => ConsensusError::NotLeader { leader: None },
            _ => ConsensusError::NotLeader { leader },
        }
    }

    /// Reads the applied table after confirming leadership (a linearizable read),
    /// passing the leader's current time for TTLs left.
    pub async fn read<T>(
        &self,
        f: impl FnOnce(&LockTable, Time) -> T,
    ) -> Result<T, ConsensusError> {
        if self
            .raft
            .ensure_linearizable(openraft::ReadPolicy::ReadIndex)
            .await
            .is_err()
        {
            return Err(self.not_leader());
        }
        let Some(clock) = self.leader_clock() else {
            return Err(self.not_leader());
        };
        // openraft's read index covers what this leader committed in its
        // term only from the first entry it proposed in this process: a
        // leader restarted on its own vote would read a state machine that
        // still lacks entries it committed before it crashed. This
        // leadership's first command (the tick that restamps leases) comes
        // after all of them; once it is applied, so are they.
        if self.read_local(|t| t.epoch()).await < clock.epoch {
            let _tick = self.propose(Command::Tick).await?;
        }
        let Some(now) = self.now() else {
            return Err(self.not_leader());
        };
        Ok(self.shared.read_async(|a| f(&a.table, now)).await)
    }

    /// Reads the applied table as it stands here, without a leadership
    /// check. Waits, without holding the thread, while a large entry is
    /// applied.
    pub async fn read_local<T>(&self, f: impl FnOnce(&LockTable) -> T) -> T {
        self.shared.read_async(|a| f(&a.table)).await
    }

    /// The hub this node's state machine publishes to.
    pub fn hub(&self) -> &Arc<Hub> {
        &self.shared.hub
    }

    /// Whether this node stamps proposals as leader, watched: it changes
    /// when its leader clock is armed or cleared (`now` turns `Some` or
    /// `None`). The node's role and its metrics change far more often (on
    /// every append and apply), and waking on those cost a follower a poll
    /// per entry for nothing.
    pub fn leading(&self) -> tokio::sync::watch::Receiver<bool> {
        self.armed.subscribe()
    }

    /// Waits until the Raft node stops, and says why.
    ///
    /// Watches openraft's server metrics, which change with the role, vote
    /// or membership only, and close when its core is gone; its full metrics
    /// change on every append and apply, and each change woke this waiter.
    pub async fn stopped(&self) -> String {
        let mut server = self.raft.server_metrics();
        loop {
            if let Err(fatal) = &self.raft.metrics().borrow_watched().running_state {
                return fatal.to_string();
            }
            if server.changed().await.is_err() {
                // The core is gone; its last report says why.
                return match &self.raft.metrics().borrow_watched().running_state {
                    Err(fatal) => fatal.to_string(),
                    Ok(()) => "the raft core is gone".into(),
                };
            }
        }
    }

    /// The index of the last applied log entry.
    pub fn last_applied(&self) -> u64 {
        self.shared.last_applied_index()
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// Takes a snapshot of everything applied and waits for it, for at most
    /// [`SNAPSHOT_AT_STOP_WAIT`]. Without it nothing is lost: the next start
    /// replays the log instead.
    async fn snapshot_before_stop(&self) {
        let Some(applied) = self.raft.metrics().borrow_watched().last_applied else {
            return;
        };
        if self.raft.trigger().snapshot().await.is_err() {
            return;
        }
        let taken = self
            .raft
            .wait(Some(SNAPSHOT_AT_STOP_WAIT))
            .metrics(
                |m| m.snapshot.is_some_and(|s| s.index >= applied.index),
                "a snapshot before stopping",
            )
            .await;
        if let Err(e) = taken {
            tracing::warn!(error = %e, "no snapshot before stopping: the next start replays the log since the last one");
        }
    }

    /// Before a clean stop. The node campaigns no more: its last snapshot
    /// can hold it past an election timeout, and a leadership it won then
    /// would end with it. It still votes. A leader with other voters hands
    /// leadership to the most caught-up of them, so the group does not wait
    /// out an election timeout for a leader that is gone. Called while the
    /// node still serves its peers (the new leader's first append must
    /// reach it).
    pub async fn stand_down(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.raft.runtime_config().elect(false);
        if self.leader_clock().is_none() || self.voters().len() < 2 {
            return;
        }
        match self.membership().transfer_leader(None).await {
            Ok(status) => tracing::info!(
                leader = ?status.leader,
                "stopping: handed leadership over first"
            ),
            Err(e) => tracing::warn!(error = %e, "stopping without handing leadership over"),
        }
    }

    /// Stops the Raft node, first taking a snapshot if many commands were
    /// applied since the last one, so that the next start reads them from
    /// the snapshot instead of replaying the log (after a million acquires,
    /// starting took 1.45 s instead of 0.5 s: `bench/memory.py`).
    pub async fn shutdown(&self) {
        if self.shared.commands_since_snapshot() >= SNAPSHOT_AT_STOP_AFTER {
            self.snapshot_before_stop().await;
        }
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
    }
}

/// A single node over `dir` (its address never dialled), once it leads:
/// what tests of the parts around the Raft stand on.
#[cfg(test)]
pub(crate) async fn leading_single_node(dir: &std::path::Path) -> Consensus {
    let consensus = Consensus::start(
        dir,
        NodeSpec::single("127.0.0.1:1"),
        std::sync::Arc::default(),
        RaftOptions::default(),
        None,
    )
    .await
    .expect("start");
    let mut leading = consensus.leading();
    let within = std::time::Duration::from_secs(5);
    tokio::time::timeout(within, leading.wait_for(|armed| *armed))
        .await
        .expect("a single node leads within 5 s")
        .expect("the node is still there");
    consensus
}

/// An encoded append from a leader of term 0, which any node that has
/// voted refuses for its higher vote.
#[cfg(test)]
pub(crate) fn stale_append() -> Vec<u8> {
    let request = openraft::raft::AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(0, 2),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    };
    transport::encode(&request).expect("encode")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_node_shows_it_leads_and_once_stopped_says_so_and_waits_forever() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A single node leads at once, and those watching see it armed.
        let consensus = leading_single_node(dir.path()).await;
        let mut leading = consensus.leading();
        assert!(consensus.now().is_some());
        consensus.shutdown().await;
        let why = tokio::time::timeout(Duration::from_secs(5), consensus.stopped())
            .await
            .expect("stopped answers once the node has stopped");
        assert!(!why.is_empty());
        // It stamps nothing more once stopped, and then its watch stays
        // still: answering at once would make every loop over it spin.
        tokio::time::timeout(Duration::from_secs(5), leading.wait_for(|armed| !*armed))
            .await
            .expect("the stopped node is no longer armed within 5 s")
            .expect("the node is still there");
        assert!(consensus.now().is_none());
        let changed = tokio::time::timeout(Duration::from_millis(200), leading.changed());
        assert!(changed.await.is_err());
    }
}
