//! The rules that change the table's locks. They stay in one file because
//! they call one another: a freed key's queue moves on, the queue grants,
//! and the grant is remembered as the answer to the request that waited.
//! Three files call down into these rules and are never called by them:
//! `leases.rs` (a lease that ends frees its keys and withdraws its waits),
//! `deadlines.rs`, which takes in each stamp (the restamp of a new
//! leadership, then what is due), and `sets.rs`, which asks for lock sets.
//! The data walked over keeps its own invariants (`lock.rs`,
//! `deadlines.rs`); the look-ups and refusals are in `lookup.rs`.
//!
//! Time (taken in by `deadlines.rs`):
//! - a new leader restamps every lease to its full TTL, and gives every
//!   queued wait (and every grant to a wait nobody came back for)
//!   `REATTACH_MS` for its caller to come back, before anything expires;
//! - what is due then goes in this order: leases, waits that time out,
//!   lock-delays that end, re-attach windows that run out, and answers older
//!   than `DEDUPE_WINDOW_MS` or beyond `DEDUPE_CAPACITY`;
//! - a wait that times out is withdrawn, and those behind it may be granted;
//! - a key whose lock-delay ends goes to the next in its queue;
//! - a wait nobody came back for in time is withdrawn, and a grant made to it
//!   is released and its remembered answer forgotten.
//!
//! Locks:
//! - a key is one kind while anyone holds or waits for it, a lock or a
//!   semaphore of one size; asking for it as another is refused;
//! - a newcomer takes a key only when nobody waits for it, it is not in
//!   lock-delay, and its holders admit the mode (none for an exclusive hold,
//!   only readers for a reader, fewer than its permits for a semaphore);
//! - every grant gets a fresh fencing token from the one sequence, which
//!   only increases;
//! - acquiring a key the lease holds answers with the hold it has; asking for
//!   it in another mode is refused;
//! - acquiring a key the lease waits for is coming back for the wait, a new
//!   attempt; in another mode, or for a key it waits for in a set, it is
//!   refused;
//! - a busy key is refused to an acquire that does not wait, and an acquire
//!   that waits joins the back of its queue;
//! - a queue is granted first-come first-served, in the step that frees the
//!   key: one writer, or every reader up to the next writer, or waiters up to
//!   a semaphore's permits;
//! - a grant from the queue is remembered as the answer to the wait's
//!   request id;
//! - a retry with the same request id gets the first answer, and an
//!   acquire's retry re-attaches its wait; another request under the same id
//!   is refused; an acquire is remembered only once granted, and a refusal
//!   never;
//! - a release is checked against the token (one that holds nothing is a
//!   `StaleFence`), releases every key of a set held with it, and hands each
//!   freed key on;
//! - a checkpoint is saved only with a holder's token; an empty one clears it;
//! - cancelling a wait acts only for the attempt the wait belongs to (0: any):
//!   it withdraws the wait, or takes back the grant the wait got and forgets
//!   its answer.
//!
//! Lock sets:
//! - a set is granted only when its wait is first in line on every key and
//!   every key is free (no holder, no lock-delay), all keys at once with one
//!   token; until then it holds each key's line;
//! - a set's wait stands in every key's queue, and withdrawing it from one
//!   key withdraws it from all.

use std::sync::Arc;

use crate::command::{Checkpoint, Event, Grant, Mode, Response, WaitEnd};
use crate::{Fence, LeaseId, RequestId, Time};

use super::answers::{Asked, Caller};
use super::lock::{Ask, Holding, Lock, Set, WaitGrant, Waiter};
use super::{LockTable, Outcome, Owned};

impl LockTable {
    // ---- time ----

    /// Nobody came back for `lease`'s wait on `key` after a new leadership:
    /// withdraw the wait, or take back the grant it turned into.
    pub(super) fn abandon(&mut self, key: &Arc<str>, lease: LeaseId, events: &mut Vec<Event>) {
        let Some(lock) = self.state.locks.get(key) else {
            self.state.deadlines.forget_attach(key, lease);
            return;
        };
        if let Some(h) = lock.holding_of(lease).filter(|h| h.attach_by().is_some()) {
            let (fence, request_id) = (h.fence, h.wait_request().unwrap_or(0));
            // Clears the deadline entry with the holding.
            let _ = self.release(key, fence, events);
            self.forget(Caller::Lease(lease), request_id);
        } else if !self.withdraw(key, lease, WaitEnd::Abandoned, true, events) {
            self.state.deadlines.forget_attach(key, lease);
        }
    }

