//! A snapshot crosses to a peer in chunks of at most `--snapshot-chunk-bytes`
//! (openraft 0.10 hands the transport a whole snapshot): the sender's side
//! is `PeerClient::full_snapshot`, the receiver puts the chunks back together
//! here and installs the snapshot once the last one has come.

use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::raft::{Snapshot, SnapshotMeta, Vote};

/// One piece of a snapshot on its way to a peer. The pieces of one snapshot
/// go in order; the last (`done`) installs it.
#[derive(Serialize, Deserialize)]
pub(in crate::raft) struct SnapshotChunk {
    /// The sending leader's vote.
    pub vote: Vote,
    /// What the whole snapshot covers.
    pub meta: SnapshotMeta,
    /// Which sending of it (a leader may start one over).
    pub sending: u64,
    /// Where `data` starts in the snapshot.
    pub offset: u64,
    pub data: Vec<u8>,
    pub done: bool,
}

/// A snapshot being received: from which leader, of what, and the bytes so
/// far.
pub(in crate::raft) struct Incoming {
    vote: Vote,
    meta: SnapshotMeta,
    sending: u64,
    bytes: Vec<u8>,
}

/// The snapshot a node is receiving, if any (one at a time: a new one from
/// offset 0 replaces it).
pub(in crate::raft) type IncomingSnapshot = Arc<Mutex<Option<Incoming>>>;

/// Takes one chunk: `Ok(Some(snapshot))` once the last one has come.
pub(in crate::raft) fn receive_chunk(
    incoming: &IncomingSnapshot,
    chunk: SnapshotChunk,
) -> Result<Option<(Vote, Snapshot)>, String> {
    let mut slot = incoming.lock();
    if chunk.offset == 0 {
        // A leader deposed since does not displace its successor's.
        if let Some(current) = slot.as_ref() {
            if chunk.vote < current.vote {
                return Err(format!(
                    "a snapshot from a newer leader ({}) is being received",
                    current.vote
                ));
            }
        }
        *slot = Some(Incoming {
            vote: chunk.vote,
            meta: chunk.meta.clone(),
            sending: chunk.sending,
            bytes: Vec::new(),
        });
    }
    let Some(current) = slot.as_mut() else {
        return Err(format!(
            "snapshot chunk at byte {} without its start; the leader sends it again from the start",
            chunk.offset
        ));
    };
    if current.vote != chunk.vote
        || current.meta != chunk.meta
        || current.sending != chunk.sending
        || current.bytes.len() as u64 != chunk.offset
    {
        let received = current.bytes.len();
        // The sender starts over; what came so far is of no use.
        if current.vote == chunk.vote {
            *slot = None;
        }
        return Err(format!(
            "snapshot chunk at byte {} does not follow the {} bytes received; the leader sends it again from the start",
            chunk.offset, received
        ));
    }
    current.bytes.extend_from_slice(&chunk.data);
    if !chunk.done {
        return Ok(None);
    }
    let Some(done) = slot.take() else {
        return Ok(None);
    };
    // Checked before Raft takes it, so a snapshot damaged on the way is
    // sent again instead of failing this node's Raft as it installs.
    crate::raft::storage::format::check_table(&done.bytes).map_err(|e| {
        format!("the snapshot received is refused ({e}); the leader sends it again from the start")
    })?;
    Ok(Some((
        done.vote,
        Snapshot {
            meta: done.meta,
            snapshot: done.bytes,
        },
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::storage::format::{encode_table, TABLE_HEADER};
    use leasehold_core::LockTable;

    fn chunk(data: Vec<u8>, offset: u64, done: bool) -> SnapshotChunk {
        SnapshotChunk {
            vote: Vote::new_committed(2, 1),
            meta: SnapshotMeta::default(),
            sending: 1,
            offset,
            data,
            done,
        }
    }

    #[test]
    fn a_snapshot_damaged_on_the_way_is_refused_and_one_whole_is_taken() {
        let incoming = IncomingSnapshot::default();
        let good = encode_table(&LockTable::new()).unwrap();
        let mut bad = good.clone();
        bad[TABLE_HEADER] ^= 0x04;
        let (head, tail) = bad.split_at(10);
        assert!(receive_chunk(&incoming, chunk(head.to_vec(), 0, false))
            .unwrap()
            .is_none());
        let err = match receive_chunk(&incoming, chunk(tail.to_vec(), 10, true)) {
            Err(e) => e,
            Ok(_) => panic!("a damaged snapshot was taken"),
        };
        assert!(
            err.contains("fails its checksum") && err.contains("sends it again"),
            "{err}"
        );
        let (_, snapshot) = receive_chunk(&incoming, chunk(good.clone(), 0, true))
            .unwrap()
            .expect("the whole snapshot");
        assert_eq!(snapshot.snapshot, good);
    }
}
