//! Time in the table. [`Deadlines`] keeps when things fall due: four sets,
//! each in the order its entries come due, so finding what is due costs one
//! look at the front of each. Below it, the table takes in time: a new
//! leadership restamps every lease and queued wait, and what is due by a
//! stamp is acted on. Those two call down into the rules in `rules.rs` (ending
//! a lease, withdrawing a wait, handing a key on), which never call them.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::command::{Event, WaitEnd};
use crate::{LeaseId, Time};

use super::{LockTable, REATTACH_MS};

/// Every deadline the table must act on: lease expiries, wait timeouts, the
/// ends of lock-delays, and the ends of re-attach windows after a new
/// leadership.
///
/// It records when things are due; it does not act on them. The rules that
/// act take the entry out (ending a lease removes its expiry, withdrawing a
/// wait its timeout), which is why the `*_due` look-ups leave the entry where
/// it is. The table keeps one entry here for each lease, each key a wait is
/// queued on, each key in lock-delay, and each wait or grant still waiting
/// for its caller to re-attach; its consistency check holds it to that.
///
/// In the snapshot it is its four sets, in the order of the fields below (the
/// order the table wrote them in before they were gathered here): changing
/// that order changes the snapshot format.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub(super) struct Deadlines {
    /// When each live lease expires: (deadline, lease).
    leases: BTreeSet<(Time, LeaseId)>,
    /// When each queued wait times out, one entry for each key it is queued
    /// on: (deadline, key, lease).
    waits: BTreeSet<(Time, Arc<str>, LeaseId)>,
    /// When keys leave their lock-delay: (until, key).
    delays: BTreeSet<(Time, Arc<str>)>,
    /// When waits (or grants to waits) that nobody re-attached after a new
    /// leadership are withdrawn: (deadline, key, lease).
    attaches: BTreeSet<(Time, Arc<str>, LeaseId)>,
}

