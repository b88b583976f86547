//! The lock service's operations, shared by the gRPC and HTTP surfaces.
//!
//! Input is validated here, before anything reaches the log, so bad input
//! costs no disk write and changes nothing. The table validates again inside
//! `apply`, which keeps it safe whatever proposes to it.

use std::time::Duration;

use leasehold_core::{
    limits, Command, Event, Fence, Grant, LeaseId, LeaseView, LockError, LockView, RequestId,
    Response, WaitEnd,
};
use tokio::sync::broadcast;

use crate::hub::WaitResult;
use crate::raft::{Consensus, ConsensusError};

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
            ApiError::Internal(_) => "internal",
        }
    }
}

/// The lease an acquire is made under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseSpec {
    /// A live lease.
    Existing(LeaseId),
    /// A new lease for this lock alone, granted in the same step.
    New {
        /// Its TTL.
        ttl_ms: u64,
        /// Its holder's name.
        holder: String,
    },
}

/// An acquire request.
#[derive(Debug, Clone)]
pub struct AcquireArgs {
    /// The lease the lock hangs off.
    pub lease: LeaseSpec,
    /// The key.
    pub key: String,
    /// 0 to answer at once; otherwise wait in the queue up to this long.
    pub wait_ms: u64,
    /// Lock-delay after an expiry.
    pub lock_delay_ms: u64,
    /// Makes a retry safe (0 for none).
    pub request_id: RequestId,
}

/// A bug planted on purpose, for a simulation to show that its checker
/// catches it (feature `planted-bugs`; never on unless a caller plants it).
#[cfg(feature = "planted-bugs")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlantedBug {
    /// Release ignores the token it is given and releases whoever holds the
    /// key now: the blind delete.
    BlindRelease,
    /// Describing a lock reads this node's own table, on any node, without
    /// confirming it leads: a follower that lags or a deposed leader answers
    /// from the past.
    StaleRead,
}

/// The operations, over a running consensus node.
#[derive(Clone)]
pub struct LockService {
    consensus: Consensus,
    #[cfg(feature = "planted-bugs")]
    planted: Option<PlantedBug>,
}

fn unexpected(response: Response) -> ApiError {
    ApiError::Internal(format!("unexpected response {response:?}"))
}

impl LockService {
    /// Serves operations from `consensus`.
    pub fn new(consensus: Consensus) -> Self {
        LockService {
            consensus,
            #[cfg(feature = "planted-bugs")]
            planted: None,
        }
    }

    /// This service with `bug` planted in it.
    #[cfg(feature = "planted-bugs")]
    pub fn plant(mut self, bug: PlantedBug) -> Self {
        self.planted = Some(bug);
        self
    }

    /// The node underneath.
    pub fn consensus(&self) -> &Consensus {
        &self.consensus
    }

    /// Runs one call and counts it in the metrics.
    async fn measured<T>(
        &self,
        op: &'static str,
        call: impl std::future::Future<Output = Result<T, ApiError>>,
    ) -> Result<T, ApiError> {
        let started = std::time::Instant::now();
        let result = call.await;
        let code = result.as_ref().err().map_or("ok", ApiError::code);
        self.consensus
            .hub()
            .metrics
            .request(op, code, started.elapsed());
        result
    }

    async fn propose(&self, command: Command) -> Result<Response, ApiError> {
        Ok(self.consensus.propose(command).await??)
    }

    /// Creates a lease. A retry with the same `request_id` (and the same TTL
    /// and holder) answers with the lease the first one made.
    pub async fn grant(
        &self,
        ttl_ms: u64,
        holder: String,
        request_id: RequestId,
    ) -> Result<(LeaseId, u64), ApiError> {
        self.measured("grant", async move {
            limits::validate_ttl(ttl_ms)?;
            limits::validate_holder(&holder)?;
            let command = Command::Grant {
                ttl_ms,
                holder,
                request_id,
            };
            match self.propose(command).await? {
                Response::LeaseGranted { lease, ttl_ms } => Ok((lease, ttl_ms)),
                other => Err(unexpected(other)),
            }
        })
        .await
    }

