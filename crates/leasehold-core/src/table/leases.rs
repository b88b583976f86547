//! The rules for leases: granting, keeping alive, revoking and ending them.
//! Ending a lease calls down into the lock rules (`rules.rs`) to withdraw its
//! waits and hand its keys on; they never call back up.
//!
//! - a lease gets the next id, never reused, and a deadline a TTL after table
//!   time; a keep-alive restarts the full TTL from table time;
//! - a lease that is gone is `LeaseExpired` if it was ever handed out and
//!   `LeaseNotFound` if not, whatever asks;
//! - ending a lease withdraws its waits, frees every key it holds (a held set
//!   with them), and hands each freed key on in the same step;
//! - an expired hold's key is delayed by its lock-delay; a revoked or
//!   released one is free at once;
//! - a revoke answers with the keys it released; an expiry tells of each key
//!   as expired;
//! - a grant-and-acquire is refused before its lease is granted, so a refusal
//!   leaves no lease behind.

use std::collections::btree_map::Entry;
use std::sync::Arc;

use crate::auth::TokenId;
use crate::command::{Event, Mode, Response, WaitEnd};
use crate::{LeaseId, RequestId};

use super::answers::{Asked, Caller};
use super::lock::Lease;
use super::{LockTable, Outcome, Owned};

impl LockTable {
    /// Hands out a new lease, with a deadline a TTL after table time.
    fn grant(&mut self, ttl_ms: u64, holder: Arc<str>, owner: Option<TokenId>) -> LeaseId {
        let id = self.state.next_lease;
        self.state.next_lease += 1;
        let deadline = self.state.now.saturating_add(ttl_ms);
        let lease = Lease::new(holder, ttl_ms, deadline, owner);
        Owned::count(&mut self.owned, owner, |o| o.leases += 1);
        self.state.leases.insert(id, lease);
        self.state.deadlines.add_lease(deadline, id);
        id
    }

