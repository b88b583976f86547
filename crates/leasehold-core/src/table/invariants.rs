//! The table's internal consistency, checked by the tests after every step:
//! the indexes agree with the locks, no queue keeps a waiter it could grant,
//! and every count matches what it counts.

use std::collections::BTreeSet;

use crate::command::Mode;

use super::LockTable;

impl LockTable {
    /// Checks the table's internal consistency; used by tests.
    pub fn check_invariants(&self) -> Result<(), String> {
        for (key, lock) in &self.state.locks {
            if lock.is_empty() {
                return Err(format!("empty lock entry {key:?} kept"));
            }
            if lock.holder.is_none() && lock.holder_count() > 0 {
                return Err(format!("{key:?} has holders but no first holder"));
            }
            let mut leases_here = BTreeSet::new();
            for h in lock.holders() {
                let lease = self
                    .state
                    .leases
                    .get(&h.lease)
                    .ok_or(format!("{key:?} held by dead lease {}", h.lease))?;
                if !lease.held.contains(key) {
                    return Err(format!("lease {} does not know it holds {key:?}", h.lease));
                }
                if !leases_here.insert(h.lease) {
                    return Err(format!("lease {} holds {key:?} twice", h.lease));
                }
                if h.fence >= self.state.next_fence {
                    return Err(format!(
                        "{key:?} has fence {} >= next {}",
                        h.fence, self.state.next_fence
                    ));
                }
            }
            let modes: Vec<Mode> = lock.holders().map(|h| h.mode).collect();
            let fits = match modes.first() {
                None => true,
                Some(Mode::Exclusive) => modes.len() == 1,
                Some(Mode::Shared) => modes.iter().all(|m| *m == Mode::Shared),
                Some(first @ Mode::Permit { permits }) => {
                    modes.iter().all(|m| m == first) && modes.len() <= *permits as usize
                }
            };
            if !fits {
                return Err(format!(
                    "{key:?} has holders that exclude each other: {modes:?}"
                ));
            }
            if let Some(w) = lock.waiters().front() {
                let ready = match &w.set {
                    Some(set) => self.set_ready(set, w.lease),
                    None => lock.admits(w.mode) && lock.delayed_until().is_none(),
                };
                if ready {
                    return Err(format!("{key:?} keeps a waiter it could grant"));
                }
            }
            if lock.extra.is_some()
                && lock.holder_count() < 2
                && lock.waiters().is_empty()
                && lock.checkpoint().is_none()
                && lock.delayed_until().is_none()
            {
                return Err(format!("{key:?} keeps an empty extra part"));
            }
            for w in lock.waiters() {
                let lease = self
                    .state
                    .leases
                    .get(&w.lease)
                    .ok_or(format!("{key:?} has dead waiter {}", w.lease))?;
                if !lease.waiting.contains(key) {
                    return Err(format!(
                        "lease {} does not know it waits for {key:?}",
                        w.lease
                    ));
                }
                if !self.state.deadlines.has_wait(w.deadline, key, w.lease) {
                    return Err(format!(
                        "wait of {} on {key:?} has no deadline entry",
                        w.lease
                    ));
                }
            }
        }
        for (id, lease) in &self.state.leases {
            if lease.deadline <= self.state.now {
                return Err(format!("lease {id} is past its deadline but live"));
            }
            if let Some(r) = self.restamped {
                // Dropping the restamp at `settled_by` is safe only so.
                if lease.deadline < self.expiry(lease) && lease.deadline > r.settled_by {
                    return Err(format!("lease {id} waits for a restamp past its end"));
                }
            }
            if !self.state.deadlines.has_lease(lease.deadline, *id) {
                return Err(format!("lease {id} has no deadline entry"));
            }
            if !lease.held.is_in_one_form() || !lease.waiting.is_in_one_form() {
                return Err(format!("lease {id} keeps a set of one key as many"));
            }
            for key in &lease.held {
                let holds = self
                    .state
                    .locks
                    .get(key)
                    .is_some_and(|l| l.holding_of(*id).is_some());
                if !holds {
                    return Err(format!("lease {id} thinks it holds {key:?}"));
                }
            }
        }
        let mut detached = 0;
        for (key, lock) in &self.state.locks {
            let holder = lock
                .holders()
                .filter_map(|h| Some((h.attach_by()?, h.lease)));
            let waiters = lock
                .waiters()
                .iter()
                .filter_map(|w| Some((w.attach_by?, w.lease)));
            for (t, lease) in holder.chain(waiters) {
                detached += 1;
                if !self.state.deadlines.has_attach(t, key, lease) {
                    return Err(format!(
                        "detached {lease} on {key:?} has no attach deadline"
                    ));
                }
            }
        }
        if self.state.deadlines.attach_count() != detached {
            return Err("stray attach deadlines".into());
        }
        for (fence, set) in &self.state.sets {
            let mut leases = BTreeSet::new();
            for key in set.iter() {
                let holding = self
                    .state
                    .locks
                    .get(key)
                    .and_then(|l| l.holders().find(|h| h.fence == *fence))
                    .ok_or(format!("set {fence} is not held on {key:?}"))?;
                leases.insert(holding.lease);
            }
            if leases.len() != 1 {
                return Err(format!("set {fence} is held by several leases"));
            }
        }
        if self.state.deadlines.lease_count() != self.state.leases.len() {
            return Err("stray lease deadlines".into());
        }
        let waits: usize = self.state.locks.values().map(|l| l.waiters().len()).sum();
        if self.state.deadlines.wait_count() != waits {
            return Err("stray wait deadlines".into());
        }
        let held = self
            .state
            .locks
            .values()
            .filter(|l| l.holder.is_some())
            .count();
        if self.held_keys != held {
            return Err(format!(
                "{} keys counted as held, {held} held",
                self.held_keys
            ));
        }
        let mut owned = std::collections::BTreeMap::new();
        for lease in self.state.leases.values() {
            super::Owned::count(&mut owned, lease.owner, |o| {
                o.leases += 1;
                o.keys += lease.held.len();
                o.waits += lease.waiting.len();
            });
        }
        if self.owned != owned {
            return Err(format!(
                "counted per token {:?}, owned {owned:?}",
                self.owned
            ));
        }
        Ok(())
    }
}
