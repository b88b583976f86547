//! The lock table as openraft's state machine; its snapshots go to a
//! [`SnapshotStore`].

use std::io::{self, Cursor};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use leasehold_core::{Command, Event, LockTable, Outcome, Time};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use super::snapshot_store::{Meta, SnapshotStore};
use super::{Node, NodeId, TypeConfig};
use crate::hub::Hub;

/// The applied state: what a snapshot holds.
#[derive(Default, Serialize, Deserialize)]
pub(crate) struct Applied {
    pub table: LockTable,
    pub last_applied: Option<LogId<NodeId>>,
    pub membership: StoredMembership<NodeId, Node>,
}

/// One command as the state machine applied it, for an [`ApplyTap`].
#[derive(Debug, Clone)]
pub struct AppliedCommand {
    /// The command.
    pub command: Command,
    /// What the table answered.
    pub outcome: Outcome,
    /// What happened in the table, in order.
    pub events: Vec<Event>,
    /// Table time after it.
    pub now: Time,
}

/// Sees every log entry this state machine applies, in order, as it applies
/// it (with the applied state locked: it must not call back into the node).
/// For observers that check the table's behaviour from outside, such as a
/// simulation's; entries without commands (blank, membership) come with
/// none.
pub type ApplyTap = Arc<dyn Fn(u64, &[AppliedCommand]) + Send + Sync>;

/// Shared by the state machine, snapshot builders and the API's reads.
pub(crate) struct Shared {
    applied: Mutex<Applied>,
    pub hub: Arc<Hub>,
    snapshots: Arc<dyn SnapshotStore>,
    /// Commands applied since the last snapshot. Snapshots are triggered by
    /// commands, not log entries: one entry carries a whole batch, and the log
    /// kept in memory grows with the commands in it.
    since_snapshot: AtomicU64,
    snapshot_every: u64,
    snapshot_requested: AtomicBool,
    /// Signalled when `snapshot_every` commands have been applied.
    pub snapshot_due: Notify,
    /// The last applied index, for the log store (applied entries leave its memory).
    applied_index: Arc<AtomicU64>,
    tap: OnceLock<ApplyTap>,
}

impl Shared {
    /// Locks the applied state. Never held across an `.await`.
    pub fn lock(&self) -> MutexGuard<'_, Applied> {
        self.applied.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A snapshot's meta and the table's bytes.
type SnapshotParts = (Meta, Vec<u8>);

#[derive(Clone)]
pub struct StateMachine {
    pub(crate) shared: Arc<Shared>,
}

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

fn any(e: io::Error) -> openraft::AnyError {
    openraft::AnyError::new(&e)
}

impl StateMachine {
    /// Opens the state machine, restoring the last snapshot in `snapshots`
    /// if there is one.
    pub fn open(
        snapshots: Arc<dyn SnapshotStore>,
        hub: Arc<Hub>,
        snapshot_every: u64,
        applied_index: Arc<AtomicU64>,
    ) -> io::Result<StateMachine> {
        let applied = match snapshots.load()? {
            Some((meta, table)) => Applied {
                table,
                last_applied: meta.last_log_id,
                membership: meta.last_membership,
            },
            None => Applied::default(),
        };
        applied_index.store(
            applied.last_applied.map_or(0, |l| l.index),
            Ordering::Relaxed,
        );
        Ok(StateMachine {
            shared: Arc::new(Shared {
                applied: Mutex::new(applied),
                hub,
                snapshots,
                since_snapshot: AtomicU64::new(0),
                snapshot_every: snapshot_every.max(1),
                snapshot_requested: AtomicBool::new(false),
                snapshot_due: Notify::new(),
                applied_index,
                tap: OnceLock::new(),
            }),
        })
    }

