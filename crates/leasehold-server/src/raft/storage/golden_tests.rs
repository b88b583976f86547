//! Golden encodings: what this build writes to a data dir and to peers,
//! byte for byte, beside the files in `tests/golden/` that earlier builds
//! wrote. Each file's name carries the format version it was written
//! under. A change of encoding without a raised version fails here; with a
//! raised version, the new file is written on the first run (commit it),
//! and the files of every older version must still read back.
//!
//! The lock table's own encoding is pinned the same way in
//! `leasehold-core/tests/snapshot_format.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use leasehold_core::auth::{hash_secret, AuthChange, Permission, Rule};
use leasehold_core::{Command, LockTable, Mode, Stamp};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest, VoteResponse};
use openraft::storage::{RaftLogReader, RaftLogStorage, RaftLogStorageExt};
use openraft::{EntryPayload, Membership};

use crate::raft::storage::format::{self, DATA_FORMAT, PEER_FORMAT, TABLE_FORMAT};
use crate::raft::storage::log_store::LogStore;
use crate::raft::storage::snapshot_store::{FileSnapshots, SnapshotStore, SNAPSHOT_FILE_FORMAT};
use crate::raft::transport::snapshot_chunks::SnapshotChunk;
use crate::raft::transport::{decode, encode, MembershipReply, ProbeReply};
use crate::raft::{CommittedLeaderId, Entry, LogId, Request, SnapshotMeta, StoredMembership, Vote};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// Compares `made` with the golden file `name` (written from `made` if it
/// is missing); `raise` names the version to raise when they differ.
fn check_golden(name: &str, made: &[u8], raise: &str) {
    let path = golden_dir().join(name);
    if !path.exists() {
        std::fs::create_dir_all(golden_dir()).expect("mkdir golden");
        // Tests run side by side: written aside, then renamed into place.
        let aside = path.with_extension(format!("{:?}.tmp", std::thread::current().id()));
        std::fs::write(&aside, made).expect("write golden file");
        std::fs::rename(&aside, &path).expect("move golden file into place");
        eprintln!("wrote {}", path.display());
    }
    let golden = std::fs::read(&path).expect("read golden file");
    assert!(
        golden == made,
        "the encoding in {name} changed ({} bytes now, {} in the file; first difference at byte \
         {:?}): raise {raise} in raft/storage/format.rs, read the old version on, and commit the new file",
        made.len(),
        golden.len(),
        made.iter().zip(&golden).position(|(x, y)| x != y)
    );
}

/// The golden files whose names start with `prefix` and end with `suffix`,
/// one per version written so far.
fn every_version(prefix: &str, suffix: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .expect("read tests/golden")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with(prefix) && name.ends_with(suffix)
        })
        .collect();
    found.sort();
    assert!(!found.is_empty(), "no golden file {prefix}*{suffix}");
    found
}

fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId { term, node_id: 1 }, index)
}

/// One of each command, as a log entry carries them.
fn every_command() -> Vec<Command> {
    let grant = Command::Grant {
        ttl_ms: 10_000,
        holder: "worker-1".into(),
        request_id: 7,
    };
    let change = AuthChange::SetRole {
        name: "jobs".into(),
        rules: vec![Rule {
            prefix: "jobs/".into(),
            permission: Permission::Lock,
        }],
    };
    vec![
        grant.clone(),
        Command::KeepAlive { lease: 1 },
        Command::Revoke { lease: 1 },
        Command::Acquire {
            lease: 1,
            key: "orders/1".into(),
            wait_ms: 500,
            lock_delay_ms: 100,
            request_id: 8,
            mode: Mode::Exclusive,
        },
        Command::GrantAndAcquire {
            ttl_ms: 5_000,
            holder: "reader".into(),
            key: "config".into(),
            wait_ms: 0,
            lock_delay_ms: 0,
            request_id: 9,
            mode: Mode::Shared,
        },
        Command::Acquire {
            lease: 2,
            key: "pool".into(),
            wait_ms: 0,
            lock_delay_ms: 0,
            request_id: 10,
            mode: Mode::Permit { permits: 3 },
        },
        Command::CancelWait {
            lease: 1,
            key: "orders/1".into(),
            request_id: 8,
            attempt: 2,
        },
        Command::Release {
            key: "orders/1".into(),
            fence: 4,
            request_id: 11,
        },
        Command::SaveCheckpoint {
            key: "orders/1".into(),
            fence: 4,
            data: b"item 40".to_vec(),
        },
        Command::Tick,
        Command::As {
            token: Some(3),
            command: Box::new(grant),
        },
        Command::Auth {
            change: AuthChange::Enable {
                root_hash: hash_secret("root secret"),
            },
            at_unix_ms: 1_700_000_000_000,
        },
        Command::AcquireSet {
            lease: 1,
            keys: vec!["a".into(), "b".into()],
            wait_ms: 0,
            lock_delay_ms: 0,
            request_id: 12,
        },
        Command::AuthWithCertificate {
            change,
            at_unix_ms: 1_700_000_000_001,
            subject: "CN=ops".into(),
        },
    ]
}

