//! The Raft log on disk: append-only segments, written and flushed
//! (`fdatasync`) by a writer task of the log's own.
//!
//! `append` puts its entries in memory (readable at once, so the leader
//! sends them to followers while its own flush runs), hands their records
//! to the writer and returns; openraft hears of the flush through the
//! append's callback. The writer takes every write waiting when it starts a
//! flush, so one `fdatasync` covers all the appends that arrived during the
//! previous one (group commit), and the flush itself runs on a blocking
//! thread, not on the runtime threads that answer heartbeats and apply the
//! log. Every write (appends, truncations, purges and the vote) goes
//! through the writer in the order it was made: a vote is written only
//! once every record before it is flushed, and records after it are
//! written only once it is, as openraft requires (a term is durable before
//! any entry of that term). Commands are also grouped above openraft: one
//! entry carries every command that arrived while the previous one was
//! proposed (`raft::batch`).
//!
//! A segment is a sequence of records `[len: u32][crc32: u32][bincode payload]`.
//! Truncation and purging are themselves records, so nothing is ever rewritten
//! in place; whole segments below the purge point are deleted. On open, a torn
//! record at the tail of the last segment (a crash mid-write) is cut off: it was
//! never acknowledged, because acknowledgement waits for the fsync after it.
//! A damaged record that is not a torn tail stops the open, naming the
//! segment and the byte ([`records`] tells the two apart).
//!
//! Segments are allocated at full size when they are created, so an append
//! writes into space the file already has and its `fdatasync` need not commit
//! a new file size to the filesystem journal (measured here: ~0.13 ms instead
//! of ~0.2 ms per flush). The unwritten rest of a segment reads as zeros; a
//! zero record length marks where the records end.
//!
//! Each segment's span of records (its lowest and highest entry index, its
//! lowest truncation point, its highest purge) is kept in memory, so that a
//! read of entries no longer in memory (a lagging follower catching up, one
//! append's worth at a time) replays only the segments that can hold them or
//! change them, not the whole log.
//!
//! The files sit on a [`LogDisk`]: a real directory ([`FsDisk`]), or the
//! simulation's disk, which loses unsynced writes on a crash, so the seeds
//! run this format and its crash rules too.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::OptionalSend;
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::{mpsc, oneshot};

use crate::raft::storage::disk::{FsDisk, LogDisk, LogFile};
use crate::raft::{Entry, LogId, TypeConfig, Vote};
use records::{encode, replay_segment, segment_name, segment_numbers, Record, RecordRef, Tail};
use writer::{write_jobs, Done, Job, Records, Writer};

/// A new segment is started once the current one passes this size. Small
/// enough that a purge after a snapshot frees most of the log promptly.
const SEGMENT_BYTES: u64 = 8 * 1024 * 1024;

/// Applied entries always kept in memory below the newest applied one.
const APPLIED_KEPT_IN_MEMORY: u64 = 64;

/// Older applied entries stay in memory too while all the entries in memory
/// take less than this (encoded); past it, the oldest are read back from
/// the segments if ever asked for. A new leader finds where each follower's
/// log matches its own by probing its log by binary search, one round trip
/// a probe: a probe that had to replay a segment took 23 ms, and a planned
/// restart's pause was mostly such reads. (Between snapshots a busy server
/// appends ~100k commands, about 10 MiB.)
const MEMORY_BUDGET: usize = 16 << 20;

/// Writes waiting for the writer before `append` waits too: back-pressure
/// on openraft when the disk falls behind.
const QUEUED_WRITES: usize = 256;

/// What the log holds in memory: every entry not yet purged, except applied
/// ones below `memory_floor`, which are only on disk.
#[derive(Default)]
struct Entries {
    entries: BTreeMap<u64, Entry>,
    /// The encoded size of each entry in `entries`, and their sum.
    sizes: BTreeMap<u64, usize>,
    bytes: usize,
    last_purged: Option<LogId>,
    /// Entries below this index (and above `last_purged`) are on disk only.
    memory_floor: u64,
}

impl Entries {
    fn insert(&mut self, entry: Entry, size: usize) {
        let index = entry.log_id.index;
        if let Some(old) = self.sizes.insert(index, size) {
            self.bytes -= old;
        }
        self.bytes += size;
        self.entries.insert(index, entry);
    }

