//! Consensus: the lock table replicated by openraft.
//!
//! Every openraft type stays inside this module; the rest of the server sees
//! [`Consensus`], which proposes lock-table commands stamped with the leader's
//! clock and reads the applied table. A single node is a one-member Raft group,
//! so a cluster is membership plus a peer transport, not a different code path.

mod log_store;
mod network;
mod state_machine;

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use leasehold_core::{Command, LockTable, Outcome, Stamp, Time};
use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::{BasicNode, Config, Raft, ServerState, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::hub::Hub;
use log_store::LogStore;
use state_machine::{Shared, StateMachine};

/// One entry of the replicated log: a batch of commands and the leader's stamp
/// on it.
///
/// openraft 0.9 appends each client write separately and waits for its flush
/// before the next, so one write per entry would cost one fsync per command.
/// Instead concurrent proposals are gathered into one entry (group commit at
/// the proposal level): while one batch is being made durable, the next fills.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    /// The leader's clock and term when it proposed the batch.
    pub stamp: Stamp,
    /// The changes to the lock table, applied in order.
    pub commands: Vec<Command>,
}

/// At most this many commands in one log entry.
const MAX_BATCH: usize = 1024;
/// At most this many batches handed to openraft at once. openraft 0.9 writes
/// and fsyncs one entry at a time, so a second batch in flight does not
/// overlap anything; it only splits the next batch in two (measured: 1 in
/// flight gave 8.3k cycles/s at 50 clients, 2 gave 7.6k, 4 gave 6.0k).
const MAX_IN_FLIGHT: usize = 1;

type Proposal = (Command, oneshot::Sender<Result<Outcome, ConsensusError>>);

pub(crate) type NodeId = u64;
pub(crate) type Node = BasicNode;

openraft::declare_raft_types!(
    /// Leasehold's openraft configuration.
    pub TypeConfig:
        D = Request,
        R = Vec<Outcome>,
        Node = BasicNode,
);

/// Why a proposal or a read could not be served here.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ConsensusError {
    /// Another node leads; send the request there.
    #[error("not the leader{}", leader.as_ref().map(|l| format!("; the leader is at {l}")).unwrap_or_default())]
    NotLeader {
        /// The leader's address, when known.
        leader: Option<String>,
    },
    /// This node leads but is still catching up its state; retry shortly.
    #[error("the leader is starting; retry shortly")]
    Starting,
    /// The Raft node has stopped (a storage failure or shutdown).
    #[error("consensus stopped: {0}")]
    Stopped(String),
}

/// The leader's clock: table time when this node became leader, plus the
/// monotonic time elapsed since. Starting from the applied table time keeps
/// table time continuous across leader changes and restarts.
#[derive(Clone, Copy)]
struct LeaderClock {
    term: u64,
    epoch: u64,
    base: Time,
    started: Instant,
}

impl LeaderClock {
    fn now(&self) -> Time {
        self.base + self.started.elapsed().as_millis() as Time
    }
}

/// The epoch a new leadership stamps on its commands: above every epoch
/// applied so far, so its first command gives every lease its full TTL again.
///
/// The term is in the high bits, so a higher term always wins. A restarted
/// single node may lead again in the same term; the low bits count those
/// incarnations.
fn leadership_epoch(term: u64, applied_epoch: u64) -> u64 {
    const INCARNATION_BITS: u32 = 24;
    if applied_epoch >> INCARNATION_BITS >= term {
        applied_epoch + 1
    } else {
        term << INCARNATION_BITS
    }
}

/// A running Raft node with the lock table as its state machine.
#[derive(Clone)]
pub struct Consensus {
    raft: Raft<TypeConfig>,
    shared: Arc<Shared>,
    clock: Arc<Mutex<Option<LeaderClock>>>,
    proposals: mpsc::Sender<Proposal>,
}

/// Tuning for the Raft node.
#[derive(Debug, Clone)]
pub struct RaftOptions {
    /// Take a snapshot after this many applied commands since the last one.
    pub snapshot_every: u64,
}

impl Default for RaftOptions {
    fn default() -> Self {
        RaftOptions {
            snapshot_every: 100_000,
        }
    }
}