    // ---- locks ----

    pub(super) fn acquire_once(
        &mut self,
        lease_id: LeaseId,
        key: &str,
        (wait_ms, lock_delay_ms): (u64, u64),
        request_id: RequestId,
        mode: Mode,
        events: &mut Vec<Event>,
    ) -> Outcome {
        // A retry after the lease ended is told so, not handed a dead grant.
        self.live_lease(lease_id)?;
        let ask = Ask {
            wait_ms,
            lock_delay_ms,
            request_id,
            mode,
        };
        if request_id == 0 {
            return self.acquire(lease_id, key, ask, events);
        }
        let caller = Caller::Lease(lease_id);
        let asked = Asked::Acquire {
            key: key.into(),
            mode,
        };
        if let Some(first) = self.recall(caller, request_id, &asked)? {
            self.reattach(key, lease_id);
            return Ok(first);
        }
        let response = self.acquire(lease_id, key, ask, events)?;
        // A queued answer is not final: the grant is remembered when it comes.
        if let Response::Acquired(_) = &response {
            self.remember(caller, request_id, asked, response.clone());
        }
        Ok(response)
    }

    /// The caller of `lease`'s wait (or of the grant it turned into) on `key`
    /// came back: it is no longer withdrawn after a new leadership, and this
    /// is its newest attempt. Returns the attempt's number (0: no wait).
    pub(super) fn reattach(&mut self, key: &str, lease_id: LeaseId) -> u64 {
        let Some(key) = self.state.locks.get_key_value(key).map(|(k, _)| k.clone()) else {
            return 0;
        };
        let Some(lock) = self.state.locks.get_mut(&key) else {
            return 0;
        };
        let (cleared, attempt) = lock.reattach(lease_id);
        if let Some(t) = cleared {
            self.state.deadlines.remove_attach(t, &key, lease_id);
        }
        attempt
    }

    fn acquire(
        &mut self,
        lease_id: LeaseId,
        key: &str,
        ask: Ask,
        events: &mut Vec<Event>,
    ) -> Outcome {
        // Validated by `acquire_once`, its only caller.
        let lease = self.live_lease(lease_id)?;
        let lock = self.state.locks.get(key);
        if let Some(lock) = lock {
            lock.check_kind(key, ask.mode)?;
        }
        if lease.held.contains(key) {
            // Acquiring what you already hold is answered with the hold you
            // have, if you ask for it in the same mode.
            let holding = lock.and_then(|l| l.holding_of(lease_id));
            if let Some(h) = holding {
                h.check_again(key, ask.mode)?;
            }
            let fence = holding.map_or(0, |h| h.fence);
            let checkpoint = lock.and_then(|l| l.checkpoint().cloned());
            self.reattach(key, lease_id);
            return Ok(Response::Acquired(Grant {
                lease: lease_id,
                fence,
                checkpoint,
            }));
        }
        if lease.waiting.contains(key) {
            let waiting = lock.and_then(|l| {
                l.waiters()
                    .iter()
                    .enumerate()
                    .find(|(_, w)| w.lease == lease_id)
            });
            if let Some((_, w)) = waiting {
                w.check_again(key, ask.mode)?;
            }
            let position = waiting.map_or(0, |(at, _)| at);
            // Asking again for a wait is coming back for it.
            let attempt = self.reattach(key, lease_id);
            return Ok(Response::Queued {
                lease: lease_id,
                position,
                attempt,
            });
        }
        let now = self.state.now;
        match lock {
            None => {}
            Some(lock) if lock.free_for(ask.mode) => {}
            Some(lock) => {
                if ask.wait_ms == 0 {
                    return Err(self.busy_error(key, lock));
                }
                let key = self.shared_key(key);
                let position = self.enqueue(
                    key,
                    Waiter {
                        lease: lease_id,
                        mode: ask.mode,
                        set: None,
                        deadline: now.saturating_add(ask.wait_ms),
                        lock_delay_ms: ask.lock_delay_ms,
                        request_id: ask.request_id,
                        attach_by: None,
                        attempt: 1,
                    },
                );
                return Ok(Response::Queued {
                    lease: lease_id,
                    position,
                    attempt: 1,
                });
            }
        }
        let key = self.shared_key(key);
        let holding = Holding::new(lease_id, ask.mode, ask.lock_delay_ms);
        let grant = self.grant_lock(&key, holding, events);
        Ok(Response::Acquired(grant))
    }