    /// Drops the entries at and after `from`.
    fn cut_from(&mut self, from: u64) {
        self.entries.split_off(&from);
        let gone = self.sizes.split_off(&from);
        self.bytes -= gone.values().sum::<usize>();
    }

    /// Drops the entries below `below`.
    fn drop_below(&mut self, below: u64) {
        self.entries = self.entries.split_off(&below);
        let kept = self.sizes.split_off(&below);
        let gone = std::mem::replace(&mut self.sizes, kept);
        self.bytes -= gone.values().sum::<usize>();
    }

    /// Lets the oldest entries below `keep_from` leave memory while the
    /// entries take more than `budget`.
    fn shed(&mut self, keep_from: u64, budget: usize) {
        while self.bytes > budget {
            let Some((&index, _)) = self.entries.first_key_value() else {
                return;
            };
            if index >= keep_from {
                return;
            }
            self.entries.remove(&index);
            self.bytes -= self.sizes.remove(&index).unwrap_or(0);
            self.memory_floor = self.memory_floor.max(index + 1);
        }
    }
}

/// The Raft log store, on a real directory ([`FsDisk`]) or any other
/// [`LogDisk`]. Cheap to clone; clones share one log.
pub struct LogStore<D: LogDisk = FsDisk> {
    entries: Arc<Mutex<Entries>>,
    /// Taken by the writer task for as long as it writes and syncs a group.
    writer: Arc<tokio::sync::Mutex<Writer<D>>>,
    /// The writer task's queue, started by the first write.
    queue: Arc<std::sync::OnceLock<mpsc::Sender<Job>>>,
    /// The highest entry index written to a segment file (0: none yet).
    written: Arc<AtomicU64>,
    disk: Arc<D>,
    /// What each segment holds, so a read from disk replays only some.
    spans: Spans,
    /// Segments replayed by reads from disk (tests check it stays small).
    #[cfg(test)]
    segments_read: Arc<AtomicU64>,
    /// The highest index the state machine has applied (0: none yet).
    applied: Arc<AtomicU64>,
    /// How much the entries in memory may take before applied ones leave.
    memory_budget: usize,
}

/// What a segment's records touch: the segment can matter to a read of
/// entries `[start, end]` only if it overlaps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    /// Lowest and highest entry index (`first > last`: no entries).
    first: u64,
    last: u64,
    /// Lowest truncation point (entries at and after it are gone).
    truncate_from: u64,
    /// Highest purge point (entries up to it are gone).
    purge_upto: Option<u64>,
}

impl Default for Span {
    fn default() -> Self {
        Span {
            first: u64::MAX,
            last: 0,
            truncate_from: u64::MAX,
            purge_upto: None,
        }
    }
}

impl Span {
    fn entry(&mut self, index: u64) {
        self.first = self.first.min(index);
        self.last = self.last.max(index);
    }

    fn truncate(&mut self, since: u64) {
        self.truncate_from = self.truncate_from.min(since);
    }

    fn purge(&mut self, upto: u64) {
        self.purge_upto = self.purge_upto.max(Some(upto));
    }

    fn record(&mut self, record: &Record) {
        match record {
            Record::Entry(e) => self.entry(e.log_id.index),
            Record::Truncate(since) => self.truncate(*since),
            Record::Purge(id) => self.purge(id.index),
        }
    }

    fn merge(&mut self, other: Span) {
        self.first = self.first.min(other.first);
        self.last = self.last.max(other.last);
        self.truncate_from = self.truncate_from.min(other.truncate_from);
        self.purge_upto = self.purge_upto.max(other.purge_upto);
    }

    /// Whether a read of entries `start..=end` must replay this segment.
    fn matters(&self, start: u64, end: u64) -> bool {
        (self.first <= end && self.last >= start)
            || self.truncate_from <= end
            || self.purge_upto.is_some_and(|p| p >= start)
    }
}

impl<D: LogDisk> Clone for LogStore<D> {
    fn clone(&self) -> Self {
        LogStore {
            entries: self.entries.clone(),
            writer: self.writer.clone(),
            queue: self.queue.clone(),
            written: self.written.clone(),
            disk: self.disk.clone(),
            spans: self.spans.clone(),
            #[cfg(test)]
            segments_read: self.segments_read.clone(),
            applied: self.applied.clone(),
            memory_budget: self.memory_budget,
        }
    }
}

