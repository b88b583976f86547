//! The snapshot form: a table is written as its fields, and read back
//! through [`Restored`], which rebuilds the indexes and counts the snapshot
//! leaves out.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use serde::Deserialize;

use crate::auth::AuthState;
use crate::{Fence, LeaseId, RequestId, Time};

use super::answers::{deserialize_answers, Answers, Caller};
use super::lock::{Lease, Lock, Set};
use super::LockTable;

/// A table as read from a snapshot, before its indexes are rebuilt.
#[derive(Deserialize)]
pub(super) struct Restored {
    now: Time,
    epoch: u64,
    next_lease: LeaseId,
    next_fence: Fence,
    leases: BTreeMap<LeaseId, Lease>,
    locks: BTreeMap<Arc<str>, Lock>,
    lease_deadlines: BTreeSet<(Time, LeaseId)>,
    wait_deadlines: BTreeSet<(Time, Arc<str>, LeaseId)>,
    delay_deadlines: BTreeSet<(Time, Arc<str>)>,
    attach_deadlines: BTreeSet<(Time, Arc<str>, LeaseId)>,
    #[serde(deserialize_with = "deserialize_answers")]
    answered: Answers,
    answered_order: VecDeque<(Time, Caller, RequestId)>,
    auth: AuthState,
    sets: BTreeMap<Fence, Set>,
}

impl From<Restored> for LockTable {
    fn from(r: Restored) -> Self {
        let mut leases = r.leases;
        let mut held_keys = 0;
        for (key, lock) in &r.locks {
            held_keys += usize::from(lock.holder.is_some());
            for h in lock.holders() {
                if let Some(lease) = leases.get_mut(&h.lease) {
                    lease.held.insert(key.clone());
                }
            }
            for w in lock.waiters() {
                if let Some(lease) = leases.get_mut(&w.lease) {
                    lease.waiting.insert(key.clone());
                }
            }
        }
        LockTable {
            now: r.now,
            epoch: r.epoch,
            next_lease: r.next_lease,
            next_fence: r.next_fence,
            leases,
            locks: r.locks,
            lease_deadlines: r.lease_deadlines,
            wait_deadlines: r.wait_deadlines,
            delay_deadlines: r.delay_deadlines,
            attach_deadlines: r.attach_deadlines,
            answered: r.answered,
            answered_order: r.answered_order,
            auth: r.auth,
            sets: r.sets,
            held_keys,
        }
    }
}