    /// Shows every entry applied from now on to `tap` (once; a second tap is
    /// ignored).
    pub fn tap(&self, tap: ApplyTap) {
        let _ = self.shared.tap.set(tap);
    }
}

/// Builds a snapshot from the table as it was when the builder was made.
///
/// The table is serialized while the apply path waits (a million locks take
/// tens of milliseconds), rather than cloned: a clone of a big table is as
/// slow to make and leaves the allocator with a heap of freed small blocks
/// after every snapshot (measured: ~60 bytes per held lock of resident memory
/// that never went back), where the serialized bytes are one buffer.
pub struct Builder {
    parts: Option<io::Result<SnapshotParts>>,
    snapshots: Arc<dyn SnapshotStore>,
}

impl RaftSnapshotBuilder<TypeConfig> for Builder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let parts = self
            .parts
            .take()
            .unwrap_or_else(|| Err(io_err("this snapshot was already built")));
        let snapshots = self.snapshots.clone();
        let save = move || -> io::Result<SnapshotParts> {
            let (meta, data) = parts?;
            snapshots.save(&meta, &data)?;
            Ok((meta, data))
        };
        let result = if self.snapshots.save_blocks() {
            tokio::task::spawn_blocking(save)
                .await
                .map_err(io_err)
                .and_then(|r| r)
        } else {
            save()
        };
        let (meta, data) = result.map_err(|e| StorageIOError::write_snapshot(None, any(e)))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Builder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, Node>), StorageError<NodeId>> {
        let applied = self.shared.lock();
        Ok((applied.last_applied, applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Vec<Outcome>>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut outcomes = Vec::new();
        let mut events = Vec::new();
        {
            let mut applied = self.shared.lock();
            let tap = self.shared.tap.get();
            for entry in entries {
                applied.last_applied = Some(entry.log_id);
                let mut seen = Vec::new();
                let answers = match entry.payload {
                    EntryPayload::Blank => Vec::new(),
                    EntryPayload::Normal(request) if tap.is_some() => {
                        let stamp = request.stamp;
                        let table = &mut applied.table;
                        request
                            .commands
                            .into_iter()
                            .map(|c| {
                                let (from, command) = (events.len(), c.clone());
                                let outcome = table.apply(stamp, c, &mut events);
                                seen.push(AppliedCommand {
                                    command,
                                    outcome: outcome.clone(),
                                    events: events[from..].to_vec(),
                                    now: table.now(),
                                });
                                outcome
                            })
                            .collect()
                    }
                    EntryPayload::Normal(request) => {
                        let stamp = request.stamp;
                        let table = &mut applied.table;
                        request
                            .commands
                            .into_iter()
                            .map(|c| table.apply(stamp, c, &mut events))
                            .collect()
                    }
                    EntryPayload::Membership(m) => {
                        applied.membership = StoredMembership::new(Some(entry.log_id), m);
                        Vec::new()
                    }
                };
                if let Some(tap) = tap {
                    tap(entry.log_id.index, &seen);
                }
                outcomes.push(answers);
            }
            if let Some(last) = applied.last_applied {
                self.shared
                    .applied_index
                    .store(last.index, Ordering::Relaxed);
            }
        }
        self.shared.hub.publish(&events);
        self.shared.hub.applied.notify_one();
        let applied: usize = outcomes.iter().map(Vec::len).sum();
        let since = self
            .shared
            .since_snapshot
            .fetch_add(applied as u64, Ordering::Relaxed)
            + applied as u64;
        if since >= self.shared.snapshot_every
            && !self.shared.snapshot_requested.swap(true, Ordering::Relaxed)
        {
            self.shared.snapshot_due.notify_one();
        }
        Ok(outcomes)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        let applied = self.shared.lock();
        self.shared.since_snapshot.store(0, Ordering::Relaxed);
        self.shared
            .snapshot_requested
            .store(false, Ordering::Relaxed);
        let parts = bincode::serialize(&applied.table)
            .map_err(io_err)
            .map(|data| {
                let meta = SnapshotMeta {
                    last_log_id: applied.last_applied,
                    last_membership: applied.membership.clone(),
                    snapshot_id: format!("{}", applied.last_applied.map_or(0, |l| l.index)),
                };
                (meta, data)
            });
        Builder {
            parts: Some(parts),
            snapshots: self.shared.snapshots.clone(),
        }
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, Node>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let data = snapshot.into_inner();
        let table: LockTable = bincode::deserialize(&data)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), any(io_err(e))))?;
        self.shared
            .snapshots
            .save(meta, &data)
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), any(e)))?;
        let mut applied = self.shared.lock();
        applied.table = table;
        applied.last_applied = meta.last_log_id;
        applied.membership = meta.last_membership.clone();
        self.shared
            .applied_index
            .store(meta.last_log_id.map_or(0, |l| l.index), Ordering::Relaxed);
        drop(applied);
        // Auth may differ in the installed table.
        self.shared.hub.auth.changed();
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let file = self
            .shared
            .snapshots
            .read()
            .map_err(|e| StorageIOError::read_snapshot(None, any(e)))?;
        Ok(file.map(|(meta, data)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}
