//! Time in the table. [`Deadlines`] keeps when things fall due: four sets,
//! each in the order its entries come due, so finding what is due costs one
//! look at the front of each. Below it, the table takes in time: a new
//! leadership restamps every lease (lazily, see [`Restamp`]) and queued
//! wait, and what is due by a stamp is acted on. Those two call down into
//! the rules in `rules.rs` (ending a lease, withdrawing a wait, handing a
//! key on), which never call them.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::command::{Event, WaitEnd};
use crate::{LeaseId, Time};

use super::lock::Lease;
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
/// While a takeover's restamp is pending, a lease's entry may come before
/// its expiry: coming due then moves it ([`Restamp`]).
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

/// [`Deadlines`] as written with each lease's entry at its expiry, for a
/// table whose restamp is pending: the same fields, written the same way.
#[derive(Serialize)]
#[serde(rename = "Deadlines")]
pub(super) struct DeadlinesAt<'a> {
    leases: ExpiriesAt<'a>,
    waits: &'a BTreeSet<(Time, Arc<str>, LeaseId)>,
    delays: &'a BTreeSet<(Time, Arc<str>)>,
    attaches: &'a BTreeSet<(Time, Arc<str>, LeaseId)>,
}

/// The lease entries, the moved ones at their expiries: written as the set
/// of them would be, in order. Only the leases a pending restamp moves are
/// sorted apart; the rest are in order already.
struct ExpiriesAt<'a> {
    entries: &'a BTreeSet<(Time, LeaseId)>,
    /// (expiry, lease) of each lease whose entry is before its expiry, sorted.
    moved: &'a [(Time, LeaseId)],
    /// The same leases, sorted by id.
    moved_ids: &'a [LeaseId],
}

impl Serialize for ExpiriesAt<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = serializer.serialize_seq(Some(self.entries.len()))?;
        let mut moved = self.moved.iter().peekable();
        let kept = self
            .entries
            .iter()
            .filter(|(_, id)| self.moved_ids.binary_search(id).is_err());
        for entry in kept {
            while let Some(earlier) = moved.next_if(|m| *m < entry) {
                seq.serialize_element(earlier)?;
            }
            seq.serialize_element(entry)?;
        }
        for later in moved {
            seq.serialize_element(later)?;
        }
        seq.end()
    }
}