/// Every segment's span, by segment number; shared by the writer (which
/// extends it) and readers.
type Spans = Arc<Mutex<BTreeMap<u64, Span>>>;

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// Applies one record to `entries`, keeping only entries whose index is
/// `wanted`. Returns the log id of a purge.
fn replay_into(
    entries: &mut BTreeMap<u64, Entry>,
    record: Record,
    wanted: impl Fn(u64) -> bool,
) -> Option<LogId> {
    match record {
        Record::Entry(entry) => {
            if wanted(entry.log_id.index) {
                entries.insert(entry.log_id.index, entry);
            }
            None
        }
        Record::Truncate(since) => {
            entries.split_off(&since);
            None
        }
        Record::Purge(log_id) => {
            *entries = entries.split_off(&(log_id.index + 1));
            Some(log_id)
        }
    }
}

impl LogStore<FsDisk> {
    /// Opens (or creates) the log under the data dir `dir`, replaying what
    /// is there.
    pub fn open(dir: &Path) -> io::Result<LogStore<FsDisk>> {
        LogStore::open_observed(dir, Histogram::new(std::iter::empty()))
    }

    /// [`LogStore::open`], recording the time of each fsync in `fsync`.
    pub fn open_observed(dir: &Path, fsync: Histogram) -> io::Result<LogStore<FsDisk>> {
        LogStore::open_with(FsDisk::open(dir)?, fsync)
    }
}

impl<D: LogDisk> LogStore<D> {
    /// Opens (or creates) the log on `disk`, replaying what is there.
    pub fn open_on(disk: D) -> io::Result<LogStore<D>> {
        LogStore::open_with(disk, Histogram::new(std::iter::empty()))
    }

    /// [`LogStore::open_on`], recording the time of each fsync in `fsync`.
    fn open_with(disk: D, fsync: Histogram) -> io::Result<LogStore<D>> {
        let disk = Arc::new(disk);
        let numbers = segment_numbers(&*disk)?;
        let mut state = Entries::default();
        // (segment number, highest entry index written to it, bytes of records)
        let mut segments: Vec<(u64, u64, u64)> = Vec::new();
        let mut spans = BTreeMap::new();
        for (i, &number) in numbers.iter().enumerate() {
            let name = segment_name(number);
            let is_last = i + 1 == numbers.len();
            let mut highest = 0;
            let mut span = Span::default();
            let replayed = replay_segment(&*disk, &name, is_last, Tail::Strict, |record| {
                span.record(&record);
                if let Record::Entry(entry) = &record {
                    highest = highest.max(entry.log_id.index);
                }
                if let Some(purged) = replay_into(&mut state.entries, record, |_| true) {
                    state.last_purged = Some(purged);
                }
            })?;
            if is_last && !replayed.zeros_after {
                // A torn write, or parts of an unacknowledged one: cut it
                // all, so nothing of it can be read as a record once new
                // records are written over the start of it.
                tracing::warn!(segment = %name, at = replayed.records_end, "cutting a torn record off the log tail");
                disk.open(&name, 0)?.cut(replayed.records_end)?;
            }
            segments.push((number, highest, replayed.records_end));
            spans.insert(number, span);
        }

        // Segments wholly covered by the purge point (a snapshot) are dead
        // weight for the next start: delete them now, never the last one.
        if let Some(purged) = state.last_purged {
            while segments.len() > 1 && segments[0].1 <= purged.index {
                let (number, _, _) = segments.remove(0);
                disk.remove(&segment_name(number))?;
                spans.remove(&number);
            }
        }

        let (number, file, size) = match segments.last() {
            Some(&(number, _, size)) => {
                let file = disk.open(&segment_name(number), SEGMENT_BYTES)?;
                (number, file, size)
            }
            None => {
                let file = disk.create(&segment_name(1), SEGMENT_BYTES)?;
                segments.push((1, 0, 0));
                spans.insert(1, Span::default());
                (1, file, 0)
            }
        };
        state.sizes = state
            .entries
            .iter()
            .map(|(&index, entry)| {
                // As `encode` frames it: the payload and its 8-byte header.
                let size = bincode::serialized_size(&RecordRef::Entry(entry)).unwrap_or(0) + 8;
                (index, usize::try_from(size).unwrap_or(0))
            })
            .collect();
        state.bytes = state.sizes.values().sum();
        let spans: Spans = Arc::new(Mutex::new(spans));
        let written = Arc::new(AtomicU64::new(
            state.entries.last_key_value().map_or(0, |(&i, _)| i),
        ));
        let writer = Writer {
            disk: disk.clone(),
            file,
            number,
            size,
            segments: segments.into_iter().map(|(n, h, _)| (n, h)).collect(),
            spans: spans.clone(),
            fsync,
            failed: None,
            written: written.clone(),
        };

        Ok(LogStore {
            entries: Arc::new(Mutex::new(state)),
            writer: Arc::new(tokio::sync::Mutex::new(writer)),
            queue: Arc::new(std::sync::OnceLock::new()),
            written,
            disk,
            spans,
            #[cfg(test)]
            segments_read: Arc::new(AtomicU64::new(0)),
            applied: Arc::new(AtomicU64::new(0)),
            memory_budget: MEMORY_BUDGET,
        })
    }

