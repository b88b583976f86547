//! The raft module's decoders of what comes from peers and the disk, fed
//! arbitrary bytes (see [`crate::fuzzing`]).

use std::io;
use std::path::PathBuf;
use std::sync::OnceLock;

use bytes::BytesMut;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, TransferLeaderRequest, VoteRequest, VoteResponse,
};
use tokio_util::codec::Decoder;

use super::storage::log_store::records::{replay_records, Tail};
use super::storage::snapshot_store::{FileSnapshots, SnapshotStore};
use super::transport::snapshot_chunks::SnapshotChunk;
use super::transport::{decode, MembershipReply, ProbeReply};
use super::TypeConfig;

/// A peer's message of every kind a node decodes, and a framed stream of
/// appends (length-prefixed frames, each an append or an answer).
pub fn peer_messages(data: &[u8]) {
    let _ = decode::<AppendEntriesRequest<TypeConfig>>(data);
    let _ = decode::<VoteRequest<TypeConfig>>(data);
    let _ = decode::<SnapshotChunk>(data);
    let _ = decode::<TransferLeaderRequest<TypeConfig>>(data);
    let _ = decode::<ProbeReply>(data);
    let _ = decode::<MembershipReply>(data);
    let _ = decode::<Result<AppendEntriesResponse<TypeConfig>, String>>(data);
    let _ = decode::<Result<VoteResponse<TypeConfig>, String>>(data);
    let mut codec = super::transport::framed::codec();
    let mut buffer = BytesMut::from(data);
    while let Ok(Some(frame)) = codec.decode(&mut buffer) {
        let _ = decode::<AppendEntriesRequest<TypeConfig>>(&frame);
        if let Some((_, answer)) = frame.split_first() {
            let _ = decode::<AppendEntriesResponse<TypeConfig>>(answer);
        }
    }
}

/// A log segment's bytes, read as a start reads the last segment and as a
/// read beside the writer does.
pub fn log_segment(data: &[u8]) {
    for tail in [Tail::Strict, Tail::Growing] {
        let _ = replay_records("fuzz", data, true, tail, |_| {});
    }
    let _ = replay_records("fuzz", data, false, Tail::Strict, |_| {});
}

/// A snapshot file (header, meta, table), and a table's encoding alone.
pub fn snapshot_file(data: &[u8]) -> io::Result<()> {
    let _ = super::storage::format::decode_table(data);
    let path = scratch_file("snapshot");
    std::fs::write(&path, data)?;
    let snapshots = FileSnapshots::at(path);
    let _ = snapshots.file_format();
    let _ = snapshots.load();
    Ok(())
}

/// A data dir's small files: `format`, and `cluster` (read from a file,
/// as a start reads it); a peer message's header; a caller's cluster id.
pub fn dir_files(data: &[u8]) -> io::Result<()> {
    let text = String::from_utf8_lossy(data);
    let _ = super::storage::format::parse_dir_format(&text);
    let _ = super::storage::cluster_id::parse(Some(&text));
    let _ = super::storage::format::unframe_peer_message(data);
    let path = scratch_file("cluster");
    std::fs::write(&path, data)?;
    let _ = super::storage::cluster_id::read(&path);
    Ok(())
}

/// A file of this process's own to write inputs that are read from a path.
fn scratch_file(name: &str) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("leasehold-fuzz-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        dir
    });
    dir.join(name)
}