    /// Renews a lease to its full TTL.
    pub async fn keep_alive(&self, lease: LeaseId) -> Result<u64, ApiError> {
        self.measured("keep_alive", async move {
            match self.propose(Command::KeepAlive { lease }).await? {
                Response::Renewed { ttl_ms } => Ok(ttl_ms),
                other => Err(unexpected(other)),
            }
        })
        .await
    }

    /// Ends a lease, releasing its locks.
    pub async fn revoke(&self, lease: LeaseId) -> Result<Vec<String>, ApiError> {
        self.measured("revoke", async move {
            match self.propose(Command::Revoke { lease }).await? {
                Response::Revoked { released } => Ok(released),
                other => Err(unexpected(other)),
            }
        })
        .await
    }

    /// Acquires a lock, waiting in the key's queue when `wait_ms > 0`.
    ///
    /// The table ends a wait at its deadline; this call only listens for the
    /// outcome. If the caller goes away first (the future is dropped), the
    /// wait is withdrawn, and a grant that raced with the withdrawal is
    /// released, since nobody would ever learn of it. A wait on a lease made
    /// for it that ends without a grant revokes that lease.
    pub async fn acquire(&self, args: AcquireArgs) -> Result<Grant, ApiError> {
        self.measured("acquire", async move {
            limits::validate_key(&args.key)?;
            limits::validate_wait(args.wait_ms, args.lock_delay_ms)?;
            let command = match &args.lease {
                LeaseSpec::Existing(lease) => Command::Acquire {
                    lease: *lease,
                    key: args.key.clone(),
                    wait_ms: args.wait_ms,
                    lock_delay_ms: args.lock_delay_ms,
                    request_id: args.request_id,
                },
                LeaseSpec::New { ttl_ms, holder } => {
                    limits::validate_ttl(*ttl_ms)?;
                    limits::validate_holder(holder)?;
                    Command::GrantAndAcquire {
                        ttl_ms: *ttl_ms,
                        holder: holder.clone(),
                        key: args.key.clone(),
                        wait_ms: args.wait_ms,
                        lock_delay_ms: args.lock_delay_ms,
                        request_id: args.request_id,
                    }
                }
            };
            if args.wait_ms == 0 {
                return match self.propose(command).await? {
                    Response::Acquired(grant) => Ok(grant),
                    other => Err(unexpected(other)),
                };
            }
            let lease = match args.lease {
                LeaseSpec::Existing(lease) => lease,
                // The new lease's id is known only from the answer: queue (or
                // take the key) first, then wait as that lease.
                LeaseSpec::New { .. } => match self.propose(command).await? {
                    Response::Acquired(grant) => return Ok(grant),
                    Response::Queued { lease, .. } => {
                        let waited = self.wait(lease, &args).await;
                        if waited.is_err() {
                            // Made for this lock alone: do not leave it behind.
                            let _ = self.propose(Command::Revoke { lease }).await;
                        }
                        return waited;
                    }
                    other => return Err(unexpected(other)),
                },
            };
            self.wait(lease, &args).await
        })
        .await
    }

