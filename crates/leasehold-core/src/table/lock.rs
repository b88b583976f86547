//! The data the rules walk over: a lease, one key's lock with its holders
//! and its queue, and what an acquire asks for. Each type keeps its own
//! invariants (a lock's first holder is set whenever it has holders; its
//! extra part is dropped once empty); the table keeps the indexes across
//! them.

use std::collections::VecDeque;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::auth::TokenId;
use crate::command::{Checkpoint, Mode};
use crate::{Fence, LeaseId, LockError, RequestId, Time};

use super::keys::Keys;

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
    pub(super) held: Keys,
    /// Keys this lease is queued for. Rebuilt on load like `held`.
    #[serde(skip)]
    pub(super) waiting: Keys,
}

impl Lease {
    /// A lease that holds and waits for nothing yet.
    pub(super) fn new(
        holder: Arc<str>,
        ttl_ms: u64,
        deadline: Time,
        owner: Option<TokenId>,
    ) -> Self {
        Lease {
            holder,
            ttl_ms,
            deadline,
            owner,
            held: Keys::None,
            waiting: Keys::None,
        }
    }
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

    /// Whether a newcomer in `mode` may take the key now: nobody waits for
    /// it, it is not in lock-delay, and its holders admit the mode (none for
    /// an exclusive hold, only readers for a reader, fewer than its permits
    /// for a semaphore).
    pub(super) fn free_for(&self, mode: Mode) -> bool {
        self.delayed_until().is_none() && self.waiters().is_empty() && self.admits(mode)
    }

    /// Whether `lease`'s lock-set wait may take this key now: nobody holds
    /// it, it is not in lock-delay, and the wait is first in line.
    pub(super) fn ready_for_set(&self, lease: LeaseId) -> bool {
        self.holder.is_none()
            && self.delayed_until().is_none()
            && self.waiters().front().is_some_and(|w| w.lease == lease)
    }

    /// Refuses `mode` on `key` (this lock) while it is held or waited for
    /// as another kind: a lock, or a semaphore of another size.
    pub(super) fn check_kind(&self, key: &str, mode: Mode) -> Result<(), LockError> {
        let Some(is) = self.conflict(mode) else {
            return Ok(());
        };
        let kind = |m: Mode| match m.permits() {
            Some(n) => format!("a semaphore of {n} permits"),
            None => "a lock".to_string(),
        };
        Err(LockError::invalid(
            "permits",
            format!(
                "{key:?} is {} while anyone holds or waits for it; asked for it as {}",
                kind(is),
                kind(mode)
            ),
        ))
    }

