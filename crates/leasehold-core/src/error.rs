//! The errors a lock-table command can end in.

use serde::{Deserialize, Serialize};

use crate::auth::Permission;
use crate::{Fence, LeaseId};

/// Why a command was refused. A refused command changes nothing in the table.
///
/// Every variant has a stable [`code`](LockError::code) that the API puts on the
/// wire, so clients in any language can tell the cases apart without parsing text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum LockError {
    /// A field failed validation (key, TTL, holder name, sizes).
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The offending field, e.g. `key` or `ttl_ms`.
        field: String,
        /// What is wrong with it, including the limit.
        reason: String,
    },
    /// The lease id was never handed out.
    #[error("lease {lease} not found")]
    LeaseNotFound {
        /// The id the request named.
        lease: LeaseId,
    },
    /// The lease existed but has expired or been revoked; it cannot be renewed.
    #[error("lease {lease} expired or was revoked")]
    LeaseExpired {
        /// The id the request named.
        lease: LeaseId,
    },
    /// The key is held by another lease.
    #[error("lock {key:?} is held by {holder:?} (lease {lease}, fence {fence})")]
    Held {
        /// The contended key.
        key: String,
        /// The current holder's name.
        holder: String,
        /// The current holder's lease.
        lease: LeaseId,
        /// The current holder's fencing token.
        fence: Fence,
    },
    /// The key is free but was freed by an expiry and is still in its lock-delay.
    #[error("lock {key:?} is in lock-delay for {left_ms} ms after an expiry")]
    LockDelayed {
        /// The key.
        key: String,
        /// Milliseconds until it may be granted again.
        left_ms: u64,
    },
    /// The request named a fencing token that does not hold the key (any more).
    #[error("stale fence for {key:?}: presented {presented}, current {}", current.map_or_else(|| "none (not held)".to_string(), |f| f.to_string()))]
    StaleFence {
        /// The key.
        key: String,
        /// The token the request presented.
        presented: Fence,
        /// The token that holds the key now, if any.
        current: Option<Fence>,
    },
    /// The request's token is missing, malformed, revoked or wrong.
    #[error("unauthenticated: {reason}")]
    Unauthenticated {
        /// What is wrong with the token.
        reason: String,
    },
    /// The request's token may not do this on this key.
    #[error("permission denied: {needed} on {} is needed", if key.is_empty() { "every key".to_string() } else { format!("{key:?}") })]
    PermissionDenied {
        /// The key (empty: every key, as membership and auth changes need).
        key: String,
        /// The permission the token lacks.
        needed: Permission,
    },
    /// The lease belongs to another token.
    #[error("permission denied: lease {lease} belongs to another token")]
    NotOwner {
        /// The lease.
        lease: LeaseId,
    },
    /// A wait in the key's queue ended without a grant.
    #[error("timed out waiting for lock {key:?}")]
    WaitTimeout {
        /// The key.
        key: String,
    },
}

impl LockError {
    /// A stable, machine-readable code for this error.
    pub fn code(&self) -> &'static str {
        match self {
            LockError::Invalid { .. } => "invalid_argument",
            LockError::LeaseNotFound { .. } => "lease_not_found",
            LockError::LeaseExpired { .. } => "lease_expired",
            LockError::Held { .. } => "held",
            LockError::LockDelayed { .. } => "lock_delayed",
            LockError::StaleFence { .. } => "stale_fence",
            LockError::WaitTimeout { .. } => "wait_timeout",
            LockError::Unauthenticated { .. } => "unauthenticated",
            LockError::PermissionDenied { .. } | LockError::NotOwner { .. } => "permission_denied",
        }
    }

    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        LockError::Invalid {
            field: field.to_string(),
            reason: reason.into(),
        }
    }
}
