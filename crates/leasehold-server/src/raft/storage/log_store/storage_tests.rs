//! openraft's storage conformance suite, run against our log store and state
//! machine, plus the crash cases specific to our on-disk format.

use std::sync::Arc;

use openraft::storage::{RaftLogReader, RaftLogStorage, RaftLogStorageExt};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::{EntryPayload, StorageError};

use super::LogStore;
use crate::raft::state_machine::StateMachine;
use crate::raft::storage::snapshot_store::{FileSnapshots, MemorySnapshots, SnapshotStore};
use crate::raft::{CommittedLeaderId, Entry, LogId, TypeConfig};

/// The log on disk, with the snapshot in a file or in memory.
struct Builder {
    snapshots_in_memory: bool,
}

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<TypeConfig>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = LogStore::open(dir.path()).expect("open log");
        let snapshots: Arc<dyn SnapshotStore> = if self.snapshots_in_memory {
            Arc::new(MemorySnapshots::default())
        } else {
            Arc::new(FileSnapshots::in_dir(dir.path()))
        };
        let sm = StateMachine::open(snapshots, Arc::default(), 1_000, log.applied_index())
            .expect("open state machine");
        Ok((dir, log, sm))
    }
}

#[tokio::test]
async fn openraft_storage_suite() {
    Suite::test_all(Builder {
        snapshots_in_memory: false,
    })
    .await
    .expect("storage suite, snapshots in a file");
    Suite::test_all(Builder {
        snapshots_in_memory: true,
    })
    .await
    .expect("storage suite, snapshots in memory");
}

fn blank(index: u64) -> Entry {
    Entry {
        log_id: LogId::new(
            CommittedLeaderId {
                term: 1,
                node_id: 1,
            },
            index,
        ),
        payload: EntryPayload::Blank,
    }
}