    /// Puts `waiter` at the back of `key`'s queue, with its deadline and in
    /// its lease's waits: the one way a wait joins a queue (a lock set's
    /// joins each of its keys' this way). The place it took, from 0.
    pub(super) fn enqueue(&mut self, key: Arc<str>, waiter: Waiter) -> usize {
        let (lease_id, deadline) = (waiter.lease, waiter.deadline);
        let lock = self.state.locks.entry(key.clone()).or_default();
        let position = lock.waiters().len();
        lock.enqueue(waiter);
        self.state
            .deadlines
            .add_wait(deadline, key.clone(), lease_id);
        if let Some(lease) = self.state.leases.get_mut(&lease_id) {
            if lease.waiting.insert(key) {
                Owned::count(&mut self.owned, lease.owner, |o| o.waits += 1);
            }
        }
        position
    }

    /// Adds `holding` (its fence not yet set) to a key that admits it, with
    /// a fresh token.
    fn grant_lock(
        &mut self,
        key: &Arc<str>,
        mut holding: Holding,
        events: &mut Vec<Event>,
    ) -> Grant {
        holding.fence = self.state.new_fence();
        let (lease, fence) = (holding.lease, holding.fence);
        let checkpoint = self.add_hold(key, holding, events);
        Grant {
            lease,
            fence,
            checkpoint,
        }
    }

    /// Adds `holding` (its fence set) to `key`, counts the key as held if it
    /// was not, indexes it under its lease, and tells of the grant. Returns
    /// the key's checkpoint, which the event carries to the new holder.
    fn add_hold(
        &mut self,
        key: &Arc<str>,
        holding: Holding,
        events: &mut Vec<Event>,
    ) -> Option<Checkpoint> {
        let (lease_id, fence) = (holding.lease, holding.fence);
        let lock = self.state.locks.entry(key.clone()).or_default();
        self.held_keys += usize::from(lock.holder.is_none());
        lock.add_holding(holding);
        lock.shrink();
        let checkpoint = lock.checkpoint().cloned();
        let holder = match self.state.leases.get_mut(&lease_id) {
            Some(lease) => {
                if lease.held.insert(key.clone()) {
                    Owned::count(&mut self.owned, lease.owner, |o| o.keys += 1);
                }
                lease.holder.clone()
            }
            None => Arc::from(""),
        };
        events.push(Event::Acquired {
            key: key.clone(),
            fence,
            lease: lease_id,
            holder,
            checkpoint: checkpoint.clone(),
        });
        checkpoint
    }

    /// Hands a key to those first in its queue that its holders admit, in
    /// the same step that freed it: one writer, or every reader up to the
    /// next writer, or waiters up to a semaphore's permits.
    pub(super) fn advance_queue(&mut self, key: &Arc<str>, events: &mut Vec<Event>) {
        loop {
            let Some(lock) = self.state.locks.get_mut(key) else {
                return;
            };
            if lock.delayed_until().is_some() {
                return;
            }
            // A set's wait first in line is granted every key at once, when
            // it is first on all of them and all are free; until then it
            // holds this key's line.
            if let Some((lease, set)) = lock
                .waiters()
                .front()
                .and_then(|w| Some((w.lease, w.set.clone()?)))
            {
                if !self.set_ready(&set, lease) {
                    return;
                }
                self.grant_set_from_queue(&set, lease, events);
                continue;
            }
            let Some(waiter) = lock.pop_admitted() else {
                self.drop_if_empty(key);
                return;
            };
            self.left_queue(key, &waiter);
            // A waiter nobody has come back for since a new leadership keeps
            // its attach deadline (and its entry) on the grant.
            let grant = self.grant_lock(key, Holding::from_waiter(&waiter), events);
            self.remember(
                Caller::Lease(waiter.lease),
                waiter.request_id,
                Asked::Acquire {
                    key: key.clone(),
                    mode: waiter.mode,
                },
                Response::Acquired(grant),
            );
        }
    }

    // ---- lock sets ----