    pub(super) fn grant_once(
        &mut self,
        ttl_ms: u64,
        holder: String,
        request_id: RequestId,
        owner: Option<TokenId>,
    ) -> Outcome {
        let holder: Arc<str> = holder.into();
        let asked = Asked::Grant {
            ttl_ms,
            holder: holder.clone(),
        };
        let caller = owner.map_or(Caller::Granting, Caller::GrantingAs);
        if let Some(first) = self.recall(caller, request_id, &asked)? {
            return Ok(first);
        }
        let lease = self.grant(ttl_ms, holder, owner);
        let response = Response::LeaseGranted { lease, ttl_ms };
        self.remember(caller, request_id, asked, response.clone());
        Ok(response)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn grant_and_acquire(
        &mut self,
        ttl_ms: u64,
        holder: String,
        key: &str,
        (wait_ms, lock_delay_ms): (u64, u64),
        request_id: RequestId,
        mode: Mode,
        owner: Option<TokenId>,
        events: &mut Vec<Event>,
    ) -> Outcome {
        let holder: Arc<str> = holder.into();
        let asked = Asked::GrantAndAcquire {
            ttl_ms,
            holder: holder.clone(),
            key: key.into(),
            mode,
        };
        let caller = owner.map_or(Caller::Granting, Caller::GrantingAs);
        if let Some(first) = self.recall(caller, request_id, &asked)? {
            // The retry goes on as the same acquire under the lease the first
            // answer made: the grant it got, or its place in the queue.
            let lease = match first {
                Response::Acquired(g) => g.lease,
                Response::Queued { lease, .. } => lease,
                other => return Ok(other),
            };
            return self.acquire_once(
                lease,
                key,
                (wait_ms, lock_delay_ms),
                request_id,
                mode,
                events,
            );
        }
        // Refuse before granting, so a refusal leaves no lease behind.
        if let Some(lock) = self.state.locks.get(key) {
            lock.check_kind(key, mode)?;
            if wait_ms == 0 && !lock.free_for(mode) {
                return Err(self.busy_error(key, lock));
            }
        }
        let lease = self.grant(ttl_ms, holder, owner);
        let response = self.acquire_once(
            lease,
            key,
            (wait_ms, lock_delay_ms),
            request_id,
            mode,
            events,
        )?;
        self.remember(caller, request_id, asked, response.clone());
        Ok(response)
    }

    pub(super) fn keep_alive(&mut self, id: LeaseId) -> Outcome {
        let now = self.state.now;
        let Some(lease) = self.state.leases.get_mut(&id) else {
            return Err(self.no_lease(id));
        };
        self.state.deadlines.remove_lease(lease.deadline, id);
        lease.deadline = now.saturating_add(lease.ttl_ms);
        self.state.deadlines.add_lease(lease.deadline, id);
        Ok(Response::Renewed {
            ttl_ms: lease.ttl_ms,
            key_count: lease.held.len() as u64,
        })
    }

    pub(super) fn revoke(&mut self, id: LeaseId, events: &mut Vec<Event>) -> Outcome {
        self.live_lease(id)?;
        let released = self.end_lease(id, false, events);
        Ok(Response::Revoked { released })
    }

    /// Ends a lease: withdraws its waits, frees its keys (with lock-delay when it
    /// expired), and hands each freed key to the next in line. Returns the
    /// keys it released when it was revoked (an expiry's go unreported).
    ///
    /// A lease may hold a million keys, and every replica frees them in one
    /// step on the thread that also answers heartbeats, so the common key
    /// (nobody waiting, no lock-delay) costs one walk down `locks`: found,
    /// freed and removed through the one entry, with no second look-up to
    /// hand it on and no copy of its name.
    pub(super) fn end_lease(
        &mut self,
        id: LeaseId,
        expired: bool,
        events: &mut Vec<Event>,
    ) -> Vec<String> {
        let Some(lease) = self.state.leases.remove(&id) else {
            return Vec::new();
        };
        Owned::count(&mut self.owned, lease.owner, |o| {
            o.leases = o.leases.saturating_sub(1);
            o.keys = o.keys.saturating_sub(lease.held.len());
            o.waits = o.waits.saturating_sub(lease.waiting.len());
        });
        self.state.deadlines.remove_lease(lease.deadline, id);
        for key in &lease.waiting {
            self.withdraw(key, id, WaitEnd::LeaseGone, false, events);
        }
        // An event for each key and wait, and one for the lease itself (an
        // expiry's, pushed by the caller). Grown by doubling instead, a
        // million of them were copied into fresh pages again and again:
        // most of the step's time, where the kernel zeroes new memory slowly.
        events.reserve(lease.held.len() + lease.waiting.len() + 1);
        let mut released = Vec::with_capacity(if expired { 0 } else { lease.held.len() });
        // Freed keys someone else still holds, waits for or may not take
        // yet (lock-delay): the queue decides what happens to them next.
        let mut handed_on = Vec::new();
        for key in &lease.held {
            let Entry::Occupied(mut entry) = self.state.locks.entry(key.clone()) else {
                continue;
            };
            let lock = entry.get_mut();
            let Some(holding) = lock.take_holding(id) else {
                continue;
            };
            if lock.holder.is_none() {
                self.held_keys = self.held_keys.saturating_sub(1);
            }
            // Every key of a set this lease held is released here too.
            if !self.state.sets.is_empty() {
                self.state.sets.remove(&holding.fence);
            }
            if let Some(t) = holding.attach_by() {
                self.state.deadlines.remove_attach(t, key, id);
            }
            let (key, fence, holder) = (key.clone(), holding.fence, lease.holder.clone());
            if expired {
                #[cfg(feature = "planted-bugs")]
                let delay = !crate::planted::is(crate::planted::TableBug::NoLockDelay);
                #[cfg(not(feature = "planted-bugs"))]
                let delay = true;
                if delay && holding.lock_delay_ms > 0 {
                    let until = self.state.now.saturating_add(holding.lock_delay_ms);
                    lock.delay_until(until);
                    self.state.deadlines.add_delay(until, key.clone());
                }
                events.push(Event::Expired {
                    key: key.clone(),
                    fence,
                    lease: id,
                    holder,
                });
            } else {
                released.push(key.to_string());
                events.push(Event::Released {
                    key: key.clone(),
                    fence,
                    lease: id,
                    holder,
                });
            }
            if lock.is_empty() {
                entry.remove();
            } else {
                handed_on.push(key);
            }
        }
        for key in lease.waiting.iter().chain(&handed_on) {
            self.advance_queue(key, events);
        }
        released
    }
}