    /// Why a newcomer may not take `key` (this lock) at table time `now`:
    /// its holder, the lock set first in line for it, or its lock-delay.
    /// `name` gives a lease's holder name.
    pub(super) fn busy_error(
        &self,
        key: &str,
        now: Time,
        name: impl Fn(LeaseId) -> String,
    ) -> LockError {
        // Free, but a lock set waits first in line for it (and for keys
        // that are not free yet): the set is next.
        if let (None, None, Some(w)) = (&self.holder, self.delayed_until(), self.waiters().front())
        {
            return LockError::Held {
                key: key.to_string(),
                holder: format!("{} (next in line, for a lock set)", name(w.lease)),
                lease: w.lease,
                fence: 0,
            };
        }
        match &self.holder {
            Some(h) => LockError::Held {
                key: key.to_string(),
                holder: name(h.lease),
                lease: h.lease,
                fence: h.fence,
            },
            None => LockError::LockDelayed {
                key: key.to_string(),
                left_ms: self.delayed_until().map_or(0, |t| t.saturating_sub(now)),
            },
        }
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

    /// Queues `waiter` at the back.
    pub(super) fn enqueue(&mut self, waiter: Waiter) {
        #[cfg(feature = "planted-bugs")]
        if crate::planted::is(crate::planted::TableBug::LifoQueue) {
            self.extra_mut().waiters.push_front(waiter);
            return;
        }
        self.extra_mut().waiters.push_back(waiter);
    }

    /// Takes `lease`'s wait out of the queue.
    pub(super) fn take_waiter(&mut self, lease: LeaseId) -> Option<Waiter> {
        let at = self.waiters().iter().position(|w| w.lease == lease)?;
        let waiter = self.extra_mut().waiters.remove(at)?;
        self.shrink();
        Some(waiter)
    }

    /// Takes the first waiter out of the queue, whatever it waits for.
    pub(super) fn pop_first(&mut self) -> Option<Waiter> {
        self.extra.as_mut().and_then(|e| e.waiters.pop_front())
    }

    /// Takes the first waiter out of the queue if the holders admit its
    /// mode. Every queued waiter is live: waits leave the queue when they
    /// time out or their lease ends.
    pub(super) fn pop_admitted(&mut self) -> Option<Waiter> {
        let admitted = self.waiters().front().is_some_and(|w| self.admits(w.mode));
        let next = if admitted { self.pop_first() } else { None };
        self.shrink();
        next
    }

    /// After a new leadership, every grant to a wait whose caller has not
    /// come back, and every queued wait, is withdrawn at `until` unless its
    /// caller comes back first. Tells `note` the lease of each.
    pub(super) fn detach(&mut self, until: Time, mut note: impl FnMut(LeaseId)) {
        let detach = |h: &mut Holding| match h.wait.as_mut() {
            Some(w) if w.attach_by.is_some() => {
                w.attach_by = Some(until);
                true
            }
            _ => false,
        };
        if let Some(h) = self.holder.as_mut() {
            if detach(h) {
                note(h.lease);
            }
        }
        if let Some(extra) = self.extra.as_mut() {
            for h in extra.more.iter_mut() {
                if detach(h) {
                    note(h.lease);
                }
            }
            for w in extra.waiters.iter_mut() {
                w.attach_by = Some(until);
                note(w.lease);
            }
        }
    }

    /// The caller of `lease`'s wait here (or of the grant it turned into)
    /// came back: neither is withdrawn for want of it any more, and the
    /// wait's attempt moves on. Returns the re-attach deadline it cleared,
    /// if any, and the new attempt's number (0: no wait, nor a grant to one).
    pub(super) fn reattach(&mut self, lease: LeaseId) -> (Option<Time>, u64) {
        let mut cleared = None;
        let mut attempt = 0;
        if let Some(w) = self.holding_mut(lease).and_then(|h| h.wait.as_mut()) {
            cleared = w.attach_by.take();
            if w.request_id.is_some() {
                w.attempt += 1;
                attempt = w.attempt;
            }
        }
        if let Some(extra) = self.extra.as_mut() {
            if let Some(w) = extra.waiters.iter_mut().find(|w| w.lease == lease) {
                let waiting = w.attach_by.take();
                cleared = cleared.or(waiting);
                w.attempt += 1;
                attempt = w.attempt;
            }
        }
        (cleared, attempt)
    }

    /// Starts a lock-delay: nobody may take the key before `until`.
    pub(super) fn delay_until(&mut self, until: Time) {
        self.extra_mut().delayed_until = Some(until);
    }

    /// Ends the lock-delay.
    pub(super) fn end_delay(&mut self) {
        self.extra_mut().delayed_until = None;
        self.shrink();
    }

    /// Stores `checkpoint` in place of the one kept (`None`: clears it).
    pub(super) fn set_checkpoint(&mut self, checkpoint: Option<Checkpoint>) {
        self.extra_mut().checkpoint = checkpoint;
        self.shrink();
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

/// One hold of a key. Most holds are granted at once; what only a grant to
/// a queued wait carries sits behind one pointer, so a held lock's entry is
/// 48 bytes (it was 80, a third of a million locks' memory).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "HoldingForm", into = "HoldingForm")]
pub(super) struct Holding {
    pub(super) lease: LeaseId,
    pub(super) fence: Fence,
    pub(super) mode: Mode,
    pub(super) lock_delay_ms: u64,
    /// Set when the grant came from the queue.
    wait: Option<Box<WaitGrant>>,
}

/// What a grant to a queued wait remembers of the wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct WaitGrant {
    /// The wait's request id, so a cancelled wait can take back a grant its
    /// caller never saw.
    pub(super) request_id: Option<RequestId>,
    /// Granted to a wait whose caller has not come back since a new
    /// leadership: released at this time unless it does.
    pub(super) attach_by: Option<Time>,
    /// The wait's attempt number when it was granted, moved on by every
    /// attempt that comes back for the grant (see [`Waiter::attempt`]).
    pub(super) attempt: u64,
}

/// How a [`Holding`] is written: its fields one after another, as they were
/// before the wait's part moved behind a pointer. The snapshot format.
#[derive(Serialize, Deserialize)]
struct HoldingForm {
    lease: LeaseId,
    fence: Fence,
    mode: Mode,
    lock_delay_ms: u64,
    from_wait: Option<RequestId>,
    attach_by: Option<Time>,
    attempt: u64,
}

impl From<HoldingForm> for Holding {
    fn from(f: HoldingForm) -> Self {
        let waited = f.from_wait.is_some() || f.attach_by.is_some() || f.attempt != 0;
        Holding {
            lease: f.lease,
            fence: f.fence,
            mode: f.mode,
            lock_delay_ms: f.lock_delay_ms,
            wait: waited.then(|| {
                Box::new(WaitGrant {
                    request_id: f.from_wait,
                    attach_by: f.attach_by,
                    attempt: f.attempt,
                })
            }),
        }
    }
}

impl From<Holding> for HoldingForm {
    fn from(h: Holding) -> Self {
        HoldingForm {
            lease: h.lease,
            fence: h.fence,
            mode: h.mode,
            lock_delay_ms: h.lock_delay_ms,
            from_wait: h.wait_request(),
            attach_by: h.attach_by(),
            attempt: h.attempt(),
        }
    }
}

impl Holding {
    /// A newcomer's hold, its fence not yet set.
    pub(super) fn new(lease: LeaseId, mode: Mode, lock_delay_ms: u64) -> Self {
        Holding {
            lease,
            fence: 0,
            mode,
            lock_delay_ms,
            wait: None,
        }
    }

    /// A hold granted with `fence`, to a queued wait if `wait` says so.
    pub(super) fn granted(
        lease: LeaseId,
        fence: Fence,
        mode: Mode,
        lock_delay_ms: u64,
        wait: Option<WaitGrant>,
    ) -> Self {
        Holding {
            lease,
            fence,
            mode,
            lock_delay_ms,
            wait: wait.map(Box::new),
        }
    }

    /// The request id of the wait this was granted to, if it was.
    pub(super) fn wait_request(&self) -> Option<RequestId> {
        self.wait.as_ref().and_then(|w| w.request_id)
    }

    /// When this grant is taken back unless its wait's caller comes back.
    pub(super) fn attach_by(&self) -> Option<Time> {
        self.wait.as_ref().and_then(|w| w.attach_by)
    }

    /// The attempt of the wait this was granted to (0: not to a wait).
    pub(super) fn attempt(&self) -> u64 {
        self.wait.as_ref().map_or(0, |w| w.attempt)
    }

    /// Refuses the lease that holds `key` with this hold asking for it again
    /// in another `mode`: a reader asking to write would wait for itself.
    pub(super) fn check_again(&self, key: &str, mode: Mode) -> Result<(), LockError> {
        if self.mode == mode {
            return Ok(());
        }
        Err(LockError::invalid(
            "mode",
            format!(
                "lease {} already holds {key:?} as {}; release it before asking for it as {}",
                self.lease,
                self.mode.name(),
                mode.name()
            ),
        ))
    }

    /// The hold `waiter` is granted from its queue, its fence not yet set. A
    /// wait nobody has come back for since a new leadership keeps its
    /// re-attach deadline on the grant.
    pub(super) fn from_waiter(waiter: &Waiter) -> Self {
        Holding {
            lease: waiter.lease,
            fence: 0,
            mode: waiter.mode,
            lock_delay_ms: waiter.lock_delay_ms,
            wait: Some(Box::new(WaitGrant {
                request_id: Some(waiter.request_id),
                attach_by: waiter.attach_by,
                attempt: waiter.attempt,
            })),
        }
    }
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

impl Waiter {
    /// Refuses the lease whose wait for `key` this is coming back for it as
    /// a single key while it waits as part of a lock set, or in another `mode`.
    pub(super) fn check_again(&self, key: &str, mode: Mode) -> Result<(), LockError> {
        if let Some(set) = &self.set {
            return Err(LockError::invalid(
                "key",
                format!(
                    "lease {} waits for {key:?} as part of the set {:?}",
                    self.lease,
                    &set[..]
                ),
            ));
        }
        if self.mode != mode {
            return Err(LockError::invalid(
                "mode",
                format!(
                    "lease {} already waits for {key:?} as {}",
                    self.lease,
                    self.mode.name()
                ),
            ));
        }
        Ok(())
    }
}

/// What an acquire asks for, beside its lease and key.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ask {
    pub(super) wait_ms: u64,
    pub(super) lock_delay_ms: u64,
    pub(super) request_id: RequestId,
    pub(super) mode: Mode,
}