    /// Takes a ready set wait out of every queue and grants it.
    fn grant_set_from_queue(&mut self, set: &Set, lease_id: LeaseId, events: &mut Vec<Event>) {
        let mut attach = Vec::with_capacity(set.len());
        let (mut lock_delay_ms, mut request_id, mut attempt) = (0, 0, 0);
        for key in set.iter() {
            let Some(waiter) = self.state.locks.get_mut(key).and_then(Lock::pop_first) else {
                continue;
            };
            self.left_queue(key, &waiter);
            (lock_delay_ms, request_id, attempt) =
                (waiter.lock_delay_ms, waiter.request_id, waiter.attempt);
            attach.push(waiter.attach_by);
        }
        let grant = self.grant_set(
            set,
            lease_id,
            lock_delay_ms,
            |i| attach.get(i).copied().flatten(),
            Some((request_id, attempt)),
            events,
        );
        self.remember(
            Caller::Lease(lease_id),
            request_id,
            Asked::AcquireSet { keys: set.clone() },
            Response::Acquired(grant),
        );
    }

    /// Gives every key of a set (each free) to a lease, with one fresh token.
    /// `attach_by(i)` is the attach deadline carried over to the i-th key.
    pub(super) fn grant_set(
        &mut self,
        set: &Set,
        lease_id: LeaseId,
        lock_delay_ms: u64,
        attach_by: impl Fn(usize) -> Option<Time>,
        from_wait: Option<(RequestId, u64)>,
        events: &mut Vec<Event>,
    ) -> Grant {
        let fence = self.state.new_fence();
        for (i, key) in set.iter().enumerate() {
            let wait = from_wait.map(|(id, attempt)| WaitGrant {
                request_id: Some(id),
                attach_by: attach_by(i),
                attempt,
            });
            let holding = Holding::granted(lease_id, fence, Mode::Exclusive, lock_delay_ms, wait);
            self.add_hold(key, holding, events);
        }
        self.state.sets.insert(fence, set.clone());
        Grant {
            lease: lease_id,
            fence,
            checkpoint: None,
        }
    }

    /// Ends `lease_id`'s wait for `key` (for every key of its set, if it is a
    /// set's), telling why; with `advance`, hands each key to whoever is next.
    /// False if it was not waiting.
    pub(super) fn withdraw(
        &mut self,
        key: &Arc<str>,
        lease_id: LeaseId,
        reason: WaitEnd,
        advance: bool,
        events: &mut Vec<Event>,
    ) -> bool {
        let Some(waiter) = self.take_waiter(key, lease_id) else {
            return false;
        };
        let mut keys = vec![key.clone()];
        for other in waiter.set.iter().flat_map(|s| s.iter()) {
            if other != key && self.take_waiter(other, lease_id).is_some() {
                keys.push(other.clone());
            }
        }
        for k in &keys {
            events.push(Event::WaitEnded {
                key: k.clone(),
                lease: lease_id,
                reason,
            });
        }
        for k in &keys {
            if advance {
                self.advance_queue(k, events);
            } else {
                self.drop_if_empty(k);
            }
        }
        true
    }

    /// Takes a lease's wait out of one key's queue, with its deadlines.
    fn take_waiter(&mut self, key: &Arc<str>, lease_id: LeaseId) -> Option<Waiter> {
        let waiter = self.state.locks.get_mut(key)?.take_waiter(lease_id)?;
        self.left_queue(key, &waiter);
        if let Some(t) = waiter.attach_by {
            self.state.deadlines.remove_attach(t, key, lease_id);
        }
        Some(waiter)
    }

    /// `waiter` left `key`'s queue: its timeout and its lease's index entry go.
    fn left_queue(&mut self, key: &Arc<str>, waiter: &Waiter) {
        let state = &mut self.state;
        state
            .deadlines
            .remove_wait(waiter.deadline, key, waiter.lease);
        if let Some(lease) = state.leases.get_mut(&waiter.lease) {
            if lease.waiting.remove(key) {
                Owned::count(&mut self.owned, lease.owner, |o| {
                    o.waits = o.waits.saturating_sub(1)
                });
            }
        }
    }

    fn drop_if_empty(&mut self, key: &Arc<str>) {
        if self.state.locks.get(key).is_some_and(Lock::is_empty) {
            self.state.locks.remove(key);
        }
    }

