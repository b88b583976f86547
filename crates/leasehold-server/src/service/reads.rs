//! Reads: one lock or lease, and lists of them a page at a time, each
//! filtered to what the caller may read.

use leasehold_core::auth::{AuthState, Permission, TokenId};
use leasehold_core::{limits, LeaseId, LeaseView, LockError, LockView};

#[cfg(feature = "planted-bugs")]
use super::PlantedBug;
use super::{ApiError, LockService};

/// Lists return at most this many items.
pub const MAX_LIST: usize = 10_000;

/// One page of a list, and where the next one starts (`None`: this was the
/// last). Pass `next` back as `start_after` for the next page.
#[derive(Debug)]
pub struct Page<T, C> {
    /// The items, in order.
    pub items: Vec<T>,
    /// The cursor for the next page, if there are more items.
    pub next: Option<C>,
}

/// Keys listed per lease in a list of leases.
pub const LIST_KEYS_PER_LEASE: usize = 100;

/// A list's page size: 0 is the maximum, and nothing above it.
fn page_limit(limit: usize) -> usize {
    if limit == 0 {
        MAX_LIST
    } else {
        limit.min(MAX_LIST)
    }
}

impl LockService {
    /// One lock.
    pub async fn lock(&self, key: &str) -> Result<Option<LockView>, ApiError> {
        limits::validate_key(key)?;
        #[cfg(feature = "planted-bugs")]
        if self.planted == Some(PlantedBug::StaleRead) {
            return Ok(self.consensus.read_local(|t| t.lock(key, 0)).await);
        }
        self.read_as(|t, who, now| {
            t.auth().check(who, key, Permission::Read)?;
            Ok(t.lock(key, now))
        })
        .await
    }

    /// Locks under a prefix, in key order, after the key `start_after`; and
    /// the cursor for the next page (the last key), if there are more. With
    /// `held_only`, only keys held or waited for.
    pub async fn locks(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
        held_only: bool,
    ) -> Result<Page<LockView, String>, ApiError> {
        validate_prefix(prefix)?;
        let start_after = start_after.filter(|a| !a.is_empty());
        if let Some(after) = start_after.filter(|a| a.len() > limits::MAX_KEY_LEN) {
            return Err(ApiError::invalid(
                "start_after",
                format!(
                    "is {} bytes; the limit is {}",
                    after.len(),
                    limits::MAX_KEY_LEN
                ),
            ));
        }
        let limit = page_limit(limit);
        let mut items = self
            .read_as(|t, who, now| {
                let visible = |key: &str| {
                    t.auth()
                        .permission(who, key)
                        .is_ok_and(|p| p >= Permission::Read)
                };
                Ok(t.locks_where(prefix, start_after, limit + 1, now, held_only, visible))
            })
            .await?;
        let next = (items.len() > limit).then(|| {
            items.truncate(limit);
            items.last().map(|l| l.key.clone()).unwrap_or_default()
        });
        Ok(Page { items, next })
    }

    /// One live lease; the same error as a keepalive for one that is not.
    pub async fn lease(&self, id: LeaseId) -> Result<LeaseView, ApiError> {
        self.read_as(|t, who, now| {
            let view = t.lease(id, now).ok_or_else(|| t.no_lease(id))?;
            if !sees_lease(t.auth(), who, view.owner) {
                return Err(LockError::NotOwner { lease: id });
            }
            Ok(view)
        })
        .await
    }

    /// Leases in id order, after the id `start_after` (0: from the first);
    /// and the cursor for the next page (the last id), if there are more.
    /// Each lists at most [`LIST_KEYS_PER_LEASE`] of its keys, and how many
    /// it holds; describing one lease lists them all.
    pub async fn leases(
        &self,
        start_after: LeaseId,
        limit: usize,
    ) -> Result<Page<LeaseView, LeaseId>, ApiError> {
        let limit = page_limit(limit);
        let mut items = self
            .read_as(|t, who, now| {
                let visible = |owner| sees_lease(t.auth(), who, owner);
                Ok(t.leases_where(start_after, limit + 1, LIST_KEYS_PER_LEASE, now, visible))
            })
            .await?;
        let next = (items.len() > limit).then(|| {
            items.truncate(limit);
            items.last().map_or(0, |l| l.lease)
        });
        Ok(Page { items, next })
    }
}

/// Whether `who` may see a lease owned by `owner`: its own, or any with read
/// on every key.
fn sees_lease(auth: &AuthState, who: Option<TokenId>, owner: Option<TokenId>) -> bool {
    who.is_none()
        || owner == who
        || auth
            .permission(who, "")
            .is_ok_and(|p| p >= Permission::Read)
}

/// A key prefix (for lists and watches) is held to the key's length limit.
pub(super) fn validate_prefix(prefix: &str) -> Result<(), ApiError> {
    Ok(limits::validate_prefix(prefix)?)
}