impl Consensus {
    /// Opens the log and snapshot under `dir` and starts the node as the only
    /// member of its group (initializing the group on first start).
    pub async fn start(
        dir: &Path,
        advertise: &str,
        hub: Arc<Hub>,
        options: RaftOptions,
    ) -> anyhow::Result<Consensus> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("create data dir {}", dir.display()))?;
        let log =
            LogStore::open(dir).with_context(|| format!("open raft log in {}", dir.display()))?;
        let sm = StateMachine::open(dir, hub, options.snapshot_every, log.applied_index())
            .with_context(|| format!("open snapshot in {}", dir.display()))?;
        let shared = sm.shared.clone();
        let config = Config {
            cluster_name: "leasehold".into(),
            heartbeat_interval: 50,
            election_timeout_min: 150,
            election_timeout_max: 300,
            // Snapshots are triggered by applied commands (see `snapshot_when_due`).
            snapshot_policy: SnapshotPolicy::Never,
            // Entries are batches of up to MAX_BATCH commands: keep few after a snapshot.
            max_in_snapshot_log_to_keep: 8,
            ..Default::default()
        };
        let config = Arc::new(config.validate().context("validate raft config")?);
        let node_id: NodeId = 1;
        let raft = Raft::new(node_id, config, network::NoPeers, log, sm)
            .await
            .context("start raft")?;
        let members = BTreeMap::from([(
            node_id,
            BasicNode {
                addr: advertise.to_string(),
            },
        )]);
        // Asked first: openraft logs an error for an initialize it refuses,
        // and a restart is not an error.
        if raft.is_initialized().await.context("read raft state")? {
            tracing::info!("rejoining the group recorded in the data dir");
        } else {
            match raft.initialize(members).await {
                Ok(()) => tracing::info!("initialized a new single-node group"),
                Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
                Err(e) => return Err(e).context("initialize raft group"),
            }
        }
        let (proposals, queue) = mpsc::channel(64 * MAX_BATCH);
        let consensus = Consensus {
            raft,
            shared,
            clock: Arc::new(Mutex::new(None)),
            proposals,
        };
        tokio::spawn(consensus.clone().follow_leadership(node_id));
        tokio::spawn(consensus.clone().batch_proposals(queue));
        tokio::spawn(consensus.clone().snapshot_when_due());
        Ok(consensus)
    }

    /// Takes a snapshot (and so lets the log be purged) every
    /// `snapshot_every` applied commands.
    async fn snapshot_when_due(self) {
        loop {
            self.shared.snapshot_due.notified().await;
            if self.raft.trigger().snapshot().await.is_err() {
                return;
            }
        }
    }

    /// Keeps the leader clock in step with this node's role: set it (from the
    /// applied table time) once this node leads with an up-to-date state
    /// machine, clear it when it stops leading.
    async fn follow_leadership(self, me: NodeId) {
        let mut metrics = self.raft.metrics();
        loop {
            let (leading, term) = {
                let m = metrics.borrow_and_update();
                (
                    m.state == ServerState::Leader && m.current_leader == Some(me),
                    m.current_term,
                )
            };
            let current = self.clock().map(|c| c.term);
            if !leading {
                self.set_clock(None);
            } else if current != Some(term) {
                // Wait until everything committed before this term is applied,
                // so the clock starts from the latest table time.
                match self.raft.ensure_linearizable().await {
                    Ok(_) => {
                        let (base, applied_epoch) = {
                            let applied = self.shared.lock();
                            (applied.table.now(), applied.table.epoch())
                        };
                        let epoch = leadership_epoch(term, applied_epoch);
                        tracing::info!(
                            term,
                            epoch,
                            table_time = base,
                            "leading; expiry driver armed"
                        );
                        self.set_clock(Some(LeaderClock {
                            term,
                            epoch,
                            base,
                            started: Instant::now(),
                        }));
                        // The first command of the new epoch restamps every lease.
                        if let Err(e) = self.propose(Command::Tick).await {
                            tracing::debug!(error = %e, "first tick of a new leadership");
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "not yet able to lead");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                }
            }
            if metrics.changed().await.is_err() {
                return;
            }
        }
    }

    fn clock(&self) -> Option<LeaderClock> {
        *self.clock.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_clock(&self, clock: Option<LeaderClock>) {
        *self.clock.lock().unwrap_or_else(|e| e.into_inner()) = clock;
    }

    fn not_leader(&self) -> ConsensusError {
        let m = self.raft.metrics().borrow().clone();
        let leader = m.current_leader.and_then(|id| {
            m.membership_config
                .membership()
                .get_node(&id)
                .map(|n| n.addr.clone())
        });
        match (m.state, m.current_leader) {
            (ServerState::Leader, _) => ConsensusError::Starting,
            _ => ConsensusError::NotLeader { leader },
        }
    }

    /// The leader's current time, if this node leads.
    pub fn now(&self) -> Option<Time> {
        self.clock().map(|c| c.now())
    }

    /// Stamps `command` with the leader's clock, replicates it durably and
    /// applies it. Answers once the entry is on disk and applied.
    pub async fn propose(&self, command: Command) -> Result<Outcome, ConsensusError> {
        if self.clock().is_none() {
            return Err(self.not_leader());
        }
        let (tx, rx) = oneshot::channel();
        self.proposals
            .send((command, tx))
            .await
            .map_err(|_| ConsensusError::Stopped("the proposer stopped".into()))?;
        rx.await
            .map_err(|_| ConsensusError::Stopped("the proposer dropped a proposal".into()))?
    }

    /// Gathers proposals into batches, one log entry each.
    async fn batch_proposals(self, mut queue: mpsc::Receiver<Proposal>) {
        let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        while let Some(first) = queue.recv().await {
            // Waiting for a slot is what lets the next batch grow.
            let Ok(permit) = in_flight.clone().acquire_owned().await else {
                return;
            };
            let mut batch = Vec::with_capacity(MAX_BATCH.min(queue.len() + 1));
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match queue.try_recv() {
                    Ok(p) => batch.push(p),
                    Err(_) => break,
                }
            }
            let this = self.clone();
            tokio::spawn(async move {
                this.write_batch(batch).await;
                drop(permit);
            });
        }
    }

    async fn write_batch(&self, batch: Vec<Proposal>) {
        let Some(clock) = self.clock() else {
            let e = self.not_leader();
            for (_, tx) in batch {
                let _ = tx.send(Err(e.clone()));
            }
            return;
        };
        let (commands, answers): (Vec<Command>, Vec<_>) = batch.into_iter().unzip();
        let request = Request {
            stamp: Stamp {
                now: clock.now(),
                epoch: clock.epoch,
            },
            commands,
        };
        let result = match self.raft.client_write(request).await {
            Ok(response) => Ok(response.data),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(ConsensusError::NotLeader {
                    leader: f.leader_node.map(|n| n.addr),
                })
            }
            Err(e) => Err(ConsensusError::Stopped(e.to_string())),
        };
        match result {
            Ok(outcomes) => {
                for (tx, outcome) in answers.into_iter().zip(outcomes) {
                    let _ = tx.send(Ok(outcome));
                }
            }
            Err(e) => {
                for tx in answers {
                    let _ = tx.send(Err(e.clone()));
                }
            }
        }
    }

    /// Reads the applied table after confirming leadership (a linearizable read),
    /// passing the leader's current time for TTLs left.
    pub async fn read<T>(
        &self,
        f: impl FnOnce(&LockTable, Time) -> T,
    ) -> Result<T, ConsensusError> {
        if self.raft.ensure_linearizable().await.is_err() {
            return Err(self.not_leader());
        }
        let Some(now) = self.now() else {
            return Err(self.not_leader());
        };
        let applied = self.shared.lock();
        Ok(f(&applied.table, now))
    }

    /// Reads the applied table as it stands here, without a leadership check.
    pub fn read_local<T>(&self, f: impl FnOnce(&LockTable) -> T) -> T {
        f(&self.shared.lock().table)
    }

    /// The hub this node's state machine publishes to.
    pub fn hub(&self) -> &Arc<Hub> {
        &self.shared.hub
    }

    /// Waits until this node's role may have changed.
    pub async fn role_changed(&self) {
        let mut metrics = self.raft.metrics();
        let _ = metrics.changed().await;
    }

    /// The index of the last applied log entry.
    pub fn last_applied(&self) -> u64 {
        self.shared.lock().last_applied.map_or(0, |l| l.index)
    }

    /// Stops the Raft node.
    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::leadership_epoch;

    #[test]
    fn every_leadership_gets_a_higher_epoch() {
        let first = leadership_epoch(1, 0);
        let restarted = leadership_epoch(1, first);
        let again = leadership_epoch(1, restarted);
        let new_term = leadership_epoch(2, again);
        assert!(0 < first && first < restarted && restarted < again && again < new_term);
        assert!(leadership_epoch(3, leadership_epoch(2, 5)) > leadership_epoch(2, 5));
    }
}

