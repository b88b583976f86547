//! The lock table as openraft's state machine; its snapshots go to a
//! [`SnapshotStore`].

pub(in crate::raft) mod marks;

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use futures::{Stream, TryStreamExt};
use leasehold_core::{Command, Event, LockTable, Outcome, Time};
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use super::storage::format;
use super::storage::snapshot_store::{Meta, SnapshotStore};
use super::{Entry, LogId, Snapshot, SnapshotData, SnapshotMeta, StoredMembership, TypeConfig};
use crate::context::NodeContext;
use crate::hub::Hub;
use marks::TableMarks;

/// The applied state: what a snapshot holds.
#[derive(Default, Serialize, Deserialize)]
pub(crate) struct Applied {
    pub table: LockTable,
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
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
    applied: RwLock<Applied>,
    /// Signalled each time the state machine lets go of `applied`, for
    /// readers on the runtime that found it taken (see [`Shared::read_async`]).
    unlocked: Notify,
    /// What applied entries tell queued acquirers and watchers.
    pub hub: Arc<Hub>,
    /// The node's metrics and auth cache, told of every applied entry.
    pub context: Arc<NodeContext>,
    snapshots: Arc<dyn SnapshotStore>,
    /// Commands applied since the last snapshot. Snapshots are triggered by
    /// commands, not log entries: one entry carries a whole batch, and the log
    /// kept in memory grows with the commands in it.
    since_snapshot: AtomicU64,
    /// The encoded size of the entries applied since the last snapshot...
    bytes_since_snapshot: AtomicU64,
    /// ... and that snapshot's size (0 until this process took one).
    last_snapshot_bytes: AtomicU64,
    snapshot_every: u64,
    snapshot_requested: AtomicBool,
    /// Signalled when a snapshot is due (see [`Shared::snapshot_is_due`]).
    pub snapshot_due: Notify,
    /// The last applied index, for the log store (applied entries leave its memory).
    applied_index: Arc<AtomicU64>,
    tap: OnceLock<ApplyTap>,
    /// The table's hash at set indexes, for the leader's comparison.
    pub marks: Arc<TableMarks>,
}

