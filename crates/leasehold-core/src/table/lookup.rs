//! What the rules look up before they act, and the refusals they answer
//! with: a live lease (or why it is not), the hold a token names, why a key
//! is busy, whether a lock set may be granted, a lease's holder name.
//! Nothing here changes the table.

use std::sync::Arc;

use crate::limits;
use crate::{Fence, LeaseId, LockError};

use super::lock::{Holding, Lease, Lock, Set};
use super::LockTable;

impl LockTable {
    /// Lease `id`, if it is live; otherwise why not (see [`no_lease`](Self::no_lease)).
    pub(super) fn live_lease(&self, id: LeaseId) -> Result<&Lease, LockError> {
        self.state.leases.get(&id).ok_or_else(|| self.no_lease(id))
    }

    /// Why lease `id` is not live: it ended (expired or revoked: one answer,
    /// whatever asks), or it was never handed out.
    pub fn no_lease(&self, id: LeaseId) -> LockError {
        if id != 0 && id < self.state.next_lease {
            LockError::LeaseExpired { lease: id }
        } else {
            LockError::LeaseNotFound { lease: id }
        }
    }

    /// `key` as the table names it, sharing the name with its lock if it
    /// has one, so that an index or a set over it costs no second copy.
    pub(super) fn shared_key(&self, key: &str) -> Arc<str> {
        self.state
            .locks
            .get_key_value(key)
            .map_or_else(|| Arc::from(key), |(k, _)| k.clone())
    }

    /// The holder name of lease `id`; empty once the lease is gone.
    pub(super) fn holder_name(&self, id: LeaseId) -> Arc<str> {
        self.state
            .leases
            .get(&id)
            .map_or_else(|| Arc::from(""), |l| l.holder.clone())
    }

    /// The table's own name for `key` and the hold on it that `fence`
    /// names; `StaleFence` (with the first holder's token) if it names none.
    pub(super) fn held_by<'a>(
        &'a self,
        key: &str,
        fence: Fence,
    ) -> Result<(&'a Arc<str>, &'a Holding), LockError> {
        limits::validate_key(key)?;
        let found = self.state.locks.get_key_value(key);
        if let Some((k, h)) =
            found.and_then(|(k, l)| Some((k, l.holders().find(|h| h.fence == fence)?)))
        {
            return Ok((k, h));
        }
        Err(LockError::StaleFence {
            key: key.to_string(),
            presented: fence,
            current: found.and_then(|(_, l)| l.holder.as_ref()).map(|h| h.fence),
        })
    }

    /// Why a newcomer may not take `key` (`lock`) now.
    pub(super) fn busy_error(&self, key: &str, lock: &Lock) -> LockError {
        lock.busy_error(key, self.state.now, |id| self.holder_name(id).to_string())
    }

    /// Whether `lease`'s set wait is first in line on every key of `set`,
    /// and every key is free (no holder, no lock-delay).
    pub(super) fn set_ready(&self, set: &Set, lease: LeaseId) -> bool {
        let ready = |key: &Arc<str>| {
            self.state
                .locks
                .get(key)
                .is_some_and(|l| l.ready_for_set(lease))
        };
        set.iter().all(ready)
    }
}
