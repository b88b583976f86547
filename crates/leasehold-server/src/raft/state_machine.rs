//! The lock table as openraft's state machine, with snapshots on disk.

use std::fs;
use std::io::{self, Cursor};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use leasehold_core::{LockTable, Outcome};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};

use super::log_store::write_atomically;
use super::{Node, NodeId, TypeConfig};
use crate::hub::Hub;

/// The applied state: what a snapshot holds.
#[derive(Default, Serialize, Deserialize)]
pub(crate) struct Applied {
    pub table: LockTable,
    pub last_applied: Option<LogId<NodeId>>,
    pub membership: StoredMembership<NodeId, Node>,
}

/// Shared by the state machine, snapshot builders and the API's reads.
pub(crate) struct Shared {
    applied: Mutex<Applied>,
    pub hub: Arc<Hub>,
    snapshot_path: PathBuf,
}

impl Shared {
    /// Locks the applied state. Never held across an `.await`.
    pub fn lock(&self) -> MutexGuard<'_, Applied> {
        self.applied.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    meta: SnapshotMeta<NodeId, Node>,
    data: Vec<u8>,
}

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
    /// Opens the state machine, restoring the last snapshot under `dir` if any.
    pub fn open(dir: &Path, hub: Arc<Hub>) -> io::Result<StateMachine> {
        let snapshot_path = dir.join("snapshot");
        let applied = match fs::read(&snapshot_path) {
            Ok(bytes) => {
                let file: SnapshotFile = bincode::deserialize(&bytes).map_err(io_err)?;
                let table: LockTable = bincode::deserialize(&file.data).map_err(io_err)?;
                Applied {
                    table,
                    last_applied: file.meta.last_log_id,
                    membership: file.meta.last_membership,
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Applied::default(),
            Err(e) => return Err(e),
        };
        Ok(StateMachine {
            shared: Arc::new(Shared {
                applied: Mutex::new(applied),
                hub,
                snapshot_path,
            }),
        })
    }

    fn read_snapshot(&self) -> io::Result<Option<SnapshotFile>> {
        match fs::read(&self.shared.snapshot_path) {
            Ok(bytes) => Ok(Some(bincode::deserialize(&bytes).map_err(io_err)?)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Builds a snapshot from a copy of the table taken when the builder was made,
/// so the apply path is held up only for the copy, not the serialization.
pub struct Builder {
    copy: Option<Applied>,
    path: PathBuf,
}

impl RaftSnapshotBuilder<TypeConfig> for Builder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let applied = self.copy.take().unwrap_or_default();
        let path = self.path.clone();
        let result = tokio::task::spawn_blocking(
            move || -> io::Result<(SnapshotMeta<NodeId, Node>, Vec<u8>)> {
                let data = bincode::serialize(&applied.table).map_err(io_err)?;
                let meta = SnapshotMeta {
                    last_log_id: applied.last_applied,
                    last_membership: applied.membership.clone(),
                    snapshot_id: format!("{}", applied.last_applied.map_or(0, |l| l.index)),
                };
                let file = SnapshotFile { meta, data };
                write_atomically(&path, &bincode::serialize(&file).map_err(io_err)?)?;
                Ok((file.meta, file.data))
            },
        )
        .await
        .map_err(io_err)
        .and_then(|r| r)
        .map_err(|e| StorageIOError::write_snapshot(None, any(e)))?;
        let (meta, data) = result;
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
            for entry in entries {
                applied.last_applied = Some(entry.log_id);
                let answers = match entry.payload {
                    EntryPayload::Blank => Vec::new(),
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
                outcomes.push(answers);
            }
        }
        self.shared.hub.publish(&events);
        self.shared.hub.applied.notify_one();
        Ok(outcomes)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        let applied = self.shared.lock();
        Builder {
            copy: Some(Applied {
                table: applied.table.clone(),
                last_applied: applied.last_applied,
                membership: applied.membership.clone(),
            }),
            path: self.shared.snapshot_path.clone(),
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
        let file = SnapshotFile {
            meta: meta.clone(),
            data,
        };
        let bytes = bincode::serialize(&file)
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), any(io_err(e))))?;
        write_atomically(&self.shared.snapshot_path, &bytes)
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), any(e)))?;
        let mut applied = self.shared.lock();
        applied.table = table;
        applied.last_applied = meta.last_log_id;
        applied.membership = meta.last_membership.clone();
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let file = self
            .read_snapshot()
            .map_err(|e| StorageIOError::read_snapshot(None, any(e)))?;
        Ok(file.map(|f| Snapshot {
            meta: f.meta,
            snapshot: Box::new(Cursor::new(f.data)),
        }))
    }
}