impl Deadlines {
    /// These deadlines, to be written with the leases in `moved` (sorted;
    /// `moved_ids` the same leases by id) at the expiries it gives.
    pub(super) fn with_moved<'a>(
        &'a self,
        moved: &'a [(Time, LeaseId)],
        moved_ids: &'a [LeaseId],
    ) -> DeadlinesAt<'a> {
        DeadlinesAt {
            leases: ExpiriesAt {
                entries: &self.leases,
                moved,
                moved_ids,
            },
            waits: &self.waits,
            delays: &self.delays,
            attaches: &self.attaches,
        }
    }

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

    /// How many lease deadlines are due by `now`.
    pub(super) fn leases_due(&self, now: Time) -> usize {
        self.leases
            .iter()
            .take_while(|(deadline, _)| *deadline <= now)
            .count()
    }

    /// The latest lease deadline.
    pub(super) fn last_lease(&self) -> Option<Time> {
        self.leases.last().map(|d| d.0)
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

    /// Every key with a queued wait or a re-attach window: the keys whose
    /// waits a new leadership detaches.
    pub(super) fn keys_waited_on(&self) -> BTreeSet<Arc<str>> {
        let waits = self.waits.iter().map(|(_, key, _)| key.clone());
        let attaches = self.attaches.iter().map(|(_, key, _)| key.clone());
        waits.chain(attaches).collect()
    }

    /// About how many steps a new leadership's restamp takes: one for each
    /// queued wait and re-attach window.
    pub(super) fn restamp_work(&self) -> usize {
        self.waits.len() + self.attaches.len()
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

/// A takeover's restamp, kept instead of applied to every lease at once.
///
/// A new leadership gives every live lease a full TTL from its first stamp
/// (`at`). Walking a million leases to say so would hold every node for
/// most of a second, so the table keeps this instead: a lease expires at
/// the later of its own deadline and `at` plus its TTL ([`Restamp::expiry`]).
/// A lease whose own deadline is the earlier one is moved to the later when
/// that deadline comes due; a renewal moves it past both. By `settled_by`,
/// the latest deadline any lease had at the takeover, every lease carries
/// the deadline in effect, and the restamp is dropped.
///
/// Nothing of it is persisted: the snapshot writes each lease's deadline as
/// it is in effect, which is what a table that walked every lease at the
/// takeover would write, so tables, snapshots and their hashes agree with
/// such a table, and with one that loaded a snapshot, at every index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Restamp {
    /// The takeover's first stamp.
    pub(super) at: Time,
    /// No lease's own deadline is both before its expiry and after this.
    pub(super) settled_by: Time,
}

impl Restamp {
    /// When `lease` expires: its own deadline, or a full TTL after the
    /// takeover if that is later.
    pub(super) fn expiry(restamped: Option<Restamp>, lease: &Lease) -> Time {
        match restamped {
            Some(r) => lease.deadline.max(r.at.saturating_add(lease.ttl_ms)),
            None => lease.deadline,
        }
    }
}

impl LockTable {
    /// A new leader gives every live lease its full TTL again, and gives every
    /// queued wait [`REATTACH_MS`] for its caller to come back: the calls that
    /// were waiting were connections to the old leader, and are gone.
    ///
    /// The leases are restamped lazily ([`Restamp`]); the waits are found
    /// through their deadlines. So a takeover costs a step for each queued
    /// wait and re-attach window, not for each lease and key.
    pub(super) fn restamp(&mut self, now: Time) {
        self.restamp_leases(now);
        let until = now.saturating_add(REATTACH_MS);
        let state = &mut self.state;
        let keys = state.deadlines.keys_waited_on();
        state.deadlines.clear_attaches();
        for key in keys {
            if let Some(lock) = state.locks.get_mut(&key) {
                lock.detach(until, |lease| {
                    state.deadlines.add_attach(until, key.clone(), lease);
                });
            }
        }
    }

    fn restamp_leases(&mut self, now: Time) {
        #[cfg(feature = "planted-bugs")]
        if crate::planted::is(crate::planted::TableBug::ForgetRenewals) {
            self.settle();
            for lease in self.state.leases.values_mut() {
                lease.deadline = lease.deadline.saturating_sub(lease.ttl_ms);
            }
            let expiries = self.state.leases.iter().map(|(id, l)| (l.deadline, *id));
            self.state.deadlines.reset_leases(expiries);
            return;
        }
        // Every live lease's deadline is at most the last one in the set,
        // however many restamps are still pending.
        self.restamped = self.state.deadlines.last_lease().map(|settled_by| Restamp {
            at: now,
            settled_by,
        });
    }

    /// When `lease` expires, with any pending restamp.
    pub(super) fn expiry(&self, lease: &Lease) -> Time {
        Restamp::expiry(self.restamped, lease)
    }

    /// Gives every lease the deadline in effect and drops the pending
    /// restamp: the table a takeover that walked every lease would have left.
    pub(super) fn settle(&mut self) {
        let restamped = self.restamped.take();
        if restamped.is_none() {
            return;
        }
        for lease in self.state.leases.values_mut() {
            lease.deadline = Restamp::expiry(restamped, lease);
        }
        let expiries = self.state.leases.iter().map(|(id, l)| (l.deadline, *id));
        self.state.deadlines.reset_leases(expiries);
    }

    /// A lease that came due by its own deadline, moved to the later one a
    /// pending restamp gives it. Returns whether it moved.
    fn catch_up(&mut self, id: LeaseId) -> bool {
        let restamped = self.restamped;
        let Some(lease) = self.state.leases.get_mut(&id) else {
            return false;
        };
        let expiry = Restamp::expiry(restamped, lease);
        if expiry <= lease.deadline {
            return false;
        }
        self.state.deadlines.remove_lease(lease.deadline, id);
        lease.deadline = expiry;
        self.state.deadlines.add_lease(expiry, id);
        true
    }

    /// Moves table time to `now` and acts on everything due by then, in
    /// order: leases expire, waits time out, lock-delays end, re-attach
    /// windows run out, and old answers are forgotten.
    pub(super) fn advance(&mut self, now: Time, events: &mut Vec<Event>) {
        self.state.now = now;
        while let Some(id) = self.state.deadlines.lease_due(now) {
            if self.catch_up(id) {
                continue;
            }
            self.end_lease(id, true, events);
            events.push(Event::LeaseExpired { lease: id });
        }
        if self.restamped.is_some_and(|r| r.settled_by <= now) {
            // Every lease live at the takeover has come due or been renewed.
            self.restamped = None;
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
