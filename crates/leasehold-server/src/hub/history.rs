//! The lock events a node applied lately, each at its place in the log, so
//! that a watch can start again after the last event it delivered, here or
//! on any other node, losing and repeating nothing.
//!
//! - **A position is the same on every node.** An event's [`Position`] is
//!   the index of the log entry that made it and its ordinal among that
//!   entry's lock events. Every node applies the same entries to the same
//!   table, so it makes the same events in the same order, whichever node
//!   a watcher reads them from.
//! - **Complete after a point.** The history holds every lock event after
//!   [`History::complete_after`] and none before it. A watch that asks for
//!   events after an earlier position is told it is behind (and must list
//!   again): the events in between were dropped, or never applied here (the
//!   node started from a snapshot, or was sent one).
//! - **Bounded.** At most [`MAX_EVENTS`] events, and [`MAX_BYTES`] of keys,
//!   holders and checkpoint data; the oldest go first. A batch larger than
//!   that (a lease that ends with a million keys) keeps only its tail.

use std::collections::VecDeque;
use std::sync::Arc;

use leasehold_core::{Event, Fence, LeaseId};

/// Lock events a node keeps to resume watches from. An event costs about
/// 100 bytes beside its key and holder (which the table shares while they
/// are held): about a megabyte, and at the rate of a busy node's releases
/// and grants (~20k a second) half a second of events; a watcher cut off
/// for longer than that lists again.
pub const MAX_EVENTS: usize = 10_000;

/// Bytes of keys, holders and checkpoints kept at most: 10,000 checkpoints
/// of 64 KiB would be 640 MiB.
pub const MAX_BYTES: usize = 16 << 20;

/// Where an event stands in the life of the deployment: after every event
/// of lower position, before every one of higher.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    /// The log index of the entry that made it.
    pub index: u64,
    /// Its ordinal among the lock events of that entry, from 0.
    pub seq: u32,
}

impl Position {
    /// After every event of the entry at `index`.
    pub fn end_of(index: u64) -> Position {
        Position {
            index,
            seq: u32::MAX,
        }
    }

    /// Reads `INDEX` (after that whole entry) or `INDEX.SEQ`, as a
    /// server-sent event's id carries it.
    pub fn parse(text: &str) -> Option<Position> {
        let text = text.trim();
        match text.split_once('.') {
            None => text.parse().ok().map(Position::end_of),
            Some((index, seq)) => Some(Position {
                index: index.parse().ok()?,
                seq: seq.parse().ok()?,
            }),
        }
    }
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.index, self.seq)
    }
}

/// What a lock event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A key was granted.
    Acquired,
    /// A key was released, or its lease revoked.
    Released,
    /// A key was freed because its lease expired.
    Expired,
    /// A holder saved a checkpoint.
    Checkpoint,
}

impl Kind {
    /// As the API names it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Acquired => "acquired",
            Kind::Released => "released",
            Kind::Expired => "expired",
            Kind::Checkpoint => "checkpoint",
        }
    }
}

/// A lock event as applied by this node.
#[derive(Debug, Clone)]
pub struct LockEvent {
    /// Its place in the log.
    pub at: Position,
    /// When this node applied it, in Unix milliseconds on its own wall
    /// clock (for people reading it; nothing decides by it).
    pub at_unix_ms: u64,
    /// What happened.
    pub kind: Kind,
    /// The key.
    pub key: Arc<str>,
    /// The token of the hold that began, ended or saved.
    pub fence: Fence,
    /// The lease of that hold.
    pub lease: LeaseId,
    /// Its holder's name.
    pub holder: Arc<str>,
    /// With [`Kind::Checkpoint`]: the bytes saved.
    pub data: Option<Arc<[u8]>>,
}

