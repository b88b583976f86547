//! Starting a node: from injected parts, and forming a group exactly once.
//!
//! A node is built from its id and address, the voters of a new group, a log
//! store, the lock table's state machine, a transport to its peers and a clock
//! ([`Consensus::start_with`]); [`Consensus::start`] supplies the real ones
//! (segment log and snapshot under the data dir, gRPC to peers, the system's
//! monotonic clock), a simulation its own.
//!
//! Forming a group: a node whose log is empty initializes the group only if
//! it is the single member, or the lowest id of the initial voters and no
//! peer answers that it already belongs to a group (holds a log entry or a
//! snapshot). A vote alone is no group (a peer that voted for the first
//! candidate and got none of its entries before the lowest id lost its
//! data, or a wiped peer the leader is rebuilding), but it shows an
//! election took place: then every peer must answer before the group is
//! formed, since one that does not may hold the group, and the lowest id
//! asks again every second. While no peer that answers has voted (a first
//! start), one that does not answer counts as holding nothing, so a group
//! forms with a member still down. All of this asks only the initial
//! voters (`--peers`): it assumes they still hold the group. Every other
//! node waits to be contacted by a leader. A node restarted on its data dir
//! rejoins with what the dir records; a wiped member is brought back by the
//! leader (log or snapshot), not by a second initialization.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use anyhow::Context;
use openraft::errors::{InitializeError, RaftError};
use openraft::storage::RaftLogStorage;
use openraft::{BasicNode, Config, SnapshotPolicy};

use super::batch::MAX_BATCH;
use super::leadership::{system_clock, Clock};
use super::state_machine::StateMachine;
use super::storage::log_store::LogStore;
use super::storage::snapshot_store::FileSnapshots;
use super::transport::grpc::GrpcTransport;
use super::transport::peer::PeerNetwork;
use super::transport::Heard;
use super::transport::Transport;
use super::{Consensus, NodeId, Raft, TypeConfig};
use crate::context::NodeContext;

/// Tuning for the Raft node.
#[derive(Debug, Clone)]
pub struct RaftOptions {
    /// Take a snapshot after at least this many applied commands since the
    /// last one, once their log entries are as large as that snapshot.
    pub snapshot_every: u64,
    /// A snapshot is sent to a peer in chunks of at most this many bytes.
    pub snapshot_chunk_bytes: u64,
    /// The leader's heartbeat to followers.
    pub heartbeat: Duration,
    /// A follower that hears no leader for a random time in this range
    /// starts an election. Failover takes about the low end plus one
    /// round trip.
    pub election_timeout: (Duration, Duration),
    /// Every member hashes its table after applying each entry whose index
    /// is a multiple of this, and the leader compares the hashes (0: never;
    /// see `raft::operations::hash_check`).
    pub hash_check_every: u64,
}

impl Default for RaftOptions {
    fn default() -> Self {
        RaftOptions {
            snapshot_every: 100_000,
            snapshot_chunk_bytes: 3 * 1024 * 1024,
            heartbeat: Duration::from_millis(50),
            election_timeout: (Duration::from_millis(100), Duration::from_millis(200)),
            hash_check_every: 100_000,
        }
    }
}

/// How often a node that may form the group asks its peers again while
/// one that voted holds no entry and another does not answer.
const FORM_RETRY: Duration = Duration::from_secs(1);

/// What the other initial voters say about forming the group.
enum Forming {
    /// No peer holds an entry or a snapshot, and none that does can hide
    /// among those that did not answer: form it.
    Go,
    /// This peer belongs to the group already.
    Exists(NodeId),
    /// Peer `voted` voted in term `term` and holds no entry, and `silent`
    /// did not answer: it may hold the group's state.
    Unsure {
        voted: NodeId,
        term: u64,
        silent: NodeId,
    },
}

/// Who a node is, and the voters of the group it forms if it is new.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// This node's id.
    pub id: NodeId,
    /// Its address, as its peers and clients reach it.
    pub addr: String,
    /// The initial voters by id, this node among them. One member: a
    /// single-node group.
    pub members: BTreeMap<NodeId, String>,
    /// The local address to connect to peers from (`None`: any).
    pub source: Option<std::net::IpAddr>,
}