    /// Sets how much the entries in memory may take before applied ones
    /// leave (0: every applied one but the newest few leaves at once).
    #[cfg(test)]
    pub fn set_memory_budget(&mut self, budget: usize) {
        self.memory_budget = budget;
    }

    /// How many entries the log holds in memory.
    #[cfg(test)]
    pub fn entries_in_memory(&self) -> usize {
        self.lock().entries.len()
    }

    /// Where the state machine reports the highest index it has applied, so
    /// that applied entries can leave memory.
    pub fn applied_index(&self) -> Arc<AtomicU64> {
        self.applied.clone()
    }

    /// Reads the entries of `range` from the segment files, for the rare
    /// reader that wants applied entries no longer in memory. Replays only
    /// the segments whose span can hold or change those entries.
    fn read_from_disk(&self, range: impl RangeBounds<u64>) -> io::Result<Vec<Entry>> {
        use std::ops::Bound;
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&0) => return Ok(Vec::new()),
            Bound::Excluded(&i) => i - 1,
            Bound::Unbounded => u64::MAX,
        };
        let numbers: Vec<u64> = {
            let spans = self.spans.lock();
            spans
                .iter()
                .filter(|(_, span)| span.matters(start, end))
                .map(|(&n, _)| n)
                .collect()
        };
        let last = segment_numbers(&*self.disk)?.last().copied();
        let mut found = BTreeMap::new();
        for number in numbers {
            #[cfg(test)]
            self.segments_read.fetch_add(1, Ordering::Relaxed);
            let replayed = replay_segment(
                &*self.disk,
                &segment_name(number),
                Some(number) == last,
                Tail::Growing,
                |record| {
                    replay_into(&mut found, record, |index| range.contains(&index));
                },
            );
            match replayed {
                Ok(_) => {}
                // Purged (deleted) while we listed: its entries are gone anyway.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(found.into_values().collect())
    }

    /// How many segments reads from disk have replayed so far.
    #[cfg(test)]
    pub fn segments_read(&self) -> u64 {
        self.segments_read.load(Ordering::Relaxed)
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Entries> {
        self.entries.lock()
    }

    /// Queues `job` for the writer task, starting the task on the first
    /// write (on the runtime of the caller, so it ends with that runtime).
    async fn submit(&self, job: Job) -> io::Result<()> {
        let queue = self.queue.get_or_init(|| {
            let (queue, jobs) = mpsc::channel(QUEUED_WRITES);
            tokio::spawn(write_jobs(self.writer.clone(), jobs));
            queue
        });
        queue
            .send(job)
            .await
            .map_err(|_| io_err("the raft log's writer has stopped"))
    }

    /// Queues `job` and waits until it is done: durable when this returns
    /// `Ok`, and so is everything queued before it.
    async fn write_and_wait(&self, job: impl FnOnce(Done) -> Job) -> io::Result<()> {
        let (done, wait) = oneshot::channel();
        self.submit(job(Done::Waiter(done))).await?;
        wait.await
            .map_err(|_| io_err("the raft log's writer stopped before the write was done"))?
    }
}

impl<D: LogDisk> RaftLogReader<TypeConfig> for LogStore<D> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<Entry>> {
        let (from_memory, floor) = {
            let state = self.lock();
            let entries: Vec<_> = state
                .entries
                .range(range.clone())
                .map(|(_, e)| e.clone())
                .collect();
            (entries, state.memory_floor)
        };
        let starts_below_floor = match range.start_bound() {
            std::ops::Bound::Included(&i) => i < floor,
            std::ops::Bound::Excluded(&i) => i.saturating_add(1) < floor,
            std::ops::Bound::Unbounded => floor > 0,
        };
        if !starts_below_floor {
            return Ok(from_memory);
        }
        // Only what the range asks for, below the floor.
        use std::ops::Bound;
        let end = match range.end_bound() {
            Bound::Included(&i) if i < floor => Bound::Included(i),
            Bound::Excluded(&i) if i < floor => Bound::Excluded(i),
            _ => Bound::Excluded(floor),
        };
        let below = (range.start_bound().cloned(), end);
        let mut entries = self.read_from_disk(below)?;
        entries.retain(|e| range.contains(&e.log_id.index));
        entries.extend(from_memory.into_iter().filter(|e| e.log_id.index >= floor));
        Ok(entries)
    }

    async fn read_vote(&mut self) -> io::Result<Option<Vote>> {
        match self.disk.read_vote()? {
            Some(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| io_err(format!("the vote file is not a vote: {e}"))),
            None => Ok(None),
        }
    }
}