impl Deadlines {
    /// The earliest time at which anything is due.
    pub(super) fn next(&self) -> Option<Time> {
        [
            self.leases.first().map(|d| d.0),
            self.waits.first().map(|d| d.0),
            self.delays.first().map(|d| d.0),
            self.attaches.first().map(|d| d.0),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// About how many keys acting on everything due by `now` touches: the
    /// keys and waits of each lease that expires (as `keys_of_lease` counts
    /// them), and one for each wait, lock-delay and re-attach window that
    /// runs out. Costs one step per entry due.
    pub(super) fn work_due(&self, now: Time, keys_of_lease: impl Fn(LeaseId) -> usize) -> usize {
        let due = |deadline: Time| deadline <= now;
        let leases: usize = self
            .leases
            .iter()
            .take_while(|(deadline, _)| due(*deadline))
            .map(|(_, id)| keys_of_lease(*id))
            .sum();
        leases
            + self.waits.iter().take_while(|d| due(d.0)).count()
            + self.delays.iter().take_while(|d| due(d.0)).count()
            + self.attaches.iter().take_while(|d| due(d.0)).count()
    }

    // ---- leases ----

    pub(super) fn add_lease(&mut self, deadline: Time, lease: LeaseId) {
        self.leases.insert((deadline, lease));
    }

    pub(super) fn remove_lease(&mut self, deadline: Time, lease: LeaseId) {
        self.leases.remove(&(deadline, lease));
    }

    /// Replaces every lease expiry with `expiries` (deadline, lease).
    pub(super) fn reset_leases(&mut self, expiries: impl IntoIterator<Item = (Time, LeaseId)>) {
        self.leases.clear();
        self.leases.extend(expiries);
    }

    /// The lease that expires first, if it is due by `now`. Left in place:
    /// ending the lease removes it.
    pub(super) fn lease_due(&self, now: Time) -> Option<LeaseId> {
        self.leases
            .first()
            .filter(|(deadline, _)| *deadline <= now)
            .map(|&(_, lease)| lease)
    }

    pub(super) fn has_lease(&self, deadline: Time, lease: LeaseId) -> bool {
        self.leases.contains(&(deadline, lease))
    }

    pub(super) fn lease_count(&self) -> usize {
        self.leases.len()
    }

    // ---- waits ----

    pub(super) fn add_wait(&mut self, deadline: Time, key: Arc<str>, lease: LeaseId) {
        self.waits.insert((deadline, key, lease));
    }

    pub(super) fn remove_wait(&mut self, deadline: Time, key: &Arc<str>, lease: LeaseId) {
        self.waits.remove(&(deadline, key.clone(), lease));
    }

    /// The wait that times out first, as (key, lease), if it is due by
    /// `now`. Left in place: withdrawing the wait removes it.
    pub(super) fn wait_due(&self, now: Time) -> Option<(Arc<str>, LeaseId)> {
        self.waits
            .first()
            .filter(|(deadline, _, _)| *deadline <= now)
            .map(|(_, key, lease)| (key.clone(), *lease))
    }

    pub(super) fn has_wait(&self, deadline: Time, key: &Arc<str>, lease: LeaseId) -> bool {
        self.waits.contains(&(deadline, key.clone(), lease))
    }

    /// How many waits are queued, counting a lock set's wait once per key.
    pub(super) fn wait_count(&self) -> usize {
        self.waits.len()
    }

    // ---- lock-delays ----

    pub(super) fn add_delay(&mut self, until: Time, key: Arc<str>) {
        self.delays.insert((until, key));
    }

    /// Takes out the key whose lock-delay ends first, if it ends by `now`.
    pub(super) fn pop_delay_due(&mut self, now: Time) -> Option<Arc<str>> {
        if self.delays.first().is_some_and(|(until, _)| *until <= now) {
            self.delays.pop_first().map(|(_, key)| key)
        } else {
            None
        }
    }

    // ---- re-attach windows ----

    pub(super) fn add_attach(&mut self, deadline: Time, key: Arc<str>, lease: LeaseId) {
        self.attaches.insert((deadline, key, lease));
    }

    pub(super) fn remove_attach(&mut self, deadline: Time, key: &Arc<str>, lease: LeaseId) {
        self.attaches.remove(&(deadline, key.clone(), lease));
    }

    /// Removes `lease`'s re-attach window on `key`, whatever its deadline.
    /// Walks every window: for a window whose wait or grant is already gone.
    pub(super) fn forget_attach(&mut self, key: &Arc<str>, lease: LeaseId) {
        self.attaches.retain(|(_, k, l)| !(k == key && *l == lease));
    }

    pub(super) fn clear_attaches(&mut self) {
        self.attaches.clear();
    }

    /// The re-attach window that runs out first, as (key, lease), if it is
    /// due by `now`. Left in place: withdrawing the wait, or releasing the
    /// grant, removes it.
    pub(super) fn attach_due(&self, now: Time) -> Option<(Arc<str>, LeaseId)> {
        self.attaches
            .first()
            .filter(|(deadline, _, _)| *deadline <= now)
            .map(|(_, key, lease)| (key.clone(), *lease))
    }

    pub(super) fn has_attach(&self, deadline: Time, key: &Arc<str>, lease: LeaseId) -> bool {
        self.attaches.contains(&(deadline, key.clone(), lease))
    }

    pub(super) fn attach_count(&self) -> usize {
        self.attaches.len()
    }
}

impl LockTable {
    /// A new leader gives every live lease its full TTL again, and gives every
    /// queued wait [`REATTACH_MS`] for its caller to come back: the calls that
    /// were waiting were connections to the old leader, and are gone.
    pub(super) fn restamp(&mut self, now: Time) {
        let state = &mut self.state;
        for lease in state.leases.values_mut() {
            #[cfg(feature = "planted-bugs")]
            if crate::planted::is(crate::planted::TableBug::ForgetRenewals) {
                lease.deadline = lease.deadline.saturating_sub(lease.ttl_ms);
                continue;
            }
            lease.deadline = now.saturating_add(lease.ttl_ms);
        }
        let expiries = state.leases.iter().map(|(id, l)| (l.deadline, *id));
        state.deadlines.reset_leases(expiries);
        let until = now.saturating_add(REATTACH_MS);
        state.deadlines.clear_attaches();
        for (key, lock) in state.locks.iter_mut() {
            lock.detach(until, |lease| {
                state.deadlines.add_attach(until, key.clone(), lease);
            });
        }
    }

    /// Moves table time to `now` and acts on everything due by then, in
    /// order: leases expire, waits time out, lock-delays end, re-attach
    /// windows run out, and old answers are forgotten.
    pub(super) fn advance(&mut self, now: Time, events: &mut Vec<Event>) {
        self.state.now = now;
        while let Some(id) = self.state.deadlines.lease_due(now) {
            self.end_lease(id, true, events);
            events.push(Event::LeaseExpired { lease: id });
        }
        while let Some((key, lease)) = self.state.deadlines.wait_due(now) {
            // Those behind it may be admitted now (readers behind a writer).
            self.withdraw(&key, lease, WaitEnd::TimedOut, true, events);
        }
        while let Some(key) = self.state.deadlines.pop_delay_due(now) {
            if let Some(lock) = self.state.locks.get_mut(&key) {
                lock.end_delay();
            }
            self.advance_queue(&key, events);
        }
        while let Some((key, lease)) = self.state.deadlines.attach_due(now) {
            self.abandon(&key, lease, events);
        }
        self.forget_old_answers(now);
    }
}