fn members() -> Membership<u64, crate::raft::Node> {
    let nodes: BTreeMap<u64, crate::raft::Node> = (1..=3)
        .map(|id| (id, crate::raft::Node::new(format!("127.0.0.{id}:7419"))))
        .collect();
    Membership::new(vec![BTreeSet::from([1, 2, 3])], nodes).expect("a membership")
}

/// The entries the golden log holds: blank, membership and commands.
fn entries() -> Vec<Entry> {
    vec![
        Entry {
            log_id: log_id(1, 1),
            payload: EntryPayload::Blank,
        },
        Entry {
            log_id: log_id(1, 2),
            payload: EntryPayload::Membership(members()),
        },
        Entry {
            log_id: log_id(2, 3),
            payload: EntryPayload::Normal(Request {
                stamp: Stamp {
                    now: 1_000,
                    epoch: 2,
                },
                commands: every_command(),
            }),
        },
        Entry {
            log_id: log_id(2, 4),
            payload: EntryPayload::Blank,
        },
    ]
}

fn debug(entries: &[Entry]) -> Vec<String> {
    entries.iter().map(|e| format!("{e:?}")).collect()
}

/// A segment's records, without the preallocated zeros after them.
fn records_of(segment: &[u8]) -> &[u8] {
    let mut at = 0;
    while at + 8 <= segment.len() {
        let len = u32::from_le_bytes([
            segment[at],
            segment[at + 1],
            segment[at + 2],
            segment[at + 3],
        ]) as usize;
        if len == 0 {
            break;
        }
        at += 8 + len;
    }
    &segment[..at]
}

#[tokio::test]
async fn the_log_segment_is_written_and_read_as_every_version_wrote_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut log = LogStore::open(dir.path()).expect("open");
        log.blocking_append(entries()).await.expect("append");
        // Record kinds besides entries: a truncation and a purge.
        log.truncate_after(Some(log_id(2, 3)))
            .await
            .expect("truncate");
        log.purge(log_id(1, 1)).await.expect("purge");
    }
    let segment = std::fs::read(dir.path().join("log/00000000000000000001.seg")).expect("segment");
    check_golden(
        &format!("log-segment-data-v{DATA_FORMAT}.bin"),
        records_of(&segment),
        "DATA_FORMAT",
    );
    let expected = debug(&entries()[1..3]);
    for golden in every_version("log-segment-data-v", ".bin") {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("log")).expect("mkdir");
        std::fs::copy(&golden, dir.path().join("log/00000000000000000001.seg")).expect("copy");
        let mut log = LogStore::open(dir.path()).expect("open the golden segment");
        let read = log.try_get_log_entries(..).await.expect("read");
        assert_eq!(debug(&read), expected, "{}", golden.display());
    }
}

#[test]
fn the_vote_is_written_and_read_as_every_version_wrote_it() {
    let vote = Vote::new_committed(7, 2);
    let made = serde_json::to_vec(&vote).expect("encode");
    check_golden(
        &format!("vote-data-v{DATA_FORMAT}.json"),
        &made,
        "DATA_FORMAT",
    );
    for golden in every_version("vote-data-v", ".json") {
        let read: Vote = serde_json::from_slice(&std::fs::read(&golden).expect("read"))
            .expect("decode the golden vote");
        assert_eq!(read, vote, "{}", golden.display());
    }
}

fn table() -> LockTable {
    let mut table = LockTable::new();
    let stamp = Stamp {
        now: 1_000,
        epoch: 1,
    };
    let mut events = Vec::new();
    for command in every_command().into_iter().take(6) {
        // Some are refused (the lease is gone by then): the table is what
        // matters here.
        let _ = table.apply(stamp, command, &mut events);
    }
    table
}

