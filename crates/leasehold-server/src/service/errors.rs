//! [`ApiError`]: why an operation failed, with a stable code for each case
//! (the wire formats map it in `api::error`).

use leasehold_core::{LockError, Response};

use crate::raft::{ConsensusError, MembershipError};

/// Why an operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// The lock table refused it.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// This node cannot serve it now.
    #[error(transparent)]
    Consensus(#[from] ConsensusError),
    /// No such route (HTTP).
    #[error("not found: {0}")]
    NotFound(String),
    /// The route exists but not with this method (HTTP).
    #[error("method not allowed: {0}")]
    MethodNotAllowed(String),
    /// A node to add did not answer or catch up; it is not a member.
    #[error("{0}")]
    NotAdded(String),
    /// Plaintext on a port that speaks TLS only; nothing was done.
    #[error("{0}")]
    TlsRequired(String),
    /// A watch fell so far behind that events it had not read were dropped:
    /// read the state again (a list), then watch again.
    #[error("{0}")]
    WatchBehind(String),
    /// A quota or rate limit refused it (see `crate::admission`): nothing
    /// was done.
    #[error("{0}")]
    ResourceExhausted(String),
    /// The server failed in a way the caller cannot fix.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    /// Input the server refuses: which field, and why.
    pub fn invalid(field: &str, reason: impl std::fmt::Display) -> ApiError {
        ApiError::Lock(LockError::Invalid {
            field: field.to_string(),
            reason: reason.to_string(),
        })
    }

    /// The stable code put on the wire.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Lock(e) => e.code(),
            ApiError::Consensus(ConsensusError::NotLeader { .. }) => "not_leader",
            ApiError::Consensus(ConsensusError::Unknown(_)) => "outcome_unknown",
            ApiError::Consensus(_) => "unavailable",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed(_) => "method_not_allowed",
            ApiError::NotAdded(_) => "not_added",
            ApiError::TlsRequired(_) => "tls_required",
            ApiError::WatchBehind(_) => "watch_behind",
            ApiError::ResourceExhausted(_) => "resource_exhausted",
            ApiError::Internal(_) => "internal",
        }
    }
}

impl From<MembershipError> for ApiError {
    fn from(e: MembershipError) -> ApiError {
        match e {
            MembershipError::Consensus(e) => ApiError::Consensus(e),
            MembershipError::Invalid { field, reason } => ApiError::invalid(field, reason),
            MembershipError::NotAdded(why) => ApiError::NotAdded(why),
        }
    }
}

pub(super) fn unexpected(response: Response) -> ApiError {
    ApiError::Internal(format!("unexpected response {response:?}"))
}
