//! A node's Raft log on a simulated disk that loses what was not synced.
//!
//! [`Disk`] outlives the node's process: the world keeps it across a crash
//! and calls [`Disk::crash`], which drops every entry written after the last
//! completed sync, as a power loss drops what sat in the page cache. The
//! vote is written synchronously (durable when `save_vote` returns), as the
//! real log store does.
//!
//! [`SimLog`] is the node's handle on it. An append is acknowledged to
//! openraft only when a sync that covers it completes, a seeded delay later.
//! With [`Bug::AckBeforeFsync`](crate::Bug::AckBeforeFsync) planted it is
//! acknowledged at once and never synced on the write path: the data reaches
//! the disk only at the next periodic writeback (as the kernel's page cache
//! does), and a power loss can lose entries a majority counted as written.

use parking_lot::{Mutex, MutexGuard};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::Arc;
use std::time::Duration;

use leasehold_server::raft::{NodeId, TypeConfig};
use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, StorageError, Vote};
use tokio::sync::mpsc;

/// How often written data reaches the disk without a sync.
const WRITEBACK: Duration = Duration::from_millis(500);

/// What survives a node's crash.
#[derive(Default)]
pub struct Disk {
    state: Mutex<DiskState>,
}

#[derive(Default)]
struct DiskState {
    vote: Option<Vote<NodeId>>,
    entries: BTreeMap<u64, Entry<TypeConfig>>,
    /// Entries at or below this index are synced.
    synced_upto: u64,
    last_purged: Option<LogId<NodeId>>,
    /// Entries a crash has dropped, in all.
    lost: u64,
}

impl Disk {
    fn lock(&self) -> MutexGuard<'_, DiskState> {
        self.state.lock()
    }

    /// The process died: everything written after the last completed sync
    /// is gone. Returns how many entries were dropped.
    pub fn crash(&self) -> u64 {
        let mut state = self.lock();
        let keep = state.synced_upto + 1;
        let dropped = state.entries.split_off(&keep).len() as u64;
        state.lost += dropped;
        dropped
    }

    /// Entries dropped by crashes so far.
    pub fn lost(&self) -> u64 {
        self.lock().lost
    }
}

/// A node's log over its [`Disk`].
#[derive(Clone)]
pub struct SimLog {
    disk: Arc<Disk>,
    syncs: mpsc::UnboundedSender<Option<LogFlushed<TypeConfig>>>,
    ack_before_sync: bool,
}

impl SimLog {
    /// Opens the log on `disk`; each sync takes `sync_time`. Must be called
    /// inside the node's runtime: the syncing task runs there, and dies
    /// with it.
    pub fn open(disk: Arc<Disk>, sync_time: Duration, ack_before_sync: bool) -> SimLog {
        let (syncs, mut queue) = mpsc::unbounded_channel::<Option<LogFlushed<TypeConfig>>>();
        let synced = disk.clone();
        if ack_before_sync {
            let writeback = disk.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(WRITEBACK).await;
                    let mut state = writeback.lock();
                    state.synced_upto = state.entries.keys().next_back().copied().unwrap_or(0);
                }
            });
        }
        tokio::spawn(async move {
            while let Some(first) = queue.recv().await {
                tokio::time::sleep(sync_time).await;
                let mut done = vec![first];
                while let Ok(more) = queue.try_recv() {
                    done.push(more);
                }
                // A sync covers everything written before it began: take
                // the last entry now, as the sync completes, for simplicity.
                {
                    let mut state = synced.lock();
                    state.synced_upto = state.entries.keys().next_back().copied().unwrap_or(0);
                }
                for callback in done.into_iter().flatten() {
                    callback.log_io_completed(Ok(()));
                }
            }
        });
        SimLog {
            disk,
            syncs,
            ack_before_sync,
        }
    }
}

impl RaftLogReader<TypeConfig> for SimLog {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        Ok(self
            .disk
            .lock()
            .entries
            .range(range)
            .map(|(_, e)| e.clone())
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for SimLog {
    type LogReader = SimLog;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let state = self.disk.lock();
        let last = state.entries.last_key_value().map(|(_, e)| e.log_id);
        Ok(LogState {
            last_purged_log_id: state.last_purged,
            last_log_id: last.or(state.last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.disk.lock().vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        Ok(self.disk.lock().vote)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        {
            let mut state = self.disk.lock();
            for entry in entries {
                state.entries.insert(entry.log_id.index, entry);
            }
        }
        // The syncing task is gone only when the node's runtime is: nothing
        // would wait for this answer then.
        if self.ack_before_sync {
            callback.log_io_completed(Ok(()));
        } else {
            let _ = self.syncs.send(Some(callback));
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut state = self.disk.lock();
        state.entries.split_off(&log_id.index);
        state.synced_upto = state.synced_upto.min(log_id.index.saturating_sub(1));
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut state = self.disk.lock();
        state.entries = state.entries.split_off(&(log_id.index + 1));
        state.last_purged = Some(log_id);
        Ok(())
    }
}