    /// Acquires `args.key` under `lease` as a wait: registers for the
    /// outcome, proposes the acquire (the same request again, if it was
    /// proposed before: that re-attaches to the wait and answers a grant that
    /// came in between), and listens.
    async fn wait(&self, lease: LeaseId, args: &AcquireArgs) -> Result<Grant, ApiError> {
        let command = Command::Acquire {
            lease,
            key: args.key.clone(),
            wait_ms: args.wait_ms,
            lock_delay_ms: args.lock_delay_ms,
            request_id: args.request_id,
        };
        let hub = self.consensus.hub().clone();
        let outcome = hub.wait_for(lease, &args.key);
        let mut cancel = CancelOnDrop {
            consensus: Some(self.consensus.clone()),
            lease,
            key: args.key.clone(),
            request_id: args.request_id,
        };
        let queued_at = std::time::Instant::now();
        let first = self.propose(command).await;
        let result = match first {
            Ok(Response::Acquired(grant)) => Ok(grant),
            Ok(Response::Queued { .. }) => {
                // The table's own deadline ends the wait; the margin covers a
                // leader change that would lose the tick.
                let limit = Duration::from_millis(args.wait_ms) + Duration::from_secs(2);
                match tokio::time::timeout(limit, outcome).await {
                    Ok(Ok(WaitResult::Granted(grant))) => {
                        hub.metrics.waited(queued_at.elapsed());
                        Ok(grant)
                    }
                    Ok(Ok(WaitResult::Ended(WaitEnd::LeaseGone))) => {
                        Err(LockError::LeaseExpired { lease }.into())
                    }
                    Ok(Ok(WaitResult::Ended(_))) => Err(LockError::WaitTimeout {
                        key: args.key.clone(),
                    }
                    .into()),
                    // No outcome: leave `cancel` armed so the wait is withdrawn.
                    Ok(Err(_)) | Err(_) => {
                        hub.forget(lease, &args.key);
                        return Err(LockError::WaitTimeout {
                            key: args.key.clone(),
                        }
                        .into());
                    }
                }
            }
            Ok(other) => Err(unexpected(other)),
            Err(ApiError::Lock(e)) => Err(e.into()),
            // The outcome is unknown: leave `cancel` armed.
            Err(e) => {
                hub.forget(lease, &args.key);
                return Err(e);
            }
        };
        cancel.consensus = None;
        hub.forget(lease, &args.key);
        result
    }

    /// Releases a lock held with `fence`.
    pub async fn release(
        &self,
        key: String,
        fence: Fence,
        request_id: RequestId,
    ) -> Result<(), ApiError> {
        self.measured("release", async move {
            limits::validate_key(&key)?;
            #[cfg(feature = "planted-bugs")]
            let fence = match self.planted {
                Some(PlantedBug::BlindRelease) => self
                    .consensus
                    .read_local(|t| t.lock(&key, 0))
                    .and_then(|l| l.holder)
                    .map_or(fence, |h| h.fence),
                _ => fence,
            };
            match self
                .propose(Command::Release {
                    key,
                    fence,
                    request_id,
                })
                .await?
            {
                Response::Released => Ok(()),
                other => Err(unexpected(other)),
            }
        })
        .await
    }

    /// Stores a checkpoint with a lock held with `fence`.
    pub async fn save_checkpoint(
        &self,
        key: String,
        fence: Fence,
        data: Vec<u8>,
    ) -> Result<(), ApiError> {
        self.measured("save_checkpoint", async move {
            limits::validate_key(&key)?;
            limits::validate_checkpoint(&data)?;
            match self
                .propose(Command::SaveCheckpoint { key, fence, data })
                .await?
            {
                Response::CheckpointSaved => Ok(()),
                other => Err(unexpected(other)),
            }
        })
        .await
    }

    /// One lock.
    pub async fn lock(&self, key: &str) -> Result<Option<LockView>, ApiError> {
        limits::validate_key(key)?;
        #[cfg(feature = "planted-bugs")]
        if self.planted == Some(PlantedBug::StaleRead) {
            return Ok(self.consensus.read_local(|t| t.lock(key, 0)));
        }
        Ok(self.consensus.read(|t, now| t.lock(key, now)).await?)
    }

    /// Locks under a prefix, in key order, after the key `start_after`; and
    /// the cursor for the next page (the last key), if there are more.
    pub async fn locks(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
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
            .consensus
            .read(|t, now| t.locks(prefix, start_after, limit + 1, now))
            .await?;
        let next = (items.len() > limit).then(|| {
            items.truncate(limit);
            items.last().map(|l| l.key.clone()).unwrap_or_default()
        });
        Ok(Page { items, next })
    }