impl Shared {
    /// Reads the applied state, waiting while the state machine changes it:
    /// for a blocking thread, or the state machine's own task. A task on
    /// the runtime uses [`Shared::read_async`]. Never held across an `.await`.
    pub fn read(&self) -> RwLockReadGuard<'_, Applied> {
        self.applied.read()
    }

    /// Reads the applied state from a task on the runtime. While an entry
    /// is applied off the runtime (see [`HEAVY_KEYS`]) the state is taken
    /// for as long as that takes; this waits for it without holding the
    /// thread, which also sends the node's heartbeats.
    pub async fn read_async<T>(&self, f: impl FnOnce(&Applied) -> T) -> T {
        loop {
            // Registered before the look, so a release in between is seen.
            let unlocked = self.unlocked.notified();
            tokio::pin!(unlocked);
            unlocked.as_mut().enable();
            if let Some(applied) = self.applied.try_read() {
                return f(&applied);
            }
            unlocked.await;
        }
    }

    /// Changes the applied state: only the state machine does, as it applies
    /// entries or installs a snapshot. Readers waiting on the runtime are
    /// woken when the returned guard goes. Never held across an `.await`.
    fn write(&self) -> Writing<'_> {
        Writing {
            guard: self.applied.write(),
            _wake: WakeOnDrop(&self.unlocked),
        }
    }

    /// A snapshot is due once `snapshot_every` commands were applied since
    /// the last one and, if that one was big, the entries that carried them
    /// are at least as large as it. Writing a snapshot costs its whole size,
    /// so a big table is snapshotted less often and the writes stay within
    /// twice what the log takes, as Redis rewrites its append-only file once
    /// it has doubled. A million held locks (an 83 MB snapshot) under `cycle`
    /// load were otherwise written every 10 s, by every node at once. A small
    /// snapshot is cheap whatever the rate and keeps the plain cadence.
    fn snapshot_is_due(&self, since: u64, bytes_since: u64) -> bool {
        let last = self.last_snapshot_bytes.load(Ordering::Relaxed);
        since >= self.snapshot_every && (last < SMALL_SNAPSHOT || bytes_since >= last)
    }

    /// Commands applied since the last snapshot.
    pub fn commands_since_snapshot(&self) -> u64 {
        self.since_snapshot.load(Ordering::Relaxed)
    }

    /// The index of the last applied log entry, without waiting for the
    /// applied state.
    pub fn last_applied_index(&self) -> u64 {
        self.applied_index.load(Ordering::Relaxed)
    }

    /// About how many keys applying `entries` touches (see
    /// [`LockTable::work`]).
    fn work(&self, entries: &[Entry]) -> usize {
        let applied = self.read();
        entries
            .iter()
            .map(|e| match &e.payload {
                EntryPayload::Normal(request) => {
                    applied.table.work(request.stamp, &request.commands)
                }
                _ => 0,
            })
            .sum()
    }

    /// Applies `entries` in order and publishes what happened; their
    /// answers, and the encoded size of their commands.
    fn apply_entries(&self, entries: Vec<Entry>) -> (Vec<Vec<Outcome>>, u64) {
        let mut outcomes = Vec::new();
        let mut events = Vec::new();
        // Each entry's index and where its events end: their positions.
        let mut ends = Vec::with_capacity(entries.len());
        let mut bytes = 0;
        {
            let mut applied = self.write();
            let tap = self.tap.get();
            for entry in entries {
                applied.last_applied = Some(entry.log_id);
                if let EntryPayload::Normal(request) = &entry.payload {
                    bytes += bincode::serialized_size(request).unwrap_or(0);
                }
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
                ends.push((entry.log_id.index, events.len()));
                outcomes.push(answers);
            }
            if let Some(last) = &applied.last_applied {
                self.applied_index.store(last.index, Ordering::Relaxed);
            }
        }
        self.context.applied(&events);
        self.hub.publish(&events, &ends);
        (outcomes, bytes)
    }

    /// Whether snapshot work goes to a blocking thread (see
    /// [`off_the_runtime`]).
    fn blocks(&self) -> bool {
        self.snapshots.save_blocks()
    }
}

/// A snapshot smaller than this is written in milliseconds (see
/// [`Shared::snapshot_is_due`]).
const SMALL_SNAPSHOT: u64 = 8 << 20;

/// The applied state, taken to be changed; wakes the readers waiting on the
/// runtime once it is let go. Fields drop in order: the lock goes first, so
/// a woken reader finds it free.
struct Writing<'a> {
    guard: RwLockWriteGuard<'a, Applied>,
    _wake: WakeOnDrop<'a>,
}

/// Wakes the readers waiting on `unlocked` when dropped.
struct WakeOnDrop<'a>(&'a Notify);

impl Drop for WakeOnDrop<'_> {
    fn drop(&mut self) {
        self.0.notify_waiters();
    }
}

impl std::ops::Deref for Writing<'_> {
    type Target = Applied;
    fn deref(&self) -> &Applied {
        &self.guard
    }
}

impl std::ops::DerefMut for Writing<'_> {
    fn deref_mut(&mut self) -> &mut Applied {
        &mut self.guard
    }
}

/// An entry whose commands touch more keys than this (by
/// [`LockTable::work`]) is applied on a blocking thread, off the runtime
/// thread that also sends and answers heartbeats. A node ends a lease in
/// under a microsecond a key here (300,000 keys in 0.22 s), so what stays
/// inline holds the thread for a few milliseconds at most, against a 50 ms
/// heartbeat; a lease of a million locks, left to expire, took the thread
/// for about a second and cost the group an election. Smaller entries stay
/// inline and skip the hand-over to another thread (tens of microseconds on
/// 2 cores), which every ordinary batch would pay.
const HEAVY_KEYS: usize = 5_000;