impl NodeSpec {
    /// A single-node group: node 1 at `addr`.
    pub fn single(addr: &str) -> NodeSpec {
        NodeSpec {
            id: 1,
            addr: addr.to_string(),
            members: BTreeMap::from([(1, addr.to_string())]),
            source: None,
        }
    }
}

fn raft_config(options: &RaftOptions) -> anyhow::Result<Arc<Config>> {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let config = Config {
        cluster_name: "leasehold".into(),
        heartbeat_interval: ms(options.heartbeat),
        election_timeout_min: ms(options.election_timeout.0),
        election_timeout_max: ms(options.election_timeout.1),
        // Snapshots are triggered by applied commands (see `snapshot_when_due`).
        snapshot_policy: SnapshotPolicy::Never,
        // Entries are batches of up to MAX_BATCH commands: keep few after a
        // snapshot, and send few per append.
        max_in_snapshot_log_to_keep: 8,
        max_payload_entries: 64,
        // A 3 MiB snapshot chunk over loopback or a LAN, with room for a
        // loaded machine.
        install_snapshot_timeout: 2_000,
        snapshot_max_chunk_size: options.snapshot_chunk_bytes,
        // A member whose data dir was lost comes back empty under its id:
        // the leader starts over with it (a snapshot) instead of stopping.
        allow_log_reversion: Some(true),
        // A node asks before it campaigns, and only raises its term if a
        // majority would vote for it: a member cut off and healed, or one
        // whose log is behind, no longer deposes a healthy leader.
        enable_pre_vote: Some(true),
        // A leader that restarts campaigns again instead of resuming in its
        // old term. Resumed, its read index starts at the first entry of the
        // term and so misses what it committed before it stopped (the
        // simulation found stale reads after a power loss, seed 204).
        enable_leader_restore: Some(false),
        ..Default::default()
    };
    Ok(Arc::new(config.validate().context("validate raft config")?))
}

impl Consensus {
    /// Opens the log and snapshot under `dir` and starts the node with gRPC
    /// peers (over mutual TLS if `tls` has peer certificates) and the
    /// system's clock.
    pub async fn start(
        dir: &Path,
        spec: NodeSpec,
        context: Arc<NodeContext>,
        options: RaftOptions,
        tls: Option<Arc<crate::tls::Tls>>,
    ) -> anyhow::Result<Consensus> {
        super::storage::format::open_data_dir(dir)?;
        context.cluster.load(dir)?;
        let log = LogStore::open_observed(dir, context.metrics.log_fsync.clone())
            .with_context(|| format!("open raft log in {}", dir.display()))?;
        let transport = Arc::new(
            GrpcTransport::new(spec.source, tls, context.cluster.clone())
                .counting_streams(context.metrics.append_streams.clone()),
        );
        let snapshots = Arc::new(FileSnapshots::in_dir(dir));
        let sm = StateMachine::open(
            snapshots,
            context,
            options.snapshot_every,
            log.applied_index(),
        )
        .with_context(|| format!("open snapshot in {}", dir.display()))?;
        Consensus::start_with(spec, options, log, sm, transport, system_clock()).await
    }

