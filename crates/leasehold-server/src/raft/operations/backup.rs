//! Backups and restores.
//!
//! A backup is a snapshot file (`snapshot_store`'s format: version,
//! meta with the last log index and term and the membership, a CRC-32 of
//! the meta, then the table's encoding with its own version and CRC-32),
//! taken from the leader's applied table after a linearizable read, so it
//! holds every write acknowledged before it was asked for.
//!
//! A restore builds the data dir of one member of a new cluster from a
//! backup; every member is built from the same file. Grants made after the
//! backup are lost, so the restored table's token and lease id sequences
//! move up a stride (`LockTable::prepare_for_new_cluster`): every token the
//! new cluster hands out is above every token the old one could have. The
//! restored leases get a full TTL from the new cluster's first leader.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::Path;

use anyhow::Context;
use openraft::storage::RaftLogStorage;
use openraft::Membership;

use crate::raft::storage::dir_lock::{DirLock, LOCK_FILE};
use crate::raft::storage::format::{self, encode_table};
use crate::raft::storage::log_store::records::read_log;
use crate::raft::storage::log_store::LogStore;
use crate::raft::storage::snapshot_store::{file_head, FileSnapshots, SnapshotStore};
use crate::raft::{Consensus, ConsensusError, Node, NodeId, SnapshotMeta, StoredMembership, Vote};

/// A backup, encoded whole.
pub struct Backup {
    /// The file's bytes.
    pub bytes: Vec<u8>,
    /// The last log index it holds.
    pub index: u64,
    /// That entry's term.
    pub term: u64,
}

impl Consensus {
    /// A backup of everything applied, taken on the leader after a
    /// linearizable read: it holds every write acknowledged before the call.
    pub async fn backup(&self) -> Result<Backup, ConsensusError> {
        self.read(|_, _| ()).await?;
        let shared = self.shared.clone();
        let encode = move || -> io::Result<Backup> {
            let applied = shared.read();
            let meta = SnapshotMeta {
                last_log_id: applied.last_applied,
                last_membership: applied.membership.clone(),
            };
            let table = encode_table(&applied.table)?;
            drop(applied);
            let mut bytes = file_head(&meta)?;
            bytes.extend_from_slice(&table);
            let id = meta.last_log_id.as_ref();
            Ok(Backup {
                bytes,
                index: id.map_or(0, |l| l.index),
                term: id.map_or(0, |l| l.leader_id.term),
            })
        };
        tokio::task::spawn_blocking(encode)
            .await
            .map_err(|e| ConsensusError::Unknown(format!("the backup did not finish: {e}")))?
            .map_err(|e| ConsensusError::Unknown(format!("the backup failed: {e}")))
    }
}

/// What a backup holds, as `leasehold snapshot status` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BackupStatus {
    /// Its snapshot file format.
    pub format: u32,
    /// Its size in bytes.
    pub bytes: u64,
    /// The last log index it holds, and that entry's term.
    pub index: u64,
    /// See `index`.
    pub term: u64,
    /// The voters of the cluster it was taken from.
    pub voters: Vec<NodeId>,
    /// Live leases in it.
    pub leases: usize,
    /// Keys held in it.
    pub held: usize,
    /// Waits queued in it.
    pub waiting: usize,
    /// The token the cluster it came from would have granted next.
    pub next_fence: u64,
    /// The lease id it would have handed out next.
    pub next_lease: u64,
}

/// Reads a backup, checking its version and checksums and decoding its
/// table.
pub fn backup_status(path: &Path) -> anyhow::Result<BackupStatus> {
    let bytes = std::fs::metadata(path)
        .with_context(|| format!("read {}", path.display()))?
        .len();
    let file = FileSnapshots::at(path.to_path_buf());
    let format = file.file_format()?.unwrap_or(0);
    let (meta, table) = file
        .load()?
        .with_context(|| format!("{} does not exist", path.display()))?;
    let id = meta.last_log_id.as_ref();
    Ok(BackupStatus {
        format,
        bytes,
        index: id.map_or(0, |l| l.index),
        term: id.map_or(0, |l| l.leader_id.term),
        voters: meta.last_membership.membership().voter_ids().collect(),
        leases: table.lease_count(),
        held: table.held_count(),
        waiting: table.waiter_count(),
        next_fence: table.next_fence(),
        next_lease: table.next_lease(),
    })
}

/// What a restore did.
#[derive(Debug)]
pub struct Restored {
    /// The backup's last log index.
    pub index: u64,
    /// The first token the new cluster grants.
    pub next_fence: u64,
    /// The first lease id it grants.
    pub next_lease: u64,
    /// The new cluster's id.
    pub cluster: u64,
}

/// Builds in `dir` (absent or empty) the data dir of member `id` of a new
/// cluster of `members` from the backup at `backup`, with the token and
/// lease id sequences at least `fence_floor`.
pub async fn restore(
    backup: &Path,
    dir: &Path,
    id: NodeId,
    members: &BTreeMap<NodeId, String>,
    fence_floor: u64,
) -> anyhow::Result<Restored> {
    check_member(id, members)?;
    // Read first: a backup that cannot be restored creates nothing.
    let (meta, table) = FileSnapshots::at(backup.to_path_buf())
        .load()
        .with_context(|| format!("read the backup {}", backup.display()))?
        .with_context(|| format!("no backup at {}", backup.display()))?;
    let last = meta
        .last_log_id
        .context("the backup holds no log entry: there is nothing to restore")?;
    let _lock = lock_empty(dir)?;
    build_member(dir, id, members, last, table, fence_floor, None).await
}