async fn append(log: &mut LogStore, entries: Vec<Entry>) {
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

fn big(index: u64) -> Entry {
    let command = leasehold_core::Command::SaveCheckpoint {
        key: format!("k{index}"),
        fence: index,
        data: vec![index as u8; 64 * 1024],
    };
    Entry {
        log_id: LogId::new(
            CommittedLeaderId {
                term: 1,
                node_id: 1,
            },
            index,
        ),
        payload: EntryPayload::Normal(crate::raft::Request {
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
        log.purge(big(280).log_id).await.unwrap();
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

/// A lagging follower reads applied entries back one append at a time:
/// each read replays the segments that hold them, not the whole log.
#[tokio::test]
async fn a_read_from_disk_replays_only_the_segments_it_needs() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut log = LogStore::open(dir.path()).expect("open");
    log.set_memory_budget(0);
    for chunk in (1..=300).collect::<Vec<u64>>().chunks(20) {
        append(&mut log, chunk.iter().map(|&i| big(i)).collect()).await;
    }
    assert_eq!(segment_count(dir.path()), 3);
    log.applied_index().store(300, Ordering::Relaxed);
    append(&mut log, vec![big(301)]).await;
    assert!(log.entries_in_memory() < 100, "applied entries left memory");

    let before = log.segments_read();
    let got = log.try_get_log_entries(10..12).await.unwrap();
    assert_eq!(
        got.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
        vec![10, 11]
    );
    assert_eq!(
        format!("{:?}", got[0].payload),
        format!("{:?}", big(10).payload)
    );
    assert_eq!(log.segments_read() - before, 1, "one segment holds them");

    let before = log.segments_read();
    let got = log.try_get_log_entries(120..140).await.unwrap();
    assert_eq!(got.len(), 20);
    assert!(log.segments_read() - before <= 2);

    // Reopened, the spans are rebuilt from the files.
    drop(log);
    let mut log = LogStore::open(dir.path()).expect("reopen");
    log.set_memory_budget(0);
    log.applied_index().store(301, Ordering::Relaxed);
    append(&mut log, vec![big(302)]).await;
    let got = log.try_get_log_entries(150..152).await.unwrap();
    assert_eq!(
        got.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
        vec![150, 151]
    );
    assert_eq!(log.segments_read(), 1);
}

#[tokio::test]
async fn applied_entries_leave_memory_and_are_read_back_from_disk() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut log = LogStore::open(dir.path()).expect("open");
    log.set_memory_budget(0);
    append(&mut log, (1..=200).map(blank).collect()).await;
    log.truncate_after(Some(blank(189).log_id)).await.unwrap();
    log.purge(blank(5).log_id).await.unwrap();
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

/// Applied entries stay in memory while they fit the budget, so the probes
/// of a new leader (a binary search over the log) read no segment; past
/// it, the oldest leave first, and the newest applied ones always stay.
#[tokio::test]
async fn applied_entries_stay_in_memory_while_they_fit_the_budget() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut log = LogStore::open(dir.path()).expect("open");
    append(&mut log, (1..=200).map(blank).collect()).await;
    log.applied_index().store(200, Ordering::Relaxed);
    append(&mut log, vec![blank(201)]).await;
    assert_eq!(log.entries_in_memory(), 201);
    let got = log.try_get_log_entries(10..20).await.unwrap();
    assert_eq!(got.len(), 10);
    assert_eq!(log.segments_read(), 0, "no segment replayed");

    // A budget of about 100 entries: the oldest leave, the rest stay.
    let one = log.lock().bytes / 201;
    log.set_memory_budget(one * 100);
    append(&mut log, vec![blank(202)]).await;
    let in_memory = log.entries_in_memory();
    assert!((95..=105).contains(&in_memory), "{in_memory} in memory");
    assert_eq!(indexes(&mut log).await, (1..=202).collect::<Vec<_>>());

    // Reopened, every entry is in memory and the sizes add up again.
    drop(log);
    let log = LogStore::open(dir.path()).expect("reopen");
    assert_eq!(log.entries_in_memory(), 202);
    assert_eq!(log.lock().bytes, one * 202);
}

/// A write that fails (here: the segment swapped for a read-only handle)
/// is reported, and the log then refuses every later write, even once
/// the disk would take it: after a failed fsync the page cache cannot be
/// trusted to hold what was written before.
#[tokio::test]
async fn after_a_failed_write_the_log_takes_no_more() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut log = LogStore::open(dir.path()).expect("open");
    append(&mut log, vec![blank(1)]).await;
    let read_only = std::fs::File::open(only_segment(dir.path())).unwrap();
    let good = std::mem::replace(
        &mut log.writer.lock().await.file,
        crate::raft::storage::disk::FsFile(Arc::new(read_only)),
    );
    assert!(log.blocking_append(vec![blank(2)]).await.is_err());
    log.writer.lock().await.file = good;
    assert!(
        log.blocking_append(vec![blank(2)]).await.is_err(),
        "a write after a failed one was taken"
    );
    assert!(log.purge(blank(1).log_id).await.is_err());
}

#[tokio::test]
async fn truncate_and_purge_survive_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut log = LogStore::open(dir.path()).expect("open");
        append(&mut log, (1..=10).map(blank).collect()).await;
        log.truncate_after(Some(blank(7).log_id)).await.unwrap();
        log.purge(blank(3).log_id).await.unwrap();
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

/// A real directory whose flushes wait for a gate, and are counted.
#[derive(Clone)]
struct GatedDisk {
    disk: crate::raft::FsDisk,
    gate: Arc<tokio::sync::Semaphore>,
    syncs: Arc<std::sync::atomic::AtomicUsize>,
}

struct GatedFile {
    file: crate::raft::FsFile,
    gate: Arc<tokio::sync::Semaphore>,
    syncs: Arc<std::sync::atomic::AtomicUsize>,
}

impl crate::raft::LogDisk for GatedDisk {
    type File = GatedFile;

    fn list(&self) -> std::io::Result<Vec<String>> {
        self.disk.list()
    }
    fn read(&self, name: &str) -> std::io::Result<Vec<u8>> {
        self.disk.read(name)
    }
    fn create(&self, name: &str, size: u64) -> std::io::Result<GatedFile> {
        Ok(self.gated(self.disk.create(name, size)?))
    }
    fn open(&self, name: &str, size: u64) -> std::io::Result<GatedFile> {
        Ok(self.gated(self.disk.open(name, size)?))
    }
    fn remove(&self, name: &str) -> std::io::Result<()> {
        self.disk.remove(name)
    }
    fn read_vote(&self) -> std::io::Result<Option<Vec<u8>>> {
        self.disk.read_vote()
    }
    fn write_vote(&self, bytes: &[u8]) -> std::io::Result<()> {
        self.disk.write_vote(bytes)
    }
}

impl GatedDisk {
    fn gated(&self, file: crate::raft::FsFile) -> GatedFile {
        GatedFile {
            file,
            gate: self.gate.clone(),
            syncs: self.syncs.clone(),
        }
    }
}

impl crate::raft::LogFile for GatedFile {
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
        self.file.write_at(offset, bytes)
    }
    fn sync(&mut self) -> impl std::future::Future<Output = std::io::Result<()>> + Send {
        let gate = self.gate.clone();
        let syncs = self.syncs.clone();
        let synced = self.file.sync();
        async move {
            gate.acquire().await.expect("gate").forget();
            syncs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            synced.await
        }
    }
    fn cut(&mut self, len: u64) -> std::io::Result<()> {
        self.file.cut(len)
    }
}

fn gated_log(dir: &std::path::Path) -> (LogStore<GatedDisk>, GatedDisk) {
    let disk = GatedDisk {
        disk: crate::raft::FsDisk::open(dir).expect("disk"),
        gate: Arc::new(tokio::sync::Semaphore::new(0)),
        syncs: Arc::default(),
    };
    (LogStore::open_on(disk.clone()).expect("open"), disk)
}

/// Appends the entry `index` and returns what its callback will say.
async fn append_unflushed(
    log: &mut LogStore<GatedDisk>,
    index: u64,
) -> impl std::future::Future<Output = Result<std::io::Result<()>, impl std::fmt::Debug>> {
    use openraft::type_config::TypeConfigExt;
    let (flushed, hears) = TypeConfig::oneshot();
    // An append that waited for its (gated) flush would never return.
    let appended = log.append(
        vec![blank(index)],
        openraft::storage::IOFlushed::signal(flushed),
    );
    tokio::time::timeout(std::time::Duration::from_secs(10), appended)
        .await
        .expect("append returned without waiting for its flush")
        .expect("append");
    hears
}

/// `append` returns before the flush (the entries readable at once), and
/// the appends made while one flush runs are all covered by the next one.
#[tokio::test]
async fn appends_return_before_their_flush_and_share_the_next_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut log, disk) = gated_log(dir.path());
    let first = append_unflushed(&mut log, 1).await;
    tokio::task::yield_now().await;
    let mut rest = Vec::new();
    for index in 2..=10 {
        rest.push(append_unflushed(&mut log, index).await);
    }
    assert_eq!(
        log.try_get_log_entries(..).await.unwrap().len(),
        10,
        "appended entries must be readable before they are flushed"
    );
    assert_eq!(disk.syncs.load(std::sync::atomic::Ordering::SeqCst), 0);

    disk.gate.add_permits(1);
    first.await.expect("told").expect("flushed");
    disk.gate.add_permits(1);
    for hears in rest {
        hears.await.expect("told").expect("flushed");
    }
    assert_eq!(
        disk.syncs.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "the nine appends made during the first flush share one flush"
    );
    drop(log);
    let mut reopened = LogStore::open(dir.path()).expect("reopen");
    assert_eq!(indexes(&mut reopened).await, (1..=10).collect::<Vec<_>>());
}