impl LockEvent {
    /// The lock event `event` is, if it is one.
    pub fn of(event: &Event, at: Position, at_unix_ms: u64) -> Option<LockEvent> {
        let (kind, key, fence, lease, holder, data) = match event {
            Event::Acquired {
                key,
                fence,
                lease,
                holder,
                ..
            } => (Kind::Acquired, key, fence, lease, holder, None),
            Event::Released {
                key,
                fence,
                lease,
                holder,
            } => (Kind::Released, key, fence, lease, holder, None),
            Event::Expired {
                key,
                fence,
                lease,
                holder,
            } => (Kind::Expired, key, fence, lease, holder, None),
            Event::CheckpointSaved {
                key,
                fence,
                lease,
                holder,
                data,
            } => (
                Kind::Checkpoint,
                key,
                fence,
                lease,
                holder,
                Some(data.clone()),
            ),
            _ => return None,
        };
        Some(LockEvent {
            at,
            at_unix_ms,
            kind,
            key: key.clone(),
            fence: *fence,
            lease: *lease,
            holder: holder.clone(),
            data,
        })
    }

    /// Whether `event` is a lock event (one a watch shows).
    pub fn is_lock_event(event: &Event) -> bool {
        matches!(
            event,
            Event::Acquired { .. }
                | Event::Released { .. }
                | Event::Expired { .. }
                | Event::CheckpointSaved { .. }
        )
    }

    /// What keeping it costs, in bytes of its own.
    fn bytes(&self) -> usize {
        self.key.len() + self.holder.len() + self.data.as_ref().map_or(0, |d| d.len())
    }
}

/// Asked for events after a position the history no longer reaches back to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Behind {
    /// What the history is complete after.
    pub complete_after: Position,
}

/// The recent lock events, complete after a position.
#[derive(Debug)]
pub struct History {
    events: VecDeque<LockEvent>,
    bytes: usize,
    complete_after: Position,
    /// The last entry applied, lock events or not.
    applied: u64,
}

impl History {
    /// An empty history of a node whose table stands after the entry at
    /// `applied` (its snapshot's, when it starts).
    pub fn after(applied: u64) -> History {
        History {
            events: VecDeque::new(),
            bytes: 0,
            complete_after: Position::end_of(applied),
            applied,
        }
    }

    /// Every lock event after this is here.
    pub fn complete_after(&self) -> Position {
        self.complete_after
    }

    /// After every event applied so far: where a watch from now begins.
    pub fn now(&self) -> Position {
        Position::end_of(self.applied)
    }

    /// Keeps `event`, the newest, dropping the oldest beyond the bounds.
    pub fn push(&mut self, event: LockEvent) {
        debug_assert!(event.at > self.complete_after);
        self.bytes += event.bytes();
        self.events.push_back(event);
        while self.events.len() > MAX_EVENTS || self.bytes > MAX_BYTES {
            let Some(gone) = self.events.pop_front() else {
                break;
            };
            self.bytes -= gone.bytes();
            // A batch's skipped head may lie after older events still kept.
            self.complete_after = self.complete_after.max(gone.at);
        }
    }

    /// Events up to `at` were left out (a batch's head beyond the bounds).
    pub fn skip_through(&mut self, at: Position) {
        if at > self.complete_after {
            self.complete_after = at;
        }
    }

    /// Every entry up to `index` is applied.
    pub fn applied_through(&mut self, index: u64) {
        self.applied = self.applied.max(index);
    }

    /// The table was replaced by a snapshot through `index`: whatever
    /// happened before it was not applied here, one event at a time.
    pub fn restart_after(&mut self, index: u64) {
        *self = History::after(index);
    }

    /// The events after `after`, oldest first; [`Behind`] if some of them
    /// are no longer (or were never) here.
    pub fn since(&self, after: Position) -> Result<Vec<LockEvent>, Behind> {
        if after < self.complete_after {
            return Err(Behind {
                complete_after: self.complete_after,
            });
        }
        let from = self.events.partition_point(|e| e.at <= after);
        Ok(self.events.range(from..).cloned().collect())
    }