/// Builds in `into` (absent or empty) the data dir of a one-node cluster,
/// node `id` at `addr`, from everything the data dir `survivor` holds: its
/// snapshot and every entry of its log after it, committed or not (a
/// survivor of a cluster that lost its quorum for good). Tokens move up as
/// in a restore. `survivor` is only read: a torn tail at the end of its log
/// is left out of the new data dir, not cut from the survivor's.
pub async fn force_new_cluster(
    survivor: &Path,
    into: &Path,
    id: NodeId,
    addr: &str,
    fence_floor: u64,
) -> anyhow::Result<Restored> {
    let members = BTreeMap::from([(id, addr.to_string())]);
    // The survivor must be stopped: a node writing it would be read torn.
    check_member(id, &members)?;
    let _reading = DirLock::shared(survivor)?;
    anyhow::ensure!(
        format::read_dir_format(survivor)?.is_some(),
        "{} holds no data dir",
        survivor.display()
    );
    let _lock = lock_empty(into)?;
    let (meta, mut table) = match FileSnapshots::in_dir(survivor).load()? {
        Some((meta, table)) => (meta, table),
        None => (SnapshotMeta::default(), leasehold_core::LockTable::new()),
    };
    // Read, not opened: an open may cut a torn tail or delete purged
    // segments, and the survivor's dir stays as it was.
    let from = meta.last_log_id.as_ref().map_or(0, |l| l.index + 1);
    let entries = read_log(survivor)
        .with_context(|| format!("read the log in {}", survivor.display()))?
        .split_off(&from)
        .into_values();
    let mut last = meta.last_log_id;
    let mut events = Vec::new();
    for entry in entries {
        last = Some(entry.log_id);
        if let openraft::EntryPayload::Normal(request) = entry.payload {
            for command in request.commands {
                // Refused commands change nothing, as when they were applied.
                let _ = table.apply(request.stamp, command, &mut events);
            }
            events.clear();
        }
    }
    let last =
        last.context("the survivor's data dir holds no log entry: there is nothing to keep")?;
    build_member(
        into,
        id,
        &members,
        last,
        table,
        fence_floor,
        Some(rand::random()),
    )
    .await
}

/// Fails unless node `id` is one of `members`.
fn check_member(id: NodeId, members: &BTreeMap<NodeId, String>) -> anyhow::Result<()> {
    anyhow::ensure!(
        members.contains_key(&id),
        "node {id} is not among the members {:?}: give --node-id one of --peers",
        members.keys().collect::<Vec<_>>()
    );
    Ok(())
}

/// Locks `dir` (absent or empty) to build a new data dir in it; refuses,
/// leaving it as it was, one that holds anything.
fn lock_empty(dir: &Path) -> anyhow::Result<DirLock> {
    let lock = DirLock::exclusive(dir)?;
    let others = std::fs::read_dir(dir)
        .with_context(|| format!("read {}", dir.display()))?
        .filter(|e| e.as_ref().map_or(true, |e| e.file_name() != LOCK_FILE))
        .count();
    if others > 0 {
        lock.undo();
        anyhow::bail!(
            "{} is not empty: this builds a new data dir; move that one aside or name another",
            dir.display()
        );
    }
    Ok(lock)
}

/// Writes the data dir of member `id` of a new cluster of `members` whose
/// state is `table` as of the log entry `last`.
async fn build_member(
    dir: &Path,
    id: NodeId,
    members: &BTreeMap<NodeId, String>,
    last: crate::raft::LogId,
    mut table: leasehold_core::LockTable,
    fence_floor: u64,
    cluster: Option<u64>,
) -> anyhow::Result<Restored> {
    let (next_fence, next_lease) = table
        .prepare_for_new_cluster(fence_floor)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // Every member restored from one backup, with the same floor and
    // members, gets the same id, and the old cluster's (random) is another.
    let cluster = cluster.unwrap_or_else(|| {
        fnv1a(format!("{last:?} {next_fence} {next_lease} {members:?}").as_bytes())
    });
    let voters: BTreeSet<NodeId> = members.keys().copied().collect();
    let nodes: BTreeMap<NodeId, Node> = members
        .iter()
        .map(|(&id, addr)| (id, Node { addr: addr.clone() }))
        .collect();
    let membership = Membership::new(vec![voters], nodes).context("the new membership")?;
    let meta = SnapshotMeta {
        last_log_id: Some(last),
        last_membership: StoredMembership::new(Some(last), membership),
    };
    format::open_data_dir(dir)?;
    FileSnapshots::in_dir(dir).save(&meta, &encode_table(&table)?)?;
    // As a node that took that snapshot: its log purged up to it, and a
    // term at least the last entry's, so the new cluster's terms go on
    // above the entries it holds.
    let mut log = LogStore::open(dir)?;
    log.save_vote(&Vote::new(last.leader_id.term, id)).await?;
    log.purge(last).await?;
    // Last: an id with no data beside it binds nothing (see `cluster_id`).
    crate::raft::storage::cluster_id::write_into(dir, cluster)
        .with_context(|| format!("write the cluster id into {}", dir.display()))?;
    Ok(Restored {
        index: last.index,
        next_fence,
        next_lease,
        cluster,
    })
}

/// FNV-1a, 64 bits: a hash that every build computes alike.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
