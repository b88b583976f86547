//! The client's errors.

use crate::Fence;

/// Why a lock operation failed. Match on the variant; the message is for people.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Someone else holds the lock.
    #[error("lock {key:?} is held by {holder:?}{}", fence.map(|f| format!(" (fence {f})")).unwrap_or_default())]
    Held {
        /// The key.
        key: String,
        /// Who holds it, as that holder named itself (may be empty).
        holder: String,
        /// The holder's fencing token, where the backend has them.
        fence: Option<Fence>,
    },
    /// Nobody holds the lock, but it stays closed for the lock-delay after
    /// its last holder's lease expired (that holder may still be writing):
    /// try again in `left_ms`, or wait for it.
    #[error("lock {key:?} is closed for the lock-delay after an expiry: {left_ms} ms left")]
    LockDelayed {
        /// The key.
        key: String,
        /// Milliseconds until it opens.
        left_ms: u64,
    },
    /// The wait for the lock ran out.
    #[error("timed out waiting for lock {key:?}")]
    Timeout {
        /// The key.
        key: String,
    },
    /// The lease is gone: renewal failed, the server said it expired, or the
    /// client-side deadline passed. Stop mutating what the lock protects.
    #[error("lease on {key:?} lost: {reason}")]
    LeaseLost {
        /// The key.
        key: String,
        /// What happened.
        reason: String,
    },
    /// A fencing token was refused because a newer one has been seen.
    #[error("stale fence: presented {presented}, current {}", current.map_or_else(|| "none".to_string(), |c| c.to_string()))]
    StaleFence {
        /// The token presented.
        presented: Fence,
        /// The newer token, if known.
        current: Option<Fence>,
    },
    /// The request was malformed (key too long, TTL out of range, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The server did not accept the token: none was given while auth is
    /// on, or it is malformed, wrong or revoked.
    #[error("{0}")]
    Unauthenticated(String),
    /// The token may not do this (on this key, or on another token's lease).
    #[error("{0}")]
    PermissionDenied(String),
    /// The lock store cannot be reached or is not serving now (no leader, a
    /// replica after a failover, a transaction it rolled back); nothing was
    /// done. Retrying may help.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The request reached the store but no answer came back (the connection
    /// broke, or the leader lost its quorum mid-write): it may or may not have
    /// taken effect. The client has already retried it with its request id
    /// where it carries one (grant, acquire, release) before saying so.
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// This backend cannot do that (e.g. checkpoints on Redis).
    #[error("not supported by the {backend} backend: {what}")]
    Unsupported {
        /// The backend.
        backend: &'static str,
        /// What was asked.
        what: &'static str,
    },
    /// The store is out of a resource (memory, disk, connections), a
    /// request or its answer is over a size limit, or leaseholdd is at a
    /// quota or its rate limit (`resource_exhausted`; renewing, releasing
    /// and revoking are never refused so): nothing was done, and sending it
    /// again at once will not help. Free some, raise the limit, or ask for
    /// less (a narrower prefix), or later.
    #[error("the {backend} store refused it for a limit: {reason}")]
    ResourceExhausted {
        /// The backend.
        backend: &'static str,
        /// What ran out, as the store said it.
        reason: String,
    },
    /// A watch fell so far behind that events it had not read were dropped.
    /// Read the state again ([`Client::status`](crate::Client::status)),
    /// then watch again.
    #[error("the watch on {prefix:?} fell behind and missed events: list the locks again, then watch again")]
    WatchBehind {
        /// The prefix watched.
        prefix: String,
    },
    /// The endpoint speaks TLS only and this client connected in plaintext;
    /// nothing was done, and trying again the same way cannot help. The
    /// message is the server's, which says how to connect.
    #[error("{0}")]
    TlsRequired(String),
    /// The URL names a backend this build of the crate leaves out: enable
    /// the crate feature named here.
    #[error("the {backend} backend is not in this build: enable the `{feature}` feature of the leasehold crate")]
    BackendNotBuilt {
        /// The backend the URL names.
        backend: &'static str,
        /// The cargo feature that builds it.
        feature: &'static str,
    },
    /// A correctness lock was asked of a backend that only promises efficiency.
    #[error("the {backend} backend only guarantees efficiency ({why}); a correctness lock needs leaseholdd, PostgreSQL or etcd")]
    InsufficientGuarantee {
        /// The backend.
        backend: &'static str,
        /// Why it cannot promise correctness.
        why: &'static str,
    },
    /// Anything else: what the store reported that none of the cases above
    /// covers (an internal error of the store, a reply this client cannot
    /// read). Not something a caller can act on but by reporting it.
    #[error("{0}")]
    Other(String),
}

/// Results of lock operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The refusal while a key is kept closed by the lock-delay after its
    /// holder's lease expired: nobody holds it, and `left_ms` remain.
    pub(crate) fn lock_delayed(key: &str, left_ms: u64) -> Error {
        Error::LockDelayed {
            key: key.to_string(),
            left_ms,
        }
    }

    /// Whether the lock was refused because it is taken now: held by
    /// someone else, or closed by a lock-delay. Trying again later may
    /// succeed.
    pub fn is_busy(&self) -> bool {
        matches!(self, Error::Held { .. } | Error::LockDelayed { .. })
    }
}