/// Runs `work` on a blocking thread when snapshots go to a real disk, and
/// inline otherwise (a simulation's runtime must never wait on another
/// thread).
///
/// A node runs its API and Raft on one runtime thread. Serializing,
/// decoding, storing or dropping the table of a million held locks takes
/// hundreds of milliseconds there, longer than an election timeout: done on
/// that thread, it kept the node from sending or answering heartbeats, and
/// every snapshot under load cost the group its leader (3 elections in 30 s
/// of `cycle` x50 with 1M locks held, the longest call 1.4 s).
async fn off_the_runtime<T: Send + 'static>(
    blocks: bool,
    work: impl FnOnce() -> T + Send + 'static,
) -> io::Result<T> {
    if blocks {
        tokio::task::spawn_blocking(work).await.map_err(io_err)
    } else {
        Ok(work())
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

impl StateMachine {
    /// Opens the state machine, restoring the last snapshot in `snapshots`
    /// if there is one.
    pub fn open(
        snapshots: Arc<dyn SnapshotStore>,
        context: Arc<NodeContext>,
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
        let through = applied.last_applied.as_ref().map_or(0, |l| l.index);
        applied_index.store(through, Ordering::Relaxed);
        Ok(StateMachine {
            shared: Arc::new(Shared {
                applied: RwLock::new(applied),
                unlocked: Notify::new(),
                hub: Arc::new(Hub::after(through)),
                context,
                snapshots,
                since_snapshot: AtomicU64::new(0),
                bytes_since_snapshot: AtomicU64::new(0),
                last_snapshot_bytes: AtomicU64::new(0),
                snapshot_every: snapshot_every.max(1),
                snapshot_requested: AtomicBool::new(false),
                snapshot_due: Notify::new(),
                applied_index,
                tap: OnceLock::new(),
                marks: Arc::default(),
            }),
        })
    }

    /// Applies `entries` in order: the answers to their commands, an entry's
    /// list empty for one without commands. After an entry whose index is
    /// due a hash check (`hash_check`), the table is hashed as it stands
    /// then: under the read lock, so reads go on meanwhile, and off the
    /// runtime thread where snapshots are, since it costs about what
    /// encoding a snapshot does. Nothing applies until it is done.
    async fn apply_all(&mut self, mut entries: Vec<Entry>) -> io::Result<Vec<Vec<Outcome>>> {
        let mut outcomes = Vec::with_capacity(entries.len());
        loop {
            let marks = &self.shared.marks;
            let due = entries.iter().position(|e| marks.due(e.log_id.index));
            let rest = match due {
                Some(at) => entries.split_off(at + 1),
                None => Vec::new(),
            };
            let marked = due.and_then(|_| entries.last()).map(|e| e.log_id.index);
            outcomes.extend(self.apply_batch(entries).await?);
            if let Some(index) = marked {
                let shared = self.shared.clone();
                off_the_runtime(self.shared.blocks(), move || {
                    let applied = shared.read();
                    shared.marks.record(index, &applied.table);
                })
                .await?;
            }
            if rest.is_empty() {
                return Ok(outcomes);
            }
            entries = rest;
        }
    }

    /// [`Self::apply_all`] for entries none of which but the last is due a
    /// hash check.
    async fn apply_batch(&mut self, entries: Vec<Entry>) -> io::Result<Vec<Vec<Outcome>>> {
        let work = if self.shared.blocks() {
            self.shared.work(&entries)
        } else {
            0
        };
        let (outcomes, bytes) = if work > HEAVY_KEYS {
            let started = Instant::now();
            let shared = self.shared.clone();
            let applied = off_the_runtime(true, move || shared.apply_entries(entries)).await?;
            tracing::info!(
                keys = work,
                took = ?started.elapsed(),
                "applied a large entry off the runtime thread"
            );
            applied
        } else {
            self.shared.apply_entries(entries)
        };
        self.shared.hub.applied.notify_one();
        let applied: usize = outcomes.iter().map(Vec::len).sum();
        let since = self
            .shared
            .since_snapshot
            .fetch_add(applied as u64, Ordering::Relaxed)
            + applied as u64;
        let bytes_since = self
            .shared
            .bytes_since_snapshot
            .fetch_add(bytes, Ordering::Relaxed)
            + bytes;
        if self.shared.snapshot_is_due(since, bytes_since)
            && !self.shared.snapshot_requested.swap(true, Ordering::Relaxed)
        {
            self.shared.snapshot_due.notify_one();
        }
        Ok(outcomes)
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
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> io::Result<Snapshot> {
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
        let (meta, data) = off_the_runtime(self.snapshots.save_blocks(), save).await??;
        Ok(Snapshot {
            meta,
            snapshot: data,
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = Builder;

    async fn applied_state(&mut self) -> io::Result<(Option<LogId>, StoredMembership)> {
        let applied = self.shared.read();
        Ok((applied.last_applied, applied.membership.clone()))
    }

    async fn apply<S>(&mut self, entries: S) -> io::Result<()>
    where
        S: Stream<Item = io::Result<EntryResponder<TypeConfig>>> + Unpin + OptionalSend,
    {
        let (entries, responders): (Vec<Entry>, Vec<_>) =
            entries.try_collect::<Vec<_>>().await?.into_iter().unzip();
        let outcomes = self.apply_all(entries).await?;
        // Every entry proposed here waits for its answer, membership
        // changes (no outcomes) included.
        for (responder, answer) in responders.into_iter().zip(outcomes) {
            if let Some(responder) = responder {
                responder.send(answer);
            }
        }
        Ok(())
    }

    /// Serializes the table as it stands. Nothing is applied meanwhile: the
    /// state machine is this very call's caller. Reads of the table go on,
    /// and so does the rest of the node (off the runtime thread).
    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.shared.since_snapshot.store(0, Ordering::Relaxed);
        self.shared.bytes_since_snapshot.store(0, Ordering::Relaxed);
        self.shared
            .snapshot_requested
            .store(false, Ordering::Relaxed);
        let shared = self.shared.clone();
        let serialize = move || {
            let started = Instant::now();
            let applied = shared.read();
            let data = format::encode_table(&applied.table)?;
            shared
                .last_snapshot_bytes
                .store(data.len() as u64, Ordering::Relaxed);
            let meta = SnapshotMeta {
                last_log_id: applied.last_applied,
                last_membership: applied.membership.clone(),
            };
            tracing::debug!(
                index = applied.last_applied.as_ref().map_or(0, |l| l.index),
                bytes = data.len(),
                took = ?started.elapsed(),
                "snapshot serialized"
            );
            Ok((meta, data))
        };
        let parts = off_the_runtime(self.shared.blocks(), serialize)
            .await
            .and_then(|r| r);
        Builder {
            parts: Some(parts),
            snapshots: self.shared.snapshots.clone(),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        data: SnapshotData,
    ) -> io::Result<()> {
        // It stands for a snapshot this node took: the next is due as if so.
        self.shared.since_snapshot.store(0, Ordering::Relaxed);
        self.shared.bytes_since_snapshot.store(0, Ordering::Relaxed);
        self.shared
            .last_snapshot_bytes
            .store(data.len() as u64, Ordering::Relaxed);
        let snapshots = self.shared.snapshots.clone();
        let stored = meta.clone();
        // Decoded and stored off the runtime thread (see `off_the_runtime`).
        let decode_and_store = move || -> io::Result<LockTable> {
            let table = format::decode_table(&data)
                .map_err(|e| io_err(format!("the snapshot sent is refused: {e}")))?;
            snapshots.save(&stored, &data)?;
            Ok(table)
        };
        let table = off_the_runtime(self.shared.blocks(), decode_and_store).await??;
        let replaced = {
            let mut applied = self.shared.write();
            let replaced = std::mem::replace(&mut applied.table, table);
            applied.last_applied = meta.last_log_id;
            applied.membership = meta.last_membership.clone();
            self.shared.applied_index.store(
                meta.last_log_id.as_ref().map_or(0, |l| l.index),
                Ordering::Relaxed,
            );
            replaced
        };
        self.shared
            .hub
            .restart_after(meta.last_log_id.as_ref().map_or(0, |l| l.index));
        // Freeing a big table takes as long as building it.
        let _ = off_the_runtime(self.shared.blocks(), move || drop(replaced)).await;
        // Auth may differ in the installed table.
        self.shared.context.auth.changed();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> io::Result<Option<Snapshot>> {
        let snapshots = self.shared.snapshots.clone();
        let file = off_the_runtime(self.shared.blocks(), move || snapshots.read()).await??;
        Ok(file.map(|(meta, snapshot)| Snapshot { meta, snapshot }))
    }
}

#[cfg(test)]
mod tests;