    /// Starts a node from its parts.
    pub async fn start_with<LS>(
        spec: NodeSpec,
        options: RaftOptions,
        log: LS,
        sm: StateMachine,
        transport: Arc<dyn Transport>,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Consensus>
    where
        LS: RaftLogStorage<TypeConfig>,
    {
        anyhow::ensure!(
            spec.members.contains_key(&spec.id),
            "node {} is not among the initial members {:?}",
            spec.id,
            spec.members.keys().collect::<Vec<_>>()
        );
        let shared = sm.shared.clone();
        // Twenty heartbeats, and at least a second: a member that misses a
        // few on a loaded machine is not reported cut off.
        let heard = Arc::new(Heard::new(
            (options.heartbeat * 20).max(Duration::from_secs(1)),
        ));
        let network = PeerNetwork {
            transport: transport.clone(),
            snapshot_chunks: shared.context.metrics.snapshot_chunks.clone(),
            heard: heard.clone(),
            snapshots_sent: Arc::default(),
        };
        // No entry ever and no snapshot: whatever vote it holds, the node
        // is in no group.
        let mut log = log;
        let log_empty = log
            .get_log_state()
            .await
            .context("read the raft log's state")?
            .last_log_id
            .is_none()
            && shared.read().last_applied.is_none();
        let raft = Raft::new(spec.id, raft_config(&options)?, network, log, sm)
            .await
            .context("start raft")?;
        // Before the first tick (one and a half heartbeats away).
        raft.runtime_config().elect(false);
        let (proposals, queues) = super::batch::lanes(64 * MAX_BATCH);
        let consensus = Consensus {
            raft,
            shared,
            clock,
            leader: Arc::new(Mutex::new(None)),
            armed: Arc::new(tokio::sync::watch::Sender::new(false)),
            proposals,
            transport,
            heard,
            incoming: Arc::default(),
            removed: Arc::default(),
            stopping: Arc::default(),
            id: spec.id,
        };
        consensus.form_group(&spec, log_empty).await?;
        consensus.shared.marks.set_every(options.hash_check_every);
        if options.hash_check_every > 0 {
            consensus.check_tables_periodically();
        }
        // Pre-vote keeps a restarted member, or one whose log is behind,
        // from deposing a healthy leader: it campaigns only if a majority
        // would vote for it.
        consensus.allow_campaigns();
        tokio::spawn(
            consensus
                .clone()
                // Well past the followers' lease on it (at least a second):
                // metrics that arrive late on a busy machine must not make a
                // healthy leader stop serving. Calls that hang on a leader
                // that really is cut off are also cut by the client.
                .follow_leadership(
                    spec.id,
                    (options.election_timeout.1 * 4).max(Duration::from_secs(1)),
                ),
        );
        tokio::spawn(consensus.clone().notice_removal());
        tokio::spawn(consensus.clone().batch_proposals(queues));
        tokio::spawn(consensus.clone().snapshot_when_due());
        Ok(consensus)
    }

    /// Initializes the group if this node is the one to (see the module doc).
    /// `log_empty`: the log never held an entry, and no snapshot was taken
    /// or installed.
    async fn form_group(&self, spec: &NodeSpec, log_empty: bool) -> anyhow::Result<()> {
        let cluster = &self.shared.context.cluster;
        if log_empty {
            // In no group yet, even if it voted before a restart (openraft
            // then counts it as initialized): the first leader that sends
            // this node entries names its cluster, unless this node forms
            // the group (below).
            cluster.adopt_from_first_leader();
        }
        // Asked first: openraft logs an error for an initialize it refuses,
        // and a restart is not an error.
        if self
            .raft
            .is_initialized()
            .await
            .context("read raft state")?
        {
            if log_empty {
                tracing::info!(
                    id = spec.id,
                    "this node holds a vote and no entry: waiting for a leader to contact it"
                );
            } else {
                tracing::info!(id = spec.id, "rejoining the group recorded in the data dir");
                self.check_own_address(spec)?;
            }
            return Ok(());
        }
        let lowest = spec.members.keys().next().copied();
        if lowest != Some(spec.id) {
            tracing::info!(id = spec.id, "new node: waiting for a leader to contact it");
            return Ok(());
        }
        match self.may_form(spec, None).await {
            Forming::Go => self.initialize_group(spec).await,
            Forming::Exists(peer) => {
                tracing::warn!(
                    id = spec.id,
                    peer,
                    "this node's data dir is empty but its peers already form a group: not initializing; the leader will bring it back"
                );
                Ok(())
            }
            Forming::Unsure {
                voted,
                term,
                silent,
            } => {
                tracing::warn!(
                    id = spec.id,
                    voted,
                    term,
                    silent,
                    "empty data dir, a peer voted but holds no entry, and a silent one may hold the group: forming no group until every member answers"
                );
                tokio::spawn(
                    self.clone()
                        .form_once_every_member_answers(spec.clone(), (voted, term)),
                );
                Ok(())
            }
        }
    }

    /// What the other initial voters say about forming the group.
    ///
    /// A peer belongs to a group if it holds an entry or a snapshot; a vote
    /// alone is no group. But a vote shows that an election took place, so
    /// the group may hold state on a peer that does not answer: then nothing
    /// is formed. `election`: a vote seen by an earlier round of probes
    /// (`(voter, term)`), still evidence when that peer is silent now.
    async fn may_form(&self, spec: &NodeSpec, election: Option<(NodeId, u64)>) -> Forming {
        let (mut voted, mut silent) = (election, None);
        for (&id, addr) in spec.members.iter().filter(|(&id, _)| id != spec.id) {
            match self.probe(id, addr).await {
                Some(p) if p.initialized => return Forming::Exists(id),
                Some(p) if p.term > 0 => voted = voted.or(Some((id, p.term))),
                Some(_) => {}
                None => silent = silent.or(Some(id)),
            }
        }
        match (voted, silent) {
            (Some((voted, term)), Some(silent)) => Forming::Unsure {
                voted,
                term,
                silent,
            },
            _ => Forming::Go,
        }
    }

    /// Asks the peers again every [`FORM_RETRY`] until every one answers
    /// (then forms the group if none holds one), until one holds the group,
    /// or until this node is in one (a leader's entries, or a vote it cast
    /// in an election) or stops. `election`: the vote that made it wait.
    async fn form_once_every_member_answers(self, spec: NodeSpec, election: (NodeId, u64)) {
        loop {
            tokio::time::sleep(FORM_RETRY).await;
            if !matches!(self.raft.is_initialized().await, Ok(false)) {
                return;
            }
            match self.may_form(&spec, Some(election)).await {
                Forming::Go => {
                    if let Err(e) = self.initialize_group(&spec).await {
                        tracing::error!(error = %format!("{e:#}"), "forming the group failed");
                    }
                    return;
                }
                Forming::Exists(peer) => {
                    tracing::info!(
                        id = spec.id,
                        peer,
                        "a peer holds the group: waiting for its leader"
                    );
                    return;
                }
                Forming::Unsure { .. } => {}
            }
        }
    }

    async fn initialize_group(&self, spec: &NodeSpec) -> anyhow::Result<()> {
        let members: BTreeMap<NodeId, BasicNode> = spec
            .members
            .iter()
            .map(|(&id, addr)| (id, BasicNode { addr: addr.clone() }))
            .collect();
        let cluster = &self.shared.context.cluster;
        let made = cluster
            .make_for_new_group()
            .context("keep the new cluster's id in the data dir")?;
        match self.raft.initialize(members).await {
            Ok(()) => tracing::info!(
                id = spec.id,
                members = ?spec.members,
                "initialized a new group"
            ),
            // It voted in another's election meanwhile: that leader's id is
            // the one to take.
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {
                if let Some(made) = made {
                    cluster
                        .unmake(made)
                        .context("take back the cluster id of a group not formed")?;
                }
            }
            Err(e) => return Err(e).context("initialize raft group"),
        }
        Ok(())
    }

    /// Lets openraft campaign again, unless this node was removed or is
    /// stopping.
    pub(super) fn allow_campaigns(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        let removed = self.removed.load(SeqCst);
        self.raft
            .runtime_config()
            .elect(!removed && !self.stopping.load(SeqCst));
        // A stop that began meanwhile may have turned campaigns off before
        // they were turned on here: off again.
        if self.stopping.load(SeqCst) {
            self.raft.runtime_config().elect(false);
        }
    }

    /// Takes a snapshot (and so lets the log be purged) whenever the state
    /// machine says one is due.
    async fn snapshot_when_due(self) {
        loop {
            self.shared.snapshot_due.notified().await;
            if self.raft.trigger().snapshot().await.is_err() {
                return;
            }
        }
    }
}
