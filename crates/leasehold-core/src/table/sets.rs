//! Asking for a lock set: several keys held with one token, granted all at
//! once. These rules call down into `rules.rs` (the checks on a lease and a
//! key, re-attaching a wait, granting a set) and nothing there calls them; a
//! set that waits is granted by its keys' queues, in `rules.rs`.
//!
//! - a set's keys are taken sorted, each once, and each is asked for
//!   exclusively;
//! - a retry with the same request id gets the first answer and re-attaches
//!   the set's wait on every key; a set is remembered only once granted;
//! - asking again for the set the lease holds, or waits for, answers with it
//!   (every key's wait moves on to the same new attempt);
//! - a key the lease holds or waits for otherwise is refused: it would wait
//!   for itself;
//! - a key held or waited for as a semaphore is refused;
//! - if every key is free, the set is granted at once with one token;
//! - if a key is busy, a set that does not wait is refused with the first busy
//!   key's reason, and a set that waits joins the back of every key's queue,
//!   with one deadline.

use crate::command::{Event, Grant, Mode, Response};
use crate::limits;
use crate::{LeaseId, LockError, RequestId};

use super::answers::{Asked, Caller};
use super::lock::{Set, Waiter};
use super::{LockTable, Outcome};

impl LockTable {
    pub(super) fn acquire_set_once(
        &mut self,
        lease_id: LeaseId,
        keys: &[String],
        (wait_ms, lock_delay_ms): (u64, u64),
        request_id: RequestId,
        events: &mut Vec<Event>,
    ) -> Outcome {
        // Checked by `Command::validate`; here for the sorted keys, each once.
        let keys = limits::validate_set(keys)?;
        self.live_lease(lease_id)?;
        // The table's own keys where it has them, so a set shares them.
        let set: Set = keys.iter().map(|k| self.shared_key(k)).collect();
        let asked = Asked::AcquireSet { keys: set.clone() };
        let caller = Caller::Lease(lease_id);
        if let Some(first) = self.recall(caller, request_id, &asked)? {
            for key in set.iter() {
                self.reattach(key, lease_id);
            }
            return Ok(first);
        }
        let response =
            self.acquire_set(lease_id, set, (wait_ms, lock_delay_ms), request_id, events)?;
        if let Response::Acquired(_) = &response {
            self.remember(caller, request_id, asked, response.clone());
        }
        Ok(response)
    }

    fn acquire_set(
        &mut self,
        lease_id: LeaseId,
        set: Set,
        (wait_ms, lock_delay_ms): (u64, u64),
        request_id: RequestId,
        events: &mut Vec<Event>,
    ) -> Outcome {
        let Some(first) = set.first().cloned() else {
            return Err(LockError::invalid("keys", "a lock set needs a key"));
        };
        let lease = self.live_lease(lease_id)?;
        // Asking again for a set this lease holds, or waits for, is answered
        // with it; a key it holds or waits for otherwise is refused (it
        // would wait for itself).
        let held_as_set = self
            .state
            .locks
            .get(&first)
            .and_then(|l| l.holding_of(lease_id))
            .map(|h| h.fence)
            .filter(|fence| self.state.sets.get(fence) == Some(&set));
        if let Some(fence) = held_as_set {
            for key in set.iter() {
                self.reattach(key, lease_id);
            }
            return Ok(Response::Acquired(Grant {
                lease: lease_id,
                fence,
                checkpoint: None,
            }));
        }
        let waits_as_set = set.iter().all(|k| {
            self.state.locks.get(k).is_some_and(|l| {
                l.waiters()
                    .iter()
                    .any(|w| w.lease == lease_id && w.set.as_ref() == Some(&set))
            })
        });
        if waits_as_set {
            // Every key's wait moves on together, so they share the number.
            let mut attempt = 0;
            for key in set.iter() {
                attempt = self.reattach(key, lease_id);
            }
            let position = self.state.locks.get(&first).map_or(0, |l| {
                l.waiters()
                    .iter()
                    .position(|w| w.lease == lease_id)
                    .unwrap_or(0)
            });
            return Ok(Response::Queued {
                lease: lease_id,
                position,
                attempt,
            });
        }
        if let Some(key) = set
            .iter()
            .find(|k| lease.held.contains(k) || lease.waiting.contains(k))
        {
            return Err(LockError::invalid(
                "keys",
                format!("lease {lease_id} already holds or waits for {key:?}"),
            ));
        }
        let mut busy = None;
        for key in set.iter() {
            if let Some(lock) = self.state.locks.get(key) {
                lock.check_kind(key, Mode::Exclusive)?;
                if busy.is_none() && !lock.free_for(Mode::Exclusive) {
                    busy = Some(self.busy_error(key, lock));
                }
            }
        }
        let Some(busy) = busy else {
            let grant = self.grant_set(&set, lease_id, lock_delay_ms, |_| None, None, events);
            return Ok(Response::Acquired(grant));
        };
        if wait_ms == 0 {
            return Err(busy);
        }
        let deadline = self.state.now.saturating_add(wait_ms);
        let mut position = 0;
        for (i, key) in set.iter().enumerate() {
            let waiter = Waiter {
                lease: lease_id,
                mode: Mode::Exclusive,
                set: Some(set.clone()),
                deadline,
                lock_delay_ms,
                request_id,
                attach_by: None,
                attempt: 1,
            };
            let place = self.enqueue(key.clone(), waiter);
            if i == 0 {
                position = place;
            }
        }
        Ok(Response::Queued {
            lease: lease_id,
            position,
            attempt: 1,
        })
    }
}