fn meta() -> SnapshotMeta {
    SnapshotMeta {
        last_log_id: Some(log_id(2, 42)),
        last_membership: StoredMembership::new(Some(log_id(1, 2)), members()),
    }
}

#[test]
fn the_snapshot_file_is_written_and_read_as_every_version_wrote_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = FileSnapshots::in_dir(dir.path());
    let encoded = format::encode_table(&table()).expect("encode");
    store.save(&meta(), &encoded).expect("save");
    let made = std::fs::read(dir.path().join("snapshot")).expect("read");
    check_golden(
        &format!("snapshot-file-v{SNAPSHOT_FILE_FORMAT}-table-v{TABLE_FORMAT}.bin"),
        &made,
        "SNAPSHOT_FILE_FORMAT or TABLE_FORMAT",
    );
    for golden in every_version("snapshot-file-v", ".bin") {
        let (read_meta, read_table) = FileSnapshots::at(golden.clone())
            .load()
            .expect("load the golden snapshot")
            .expect("a snapshot");
        assert_eq!(read_meta, meta(), "{}", golden.display());
        assert_eq!(read_table, table(), "{}", golden.display());
    }
}

/// Checks one peer message against its golden file, and that every
/// version of it decodes to the same message.
fn check_peer_message<T>(name: &str, message: &T)
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let made = encode(message).expect("encode");
    check_golden(
        &format!("peer-{name}-v{PEER_FORMAT}.bin"),
        &made,
        "PEER_FORMAT",
    );
    for golden in every_version(&format!("peer-{name}-v"), ".bin") {
        let bytes = std::fs::read(&golden).expect("read");
        let read: T = decode(&bytes).expect("decode the golden message");
        assert_eq!(encode(&read).expect("encode"), made, "{}", golden.display());
    }
}

#[test]
fn peer_messages_are_written_and_read_as_every_version_wrote_them() {
    let vote = Vote::new_committed(2, 1);
    check_peer_message(
        "append",
        &AppendEntriesRequest::<crate::raft::TypeConfig> {
            vote,
            prev_log_id: Some(log_id(1, 2)),
            entries: entries()[2..].to_vec(),
            leader_commit: Some(log_id(1, 2)),
        },
    );
    check_peer_message(
        "append-answer",
        &AppendEntriesResponse::<crate::raft::TypeConfig>::Success,
    );
    check_peer_message(
        "vote",
        &VoteRequest::<crate::raft::TypeConfig>::new(Vote::new(3, 2), Some(log_id(2, 4))),
    );
    check_peer_message(
        "vote-answer",
        &VoteResponse::<crate::raft::TypeConfig>::new(Vote::new(3, 2), Some(log_id(2, 4)), true),
    );
    check_peer_message(
        "snapshot-chunk",
        &SnapshotChunk {
            vote,
            meta: meta(),
            sending: 1,
            offset: 0,
            data: format::encode_table(&table()).expect("encode"),
            done: true,
        },
    );
    check_peer_message(
        "probe-answer",
        &ProbeReply {
            initialized: true,
            term: 2,
            leader: Some(1),
        },
    );
    check_peer_message(
        "membership-answer",
        &MembershipReply {
            index: Some(2),
            committed: true,
            members: vec![1, 2, 3],
        },
    );
}

#[test]
fn a_peer_message_of_another_format_is_refused_naming_both_versions() {
    let mut newer = encode(&ProbeReply {
        initialized: true,
        term: 1,
        leader: None,
    })
    .expect("encode");
    newer[2..4].copy_from_slice(&(PEER_FORMAT + 1).to_le_bytes());
    let err = decode::<ProbeReply>(&newer).expect_err("a newer format is refused");
    assert!(
        err.contains(&format!("peer format {}", PEER_FORMAT + 1))
            && err.contains(&format!("up to {PEER_FORMAT}"))
            && err.contains("upgrade this node"),
        "{err}"
    );
    // Release 0.1.0 sent bincode alone.
    let unframed = newer[4..].to_vec();
    let err = decode::<ProbeReply>(&unframed).expect_err("an unversioned message is refused");
    assert!(
        err.contains("0.1.0") && err.contains("upgrade every node"),
        "{err}"
    );
}