/// A vote is written only after every append made before it is flushed:
/// a term is never durable after entries of it.
#[tokio::test]
async fn a_vote_waits_for_the_appends_before_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut log, disk) = gated_log(dir.path());
    let appended = append_unflushed(&mut log, 1).await;
    let vote = crate::raft::Vote::new(7, 2);
    let mut voter = log.clone();
    let voting = tokio::spawn(async move { voter.save_vote(&vote).await });
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(
        !voting.is_finished(),
        "the vote was saved before the append"
    );
    assert_eq!(log.read_vote().await.unwrap(), None);

    disk.gate.add_permits(1);
    appended.await.expect("told").expect("flushed");
    voting.await.expect("task").expect("vote saved");
    assert_eq!(log.read_vote().await.unwrap(), Some(vote));
}

/// A flipped byte in a flushed record, with intact records after it, is
/// damage, not a torn tail: the log refuses to open, naming the segment
/// and the byte, and changes nothing.
#[tokio::test]
async fn a_damaged_record_before_intact_ones_stops_the_open_naming_segment_and_byte() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut log = LogStore::open(dir.path()).expect("open");
        append(&mut log, (1..=10).map(blank).collect()).await;
    }
    let seg = only_segment(dir.path());
    let mut bytes = std::fs::read(&seg).unwrap();
    let fifth = record_spans(&bytes)[4].clone();
    bytes[fifth.start + 9] ^= 0x10;
    std::fs::write(&seg, &bytes).unwrap();

    let err = LogStore::open(dir.path())
        .err()
        .expect("a damaged log opened");
    let text = err.to_string();
    let name = seg.file_name().unwrap().to_str().unwrap();
    assert!(
        text.contains(name) && text.contains(&format!("byte {}", fifth.start)),
        "{text}"
    );
    assert_eq!(
        std::fs::read(&seg).unwrap(),
        bytes,
        "the open changed the segment"
    );
}

/// A crash can persist some sectors of a write and not others: a record
/// with a zeroed sector in it is a torn write even with an intact record
/// of the same write after it, and is cut with what follows.
#[tokio::test]
async fn a_record_with_a_lost_sector_is_a_torn_tail_even_before_intact_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut log = LogStore::open(dir.path()).expect("open");
        append(&mut log, (1..=5).map(blank).collect()).await;
        append(&mut log, vec![big(6), big(7)]).await;
    }
    let seg = only_segment(dir.path());
    let mut bytes = std::fs::read(&seg).unwrap();
    let spans = record_spans(&bytes);
    let six = spans[5].clone();
    // A sector in the middle of entry 6 never reached the disk.
    let sector = (six.start + 4096).div_ceil(512) * 512;
    bytes[sector..sector + 512].fill(0);
    std::fs::write(&seg, &bytes).unwrap();

    let mut log = LogStore::open(dir.path()).expect("a torn tail is cut");
    assert_eq!(indexes(&mut log).await, (1..=5).collect::<Vec<_>>());
}
