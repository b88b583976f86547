//! A snapshot crosses to a peer in chunks of at most `--snapshot-chunk-bytes`
//! (openraft 0.10 hands the transport a whole snapshot): the sender's side
//! is `PeerClient::full_snapshot`, the receiver puts the chunks back together
//! here and installs the snapshot once the last one has come.

use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::{Snapshot, SnapshotMeta, Vote};

/// One piece of a snapshot on its way to a peer. The pieces of one snapshot
/// go in order; the last (`done`) installs it.
#[derive(Serialize, Deserialize)]
pub(super) struct SnapshotChunk {
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
pub(super) struct Incoming {
    vote: Vote,
    meta: SnapshotMeta,
    sending: u64,
    bytes: Vec<u8>,
}

/// The snapshot a node is receiving, if any (one at a time: a new one from
/// offset 0 replaces it).
pub(super) type IncomingSnapshot = Arc<Mutex<Option<Incoming>>>;

/// Takes one chunk: `Ok(Some(snapshot))` once the last one has come.
pub(super) fn receive_chunk(
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
    Ok(Some((
        done.vote,
        Snapshot {
            meta: done.meta,
            snapshot: done.bytes,
        },
    )))
}