    /// The last `n` events, oldest first.
    pub fn last(&self, n: usize) -> Vec<LockEvent> {
        let from = self.events.len().saturating_sub(n);
        self.events.range(from..).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(index: u64, seq: u32, key: &str) -> LockEvent {
        LockEvent {
            at: Position { index, seq },
            at_unix_ms: 0,
            kind: Kind::Acquired,
            key: key.into(),
            fence: index,
            lease: 1,
            holder: "h".into(),
            data: None,
        }
    }

    fn positions(events: &[LockEvent]) -> Vec<(u64, u32)> {
        events.iter().map(|e| (e.at.index, e.at.seq)).collect()
    }

    #[test]
    fn positions_read_as_ids_write_them_and_order_by_entry_then_seq() {
        let p = Position { index: 7, seq: 2 };
        assert_eq!(Position::parse(&p.to_string()), Some(p));
        assert_eq!(Position::parse("7"), Some(Position::end_of(7)));
        assert!(Position::end_of(7) > p && p > Position::end_of(6));
        for bad in ["", "x", "7.", ".2", "7.2.1", "-1", "7.99999999999"] {
            assert_eq!(Position::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_watch_resumes_after_any_position_the_history_reaches() {
        let mut h = History::after(10);
        for (index, seq) in [(11, 0), (11, 1), (13, 0)] {
            h.push(event(index, seq, "k"));
        }
        h.applied_through(14);
        assert_eq!(h.now(), Position::end_of(14));
        let after = |p| h.since(p).map(|e| positions(&e));
        assert_eq!(
            after(Position::end_of(10)),
            Ok(vec![(11, 0), (11, 1), (13, 0)])
        );
        assert_eq!(
            after(Position { index: 11, seq: 0 }),
            Ok(vec![(11, 1), (13, 0)])
        );
        assert_eq!(after(Position::end_of(11)), Ok(vec![(13, 0)]));
        assert_eq!(after(Position::end_of(20)), Ok(vec![]), "not applied yet");
        assert_eq!(
            after(Position::end_of(9)),
            Err(Behind {
                complete_after: Position::end_of(10)
            }),
            "before the snapshot the node started from"
        );
    }

    #[test]
    fn the_oldest_go_first_and_the_history_says_so() {
        let mut h = History::after(0);
        for i in 1..=(MAX_EVENTS as u64 + 5) {
            h.push(event(i, 0, "k"));
        }
        assert_eq!(h.last(usize::MAX).len(), MAX_EVENTS);
        assert_eq!(h.complete_after(), Position { index: 5, seq: 0 });
        assert!(h.since(Position { index: 4, seq: 0 }).is_err());
        assert_eq!(
            h.since(Position { index: 5, seq: 0 }).map(|e| e.len()),
            Ok(MAX_EVENTS)
        );
        assert_eq!(
            positions(&h.last(2)),
            vec![(MAX_EVENTS as u64 + 4, 0), (MAX_EVENTS as u64 + 5, 0)]
        );

        // Big checkpoints count by their bytes.
        let mut h = History::after(0);
        let big: Arc<[u8]> = vec![0u8; 64 << 10].into();
        for i in 1..=300 {
            let mut e = event(i, 0, "k");
            e.data = Some(big.clone());
            h.push(e);
        }
        assert_eq!(h.last(usize::MAX).len(), MAX_BYTES / ((64 << 10) + 2));
    }

    #[test]
    fn a_snapshot_installed_restarts_the_history_after_it() {
        let mut h = History::after(0);
        h.push(event(1, 0, "k"));
        h.restart_after(50);
        assert!(h.since(Position::end_of(1)).is_err());
        assert_eq!(h.since(Position::end_of(50)).map(|e| e.len()), Ok(0));
        h.skip_through(Position { index: 60, seq: 3 });
        assert!(h.since(Position { index: 60, seq: 2 }).is_err());
        assert!(h.since(Position { index: 60, seq: 3 }).is_ok());
    }
}