    /// One live lease; the same error as a keepalive for one that is not.
    pub async fn lease(&self, id: LeaseId) -> Result<LeaseView, ApiError> {
        Ok(self
            .consensus
            .read(|t, now| t.lease(id, now).ok_or_else(|| t.no_lease(id)))
            .await??)
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
            .consensus
            .read(|t, now| t.leases(start_after, limit + 1, LIST_KEYS_PER_LEASE, now))
            .await?;
        let next = (items.len() > limit).then(|| {
            items.truncate(limit);
            items.last().map_or(0, |l| l.lease)
        });
        Ok(Page { items, next })
    }

    /// Lock events from now on, for keys under `prefix`.
    pub fn watch(&self, prefix: String) -> Result<Watch, ApiError> {
        validate_prefix(&prefix)?;
        Ok(Watch {
            rx: self.consensus.hub().subscribe(),
            prefix,
        })
    }
}

/// A key prefix (for lists and watches) is held to the key's length limit.
fn validate_prefix(prefix: &str) -> Result<(), ApiError> {
    if prefix.len() > limits::MAX_KEY_LEN {
        return Err(ApiError::invalid(
            "prefix",
            format!(
                "is {} bytes; the limit is {}",
                prefix.len(),
                limits::MAX_KEY_LEN
            ),
        ));
    }
    Ok(())
}

/// A subscription to lock events under a prefix.
pub struct Watch {
    rx: broadcast::Receiver<Event>,
    prefix: String,
}

/// What a watcher sees.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WatchEvent {
    /// `acquired`, `released` or `expired`.
    pub kind: &'static str,
    /// The key.
    pub key: String,
    /// The token of the hold that began or ended.
    pub fence: Fence,
    /// The lease of that hold.
    pub lease: LeaseId,
    /// Its holder's name.
    pub holder: String,
}

impl Watch {
    /// The next event, or an error if this watcher fell too far behind (its
    /// events were dropped) or the server is stopping.
    pub async fn next(&mut self) -> Result<WatchEvent, ApiError> {
        loop {
            let event = match self.rx.recv().await {
                Ok(e) => e,
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    return Err(ApiError::Internal(format!(
                        "watch fell behind by {n} events; watch again"
                    )))
                }
                Err(broadcast::error::RecvError::Closed) => {
                    return Err(ConsensusError::Stopped("server stopping".into()).into())
                }
            };
            let (kind, key, fence, lease, holder) = match event {
                Event::Acquired {
                    key,
                    fence,
                    lease,
                    holder,
                    ..
                } => ("acquired", key, fence, lease, holder),
                Event::Released {
                    key,
                    fence,
                    lease,
                    holder,
                } => ("released", key, fence, lease, holder),
                Event::Expired {
                    key,
                    fence,
                    lease,
                    holder,
                } => ("expired", key, fence, lease, holder),
                _ => continue,
            };
            if key.starts_with(&self.prefix) {
                return Ok(WatchEvent {
                    kind,
                    key: key.to_string(),
                    fence,
                    lease,
                    holder: holder.to_string(),
                });
            }
        }
    }
}

/// Withdraws a wait when the waiting call is dropped before it saw an outcome.
struct CancelOnDrop {
    consensus: Option<Consensus>,
    lease: LeaseId,
    key: String,
    request_id: RequestId,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(consensus) = self.consensus.take() else {
            return;
        };
        let command = Command::CancelWait {
            lease: self.lease,
            key: std::mem::take(&mut self.key),
            request_id: self.request_id,
        };
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Err(e) = consensus.propose(command).await {
                    tracing::debug!(error = %e, "withdrawing an abandoned wait");
                }
            });
        }
    }
}
