//! The data the rules walk over: a lease, one key's lock with its holders
//! and its queue, and what an acquire asks for. Each type keeps its own
//! invariants (a lock's first holder is set whenever it has holders; its
//! extra part is dropped once empty); the table keeps the indexes across
//! them.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::auth::TokenId;
use crate::command::{Checkpoint, Mode};
use crate::{Fence, LeaseId, RequestId, Time};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Lease {
    pub(super) holder: Arc<str>,
    pub(super) ttl_ms: u64,
    pub(super) deadline: Time,
    /// The token that granted it, if auth was on; only that token may use it.
    pub(super) owner: Option<TokenId>,
    /// Keys this lease holds. An index over `locks`, sharing its keys; not
    /// in the snapshot (serde would not share the `Arc`s), rebuilt on load.
    #[serde(skip)]
    pub(super) held: BTreeSet<Arc<str>>,
    /// Keys this lease is queued for. Rebuilt on load like `held`.
    #[serde(skip)]
    pub(super) waiting: BTreeSet<Arc<str>>,
}

/// A lock set's keys, sorted, each once.
pub(super) type Set = Arc<[Arc<str>]>;

/// One key's state. Most locks are just held, so what only some have (a
/// queue, a checkpoint, a lock-delay, holders beyond the first) lives behind
/// one pointer: a held lock costs a few dozen bytes, which matters at a
/// million locks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub(super) struct Lock {
    /// The first holder; the others (readers, a semaphore's permits) are in
    /// `extra.more`. `None` means nobody holds the key.
    pub(super) holder: Option<Holding>,
    pub(super) extra: Option<Box<LockExtra>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub(super) struct LockExtra {
    /// Holders after the first, in the order they were granted; empty unless
    /// `holder` is set.
    pub(super) more: Vec<Holding>,
    pub(super) waiters: VecDeque<Waiter>,
    pub(super) checkpoint: Option<Checkpoint>,
    /// Set after an expiry with a lock-delay: nobody may take the key before then.
    pub(super) delayed_until: Option<Time>,
}

static NO_WAITERS: VecDeque<Waiter> = VecDeque::new();

impl Lock {
    /// Every holder, the first first.
    pub(super) fn holders(&self) -> impl Iterator<Item = &Holding> {
        let more = self.extra.as_ref().map_or(&[][..], |e| &e.more[..]);
        self.holder.iter().chain(more)
    }

    pub(super) fn holder_count(&self) -> usize {
        self.holders().count()
    }

    pub(super) fn holding_of(&self, lease: LeaseId) -> Option<&Holding> {
        self.holders().find(|h| h.lease == lease)
    }

    pub(super) fn holding_mut(&mut self, lease: LeaseId) -> Option<&mut Holding> {
        if self.holder.as_ref().is_some_and(|h| h.lease == lease) {
            return self.holder.as_mut();
        }
        self.extra
            .as_mut()
            .and_then(|e| e.more.iter_mut().find(|h| h.lease == lease))
    }

    /// Whether a hold in `mode` may join the holders now (queue and
    /// lock-delay aside).
    pub(super) fn admits(&self, mode: Mode) -> bool {
        mode.joins(self.holders().map(|h| h.mode), self.holder_count())
    }

    /// Adds a holder after the others.
    pub(super) fn add_holding(&mut self, holding: Holding) {
        if self.holder.is_none() {
            self.holder = Some(holding);
        } else {
            self.extra_mut().more.push(holding);
        }
    }

    /// Takes `lease`'s hold out; the next holder in grant order becomes the first.
    pub(super) fn take_holding(&mut self, lease: LeaseId) -> Option<Holding> {
        if self.holder.as_ref().is_some_and(|h| h.lease == lease) {
            let taken = self.holder.take();
            if let Some(extra) = self.extra.as_mut().filter(|e| !e.more.is_empty()) {
                self.holder = Some(extra.more.remove(0));
            }
            self.shrink();
            return taken;
        }
        let extra = self.extra.as_mut()?;
        let at = extra.more.iter().position(|h| h.lease == lease)?;
        let taken = extra.more.remove(at);
        self.shrink();
        Some(taken)
    }

    /// The semaphore size of whoever holds or waits for the key, if they
    /// disagree with `mode` (a semaphore asked for as a lock, or with
    /// another number of permits).
    pub(super) fn conflict(&self, mode: Mode) -> Option<Mode> {
        self.holders()
            .map(|h| h.mode)
            .chain(self.waiters().iter().map(|w| w.mode))
            .find(|m| m.permits() != mode.permits())
    }

    pub(super) fn is_empty(&self) -> bool {
        self.holder.is_none() && self.extra.is_none()
    }

    pub(super) fn waiters(&self) -> &VecDeque<Waiter> {
        self.extra.as_ref().map_or(&NO_WAITERS, |e| &e.waiters)
    }

    pub(super) fn checkpoint(&self) -> Option<&Checkpoint> {
        self.extra.as_ref().and_then(|e| e.checkpoint.as_ref())
    }

    pub(super) fn delayed_until(&self) -> Option<Time> {
        self.extra.as_ref().and_then(|e| e.delayed_until)
    }

    pub(super) fn extra_mut(&mut self) -> &mut LockExtra {
        self.extra.get_or_insert_with(Default::default)
    }

    /// Drops the extra part once it holds nothing.
    pub(super) fn shrink(&mut self) {
        if self.extra.as_ref().is_some_and(|e| {
            e.more.is_empty()
                && e.waiters.is_empty()
                && e.checkpoint.is_none()
                && e.delayed_until.is_none()
        }) {
            self.extra = None;
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Holding {
    pub(super) lease: LeaseId,
    pub(super) fence: Fence,
    pub(super) mode: Mode,
    pub(super) lock_delay_ms: u64,
    /// Set when the grant came from the queue, with the wait's request id, so a
    /// cancelled wait can take back a grant its caller never saw.
    pub(super) from_wait: Option<RequestId>,
    /// Granted to a wait whose caller has not come back since a new
    /// leadership: released at this time unless it does.
    pub(super) attach_by: Option<Time>,
    /// The wait's attempt number when it was granted, moved on by every
    /// attempt that comes back for the grant (see [`Waiter::attempt`]).
    pub(super) attempt: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Waiter {
    pub(super) lease: LeaseId,
    pub(super) mode: Mode,
    /// A lock set's wait: it is in every one of these keys' queues, and is
    /// granted all of them at once.
    pub(super) set: Option<Set>,
    pub(super) deadline: Time,
    pub(super) lock_delay_ms: u64,
    pub(super) request_id: RequestId,
    /// Since a new leadership, nobody has come back for this wait: it is
    /// withdrawn at this time unless its caller does.
    pub(super) attach_by: Option<Time>,
    /// Which attempt of the caller's waiting call the wait belongs to: 1 when
    /// queued, one more each time the same acquire comes again (a retry,
    /// perhaps through another node). Withdrawing a wait names its attempt,
    /// so an attempt its caller abandoned cannot withdraw the wait, or take
    /// back the grant, a later attempt is answering.
    pub(super) attempt: u64,
}

/// What an acquire asks for, beside its lease and key.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ask {
    pub(super) wait_ms: u64,
    pub(super) lock_delay_ms: u64,
    pub(super) request_id: RequestId,
    pub(super) mode: Mode,
}