impl<D: LogDisk> RaftLogStorage<TypeConfig> for LogStore<D> {
    type LogReader = LogStore<D>;

    async fn get_log_state(&mut self) -> io::Result<LogState<TypeConfig>> {
        let state = self.lock();
        let last = state.entries.last_key_value().map(|(_, e)| e.log_id);
        Ok(LogState {
            last_purged_log_id: state.last_purged,
            last_log_id: last.or_else(|| state.last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    /// Durable when it returns, and so is every write queued before it.
    async fn save_vote(&mut self, vote: &Vote) -> io::Result<()> {
        let bytes = serde_json::to_vec(vote).map_err(io_err)?;
        self.write_and_wait(|done| Job::Vote(bytes, done)).await
    }

    /// Returns once the entries are in memory and queued for the writer;
    /// `callback` hears when they are flushed.
    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut bytes = Vec::new();
        let mut last_index = None;
        let mut span = Span::default();
        {
            let mut state = self.lock();
            for entry in entries {
                let before = bytes.len();
                encode(&RecordRef::Entry(&entry), &mut bytes)?;
                last_index = Some(entry.log_id.index);
                span.entry(entry.log_id.index);
                state.insert(entry, bytes.len() - before);
            }
            // Applied entries already written to a segment are in the state
            // machine and on disk: all but the newest few may leave memory,
            // the oldest first, once the entries take more than the budget.
            let keep_from = self
                .applied
                .load(Ordering::Relaxed)
                .min(self.written.load(Ordering::Acquire))
                .saturating_sub(APPLIED_KEPT_IN_MEMORY);
            state.shed(keep_from, self.memory_budget);
        }
        let records = Records {
            bytes,
            span,
            last_index,
            purge_upto: None,
        };
        self.submit(Job::Records(records, Done::Flushed(callback)))
            .await
    }

    async fn truncate_after(&mut self, last_kept: Option<LogId>) -> io::Result<()> {
        let from = last_kept.map_or(0, |l| l.index + 1);
        self.lock().cut_from(from);
        // What was written at and after `from` is gone: it must not let a
        // newer entry of the same index leave memory before that is written.
        self.written
            .fetch_min(from.saturating_sub(1), Ordering::Relaxed);
        let mut bytes = Vec::new();
        encode(&RecordRef::Truncate(from), &mut bytes)?;
        let mut span = Span::default();
        span.truncate(from);
        let records = Records {
            bytes,
            span,
            last_index: None,
            purge_upto: None,
        };
        self.write_and_wait(|done| Job::Records(records, done))
            .await
    }

    async fn purge(&mut self, log_id: LogId) -> io::Result<()> {
        let index = log_id.index;
        let mut bytes = Vec::new();
        encode(&RecordRef::Purge(log_id), &mut bytes)?;
        {
            let mut state = self.lock();
            state.drop_below(index + 1);
            state.last_purged = Some(log_id);
        }
        let mut span = Span::default();
        span.purge(index);
        let records = Records {
            bytes,
            span,
            last_index: None,
            purge_upto: Some(index),
        };
        self.write_and_wait(|done| Job::Records(records, done))
            .await
    }
}

pub(crate) mod records;
mod writer;

/// openraft's storage conformance suite, and the crash cases of our format.
#[cfg(test)]
mod storage_tests;