/// openraft's storage conformance suite, run against our log store and state
/// machine, plus the crash cases specific to our on-disk format.
#[cfg(test)]
mod storage_tests {
    use std::sync::Arc;

    use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
    use openraft::testing::{StoreBuilder, Suite};
    use openraft::{Entry, EntryPayload, LogId, RaftLogReader, StorageError};

    use super::log_store::LogStore;
    use super::state_machine::StateMachine;
    use super::{NodeId, TypeConfig};
    use crate::hub::Hub;

    struct Builder;

    impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
        async fn build(
            &self,
        ) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<NodeId>> {
            let dir = tempfile::tempdir().expect("tempdir");
            let log = LogStore::open(dir.path()).expect("open log");
            let sm = StateMachine::open(
                dir.path(),
                Arc::new(Hub::default()),
                1_000,
                log.applied_index(),
            )
            .expect("open state machine");
            Ok((dir, log, sm))
        }
    }

    #[test]
    fn openraft_storage_suite() {
        Suite::test_all(Builder).expect("storage suite");
    }

    fn blank(index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Blank,
        }
    }

    async fn append(log: &mut LogStore, entries: Vec<Entry<TypeConfig>>) {
        log.blocking_append(entries)
            .await
            .expect("append and flush");
    }

    fn only_segment(dir: &std::path::Path) -> std::path::PathBuf {
        std::fs::read_dir(dir.join("log"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path()
    }

    /// The byte ranges of the records at the start of a segment (it is
    /// preallocated, so the file is longer than its records).
    fn record_spans(bytes: &[u8]) -> Vec<std::ops::Range<usize>> {
        let mut spans = Vec::new();
        let mut at = 0;
        while at + 8 <= bytes.len() {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            if len == 0 {
                break;
            }
            spans.push(at..at + 8 + len);
            at += 8 + len;
        }
        spans
    }

    async fn indexes(log: &mut LogStore) -> Vec<u64> {
        let entries = log.try_get_log_entries(..).await.unwrap();
        entries.iter().map(|e| e.log_id.index).collect()
    }

    #[tokio::test]
    async fn a_torn_tail_is_cut_and_everything_before_it_survives() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let mut log = LogStore::open(dir.path()).expect("open");
            append(&mut log, (1..=10).map(blank).collect()).await;
        }
        // A crash mid-write leaves half a record after the last whole one.
        let seg = only_segment(dir.path());
        let mut bytes = std::fs::read(&seg).unwrap();
        let whole = record_spans(&bytes).last().unwrap().end;
        bytes[whole..whole + 7].copy_from_slice(&[200, 0, 0, 0, 1, 2, 3]);
        std::fs::write(&seg, &bytes).unwrap();

        let mut log = LogStore::open(dir.path()).expect("reopen");
        let after = std::fs::read(&seg).unwrap();
        assert_eq!(&after[..whole], &bytes[..whole]);
        assert!(
            after[whole..].iter().all(|&b| b == 0),
            "the torn record is cut"
        );
        assert_eq!(indexes(&mut log).await, (1..=10).collect::<Vec<_>>());
        // And the log keeps working after the cut.
        append(&mut log, vec![blank(11)]).await;
        drop(log);
        let mut log = LogStore::open(dir.path()).expect("reopen again");
        assert_eq!(indexes(&mut log).await, (1..=11).collect::<Vec<_>>());
    }

    /// A crash can persist the end of an unacknowledged write but not its
    /// start. Records written later over that start must not join up with
    /// the stale remainder.
    #[tokio::test]
    async fn a_stale_record_behind_a_gap_is_never_replayed() {
        let donor = tempfile::tempdir().expect("tempdir");
        {
            let mut log = LogStore::open(donor.path()).expect("open");
            append(&mut log, (1..=12).map(blank).collect()).await;
        }
        let donor_bytes = std::fs::read(only_segment(donor.path())).unwrap();
        let donor_spans = record_spans(&donor_bytes);
        let (eleven, twelve) = (donor_spans[10].clone(), donor_spans[11].clone());

        let dir = tempfile::tempdir().expect("tempdir");
        {
            let mut log = LogStore::open(dir.path()).expect("open");
            append(&mut log, (1..=10).map(blank).collect()).await;
        }
        let seg = only_segment(dir.path());
        let mut bytes = std::fs::read(&seg).unwrap();
        let end = record_spans(&bytes).last().unwrap().end;
        // Entry 11's bytes never reached the disk; entry 12's did.
        let twelve_at = end + eleven.len();
        bytes[twelve_at..twelve_at + twelve.len()].copy_from_slice(&donor_bytes[twelve]);
        std::fs::write(&seg, &bytes).unwrap();

        let mut log = LogStore::open(dir.path()).expect("reopen");
        assert_eq!(indexes(&mut log).await, (1..=10).collect::<Vec<_>>());
        append(&mut log, vec![blank(11)]).await;
        drop(log);
        let mut log = LogStore::open(dir.path()).expect("reopen again");
        assert_eq!(indexes(&mut log).await, (1..=11).collect::<Vec<_>>());
    }

    fn big(index: u64) -> Entry<TypeConfig> {
        let command = leasehold_core::Command::SaveCheckpoint {
            key: format!("k{index}"),
            fence: index,
            data: vec![index as u8; 64 * 1024],
        };
        Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(super::Request {
                stamp: leasehold_core::Stamp { now: 0, epoch: 1 },
                commands: vec![command],
            }),
        }
    }

    fn segment_count(dir: &std::path::Path) -> usize {
        std::fs::read_dir(dir.join("log")).unwrap().count()
    }

    #[tokio::test]
    async fn segments_roll_over_and_purged_ones_are_deleted() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let mut log = LogStore::open(dir.path()).expect("open");
            // 300 x 64 KiB: more than two 8 MiB segments.
            for chunk in (1..=300).collect::<Vec<u64>>().chunks(20) {
                append(&mut log, chunk.iter().map(|&i| big(i)).collect()).await;
            }
            assert_eq!(segment_count(dir.path()), 3);
            log.purge(*big(280).get_log_id()).await.unwrap();
            // Flushed after the purge, so the purge is done when it returns.
            append(&mut log, vec![big(301)]).await;
        }
        assert_eq!(
            segment_count(dir.path()),
            1,
            "segments below the purge point are deleted"
        );
        let mut log = LogStore::open(dir.path()).expect("reopen");
        assert_eq!(indexes(&mut log).await, (281..=301).collect::<Vec<_>>());
        let entries = log.try_get_log_entries(300..301).await.unwrap();
        assert_eq!(
            format!("{:?}", entries[0].payload),
            format!("{:?}", big(300).payload)
        );
        append(&mut log, vec![big(302)]).await;
        drop(log);
        let mut log = LogStore::open(dir.path()).expect("reopen again");
        assert_eq!(indexes(&mut log).await, (281..=302).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn applied_entries_leave_memory_and_are_read_back_from_disk() {
        use std::sync::atomic::Ordering;
        let dir = tempfile::tempdir().expect("tempdir");
        let mut log = LogStore::open(dir.path()).expect("open");
        append(&mut log, (1..=200).map(blank).collect()).await;
        log.truncate(*blank(190).get_log_id()).await.unwrap();
        log.purge(*blank(5).get_log_id()).await.unwrap();
        log.applied_index().store(180, Ordering::Relaxed);
        append(&mut log, (190..=210).map(blank).collect()).await;
        let in_memory = log.entries_in_memory();
        assert!(
            in_memory < 100,
            "applied entries stay in memory: {in_memory}"
        );
        // Every entry not purged is still there, from disk or from memory,
        // with the truncation and the purge applied.
        assert_eq!(indexes(&mut log).await, (6..=210).collect::<Vec<_>>());
        let some = log.try_get_log_entries(10..20).await.unwrap();
        assert_eq!(
            some.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
            (10..20).collect::<Vec<_>>()
        );
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id.map(|l| l.index), Some(210));
    }

    #[tokio::test]
    async fn truncate_and_purge_survive_a_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let mut log = LogStore::open(dir.path()).expect("open");
            append(&mut log, (1..=10).map(blank).collect()).await;
            log.truncate(*blank(8).get_log_id()).await.unwrap();
            log.purge(*blank(3).get_log_id()).await.unwrap();
            append(&mut log, vec![blank(8)]).await;
        }
        let mut log = LogStore::open(dir.path()).expect("reopen");
        let indexes: Vec<u64> = log
            .try_get_log_entries(0..100)
            .await
            .unwrap()
            .iter()
            .map(|e| e.log_id.index)
            .collect();
        assert_eq!(indexes, vec![4, 5, 6, 7, 8]);
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id.map(|l| l.index), Some(3));
    }

    use openraft::RaftLogId;
}