    pub(super) fn cancel_wait(
        &mut self,
        lease_id: LeaseId,
        key: &str,
        request_id: RequestId,
        attempt: u64,
        events: &mut Vec<Event>,
    ) -> Outcome {
        let Some((key, lock)) = self.state.locks.get_key_value(key) else {
            return Ok(Response::WaitCancelled);
        };
        let key = key.clone();
        // Only the attempt the wait now belongs to withdraws it (0: any).
        let its_attempt = |a: u64| attempt == 0 || attempt == a;
        let granted_to_this_wait = lock
            .holding_of(lease_id)
            .filter(|h| h.wait_request() == Some(request_id))
            .map(|h| (h.fence, h.attempt()));
        if let Some((fence, granted_in)) = granted_to_this_wait {
            if its_attempt(granted_in) {
                self.release(&key, fence, events)?;
                // A retry of this wait must not be answered with the grant taken back.
                self.forget(Caller::Lease(lease_id), request_id);
            }
        } else if lock
            .waiters()
            .iter()
            .any(|w| w.lease == lease_id && its_attempt(w.attempt))
        {
            self.withdraw(&key, lease_id, WaitEnd::Cancelled, true, events);
        }
        Ok(Response::WaitCancelled)
    }

    fn release(&mut self, key: &str, fence: Fence, events: &mut Vec<Event>) -> Outcome {
        self.held_by(key, fence)?;
        // A set is released together, by any of its keys.
        let keys: Vec<Arc<str>> = match self.state.sets.remove(&fence) {
            Some(set) => set.to_vec(),
            None => vec![Arc::from(key)],
        };
        for k in &keys {
            self.release_one(k, fence, events)?;
        }
        for k in &keys {
            self.advance_queue(k, events);
        }
        Ok(Response::Released)
    }

    /// Frees one key held with `fence`, without handing it on.
    fn release_one(&mut self, key: &str, fence: Fence, events: &mut Vec<Event>) -> Outcome {
        let (key, holding) = self.held_by(key, fence)?;
        let (key, lease_id, attach_by) = (key.clone(), holding.lease, holding.attach_by());
        if let Some(t) = attach_by {
            self.state.deadlines.remove_attach(t, &key, lease_id);
        }
        let holder = match self.state.leases.get_mut(&lease_id) {
            Some(lease) => {
                if lease.held.remove(&key) {
                    Owned::count(&mut self.owned, lease.owner, |o| {
                        o.keys = o.keys.saturating_sub(1)
                    });
                }
                lease.holder.clone()
            }
            None => Arc::from(""),
        };
        if let Some(lock) = self.state.locks.get_mut(&key) {
            if lock.take_holding(lease_id).is_some() && lock.holder.is_none() {
                self.held_keys = self.held_keys.saturating_sub(1);
            }
        }
        events.push(Event::Released {
            key: key.clone(),
            fence,
            lease: lease_id,
            holder,
        });
        Ok(Response::Released)
    }

    pub(super) fn save_checkpoint(
        &mut self,
        key: &str,
        fence: Fence,
        data: Vec<u8>,
        events: &mut Vec<Event>,
    ) -> Outcome {
        let (key, holding) = self.held_by(key, fence)?;
        let (key, lease) = (key.clone(), holding.lease);
        let data: Arc<[u8]> = data.into();
        if let Some(lock) = self.state.locks.get_mut(&key) {
            let data = data.clone();
            lock.set_checkpoint((!data.is_empty()).then_some(Checkpoint { data, fence }));
        }
        let holder = self.holder_name(lease);
        events.push(Event::CheckpointSaved {
            key,
            fence,
            lease,
            holder,
            data,
        });
        Ok(Response::CheckpointSaved)
    }

    // ---- retries ----

    pub(super) fn release_once(
        &mut self,
        key: &str,
        fence: Fence,
        request_id: RequestId,
        events: &mut Vec<Event>,
    ) -> Outcome {
        if request_id == 0 {
            return self.release(key, fence, events);
        }
        let caller = Caller::Hold(fence);
        let asked = Asked::Release { key: key.into() };
        if let Some(first) = self.recall(caller, request_id, &asked)? {
            return Ok(first);
        }
        let response = self.release(key, fence, events)?;
        self.remember(caller, request_id, asked, response.clone());
        Ok(response)
    }
}
