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

/// Why an operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// The lock table refused it.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// This node cannot serve it now.
    #[error(transparent)]
    Consensus(#[from] ConsensusError),
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
            ApiError::Consensus(_) => "unavailable",
            ApiError::Internal(_) => "internal",
        }
    }
}

/// An acquire request.
#[derive(Debug, Clone)]
pub struct AcquireArgs {
    /// The lease the lock hangs off.
    pub lease: LeaseId,
    /// The key.
    pub key: String,
    /// 0 to answer at once; otherwise wait in the queue up to this long.
    pub wait_ms: u64,
    /// Lock-delay after an expiry.
    pub lock_delay_ms: u64,
    /// Makes a retry safe (0 for none).
    pub request_id: RequestId,
}

/// The operations, over a running consensus node.
#[derive(Clone)]
pub struct LockService {
    consensus: Consensus,
}

fn unexpected(response: Response) -> ApiError {
    ApiError::Internal(format!("unexpected response {response:?}"))
}

impl LockService {
    /// Serves operations from `consensus`.
    pub fn new(consensus: Consensus) -> Self {
        LockService { consensus }
    }

    /// The node underneath.
    pub fn consensus(&self) -> &Consensus {
        &self.consensus
    }

    async fn propose(&self, command: Command) -> Result<Response, ApiError> {
        Ok(self.consensus.propose(command).await??)
    }

    /// Creates a lease.
    pub async fn grant(&self, ttl_ms: u64, holder: String) -> Result<(LeaseId, u64), ApiError> {
        limits::validate_ttl(ttl_ms)?;
        limits::validate_holder(&holder)?;
        match self.propose(Command::Grant { ttl_ms, holder }).await? {
            Response::LeaseGranted { lease, ttl_ms } => Ok((lease, ttl_ms)),
            other => Err(unexpected(other)),
        }
    }

    /// Renews a lease to its full TTL.
    pub async fn keep_alive(&self, lease: LeaseId) -> Result<u64, ApiError> {
        match self.propose(Command::KeepAlive { lease }).await? {
            Response::Renewed { ttl_ms } => Ok(ttl_ms),
            other => Err(unexpected(other)),
        }
    }

    /// Ends a lease, releasing its locks.
    pub async fn revoke(&self, lease: LeaseId) -> Result<Vec<String>, ApiError> {
        match self.propose(Command::Revoke { lease }).await? {
            Response::Revoked { released } => Ok(released),
            other => Err(unexpected(other)),
        }
    }

    /// Acquires a lock, waiting in the key's queue when `wait_ms > 0`.
    ///
    /// The table ends a wait at its deadline; this call only listens for the
    /// outcome. If the caller goes away first (the future is dropped), the
    /// wait is withdrawn, and a grant that raced with the withdrawal is
    /// released, since nobody would ever learn of it.
    pub async fn acquire(&self, args: AcquireArgs) -> Result<Grant, ApiError> {
        limits::validate_key(&args.key)?;
        limits::validate_wait(args.wait_ms, args.lock_delay_ms)?;
        let command = Command::Acquire {
            lease: args.lease,
            key: args.key.clone(),
            wait_ms: args.wait_ms,
            lock_delay_ms: args.lock_delay_ms,
            request_id: args.request_id,
        };
        if args.wait_ms == 0 {
            return match self.propose(command).await? {
                Response::Acquired(grant) => Ok(grant),
                other => Err(unexpected(other)),
            };
        }

        let hub = self.consensus.hub().clone();
        let outcome = hub.wait_for(args.lease, &args.key);
        let mut cancel = CancelOnDrop {
            consensus: Some(self.consensus.clone()),
            lease: args.lease,
            key: args.key.clone(),
            request_id: args.request_id,
        };
        let first = self.propose(command).await;
        let result = match first {
            Ok(Response::Acquired(grant)) => Ok(grant),
            Ok(Response::Queued { .. }) => {
                // The table's own deadline ends the wait; the margin covers a
                // leader change that would lose the tick.
                let limit = Duration::from_millis(args.wait_ms) + Duration::from_secs(2);
                match tokio::time::timeout(limit, outcome).await {
                    Ok(Ok(WaitResult::Granted(grant))) => Ok(grant),
                    Ok(Ok(WaitResult::Ended(WaitEnd::LeaseGone))) => {
                        Err(LockError::LeaseExpired { lease: args.lease }.into())
                    }
                    Ok(Ok(WaitResult::Ended(_))) => Err(LockError::WaitTimeout {
                        key: args.key.clone(),
                    }
                    .into()),
                    // No outcome: leave `cancel` armed so the wait is withdrawn.
                    Ok(Err(_)) | Err(_) => {
                        hub.forget(args.lease, &args.key);
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
                hub.forget(args.lease, &args.key);
                return Err(e);
            }
        };
        cancel.consensus = None;
        hub.forget(args.lease, &args.key);
        result
    }

    /// Releases a lock held with `fence`.
    pub async fn release(
        &self,
        key: String,
        fence: Fence,
        request_id: RequestId,
    ) -> Result<(), ApiError> {
        limits::validate_key(&key)?;
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
    }

    /// Stores a checkpoint with a lock held with `fence`.
    pub async fn save_checkpoint(
        &self,
        key: String,
        fence: Fence,
        data: Vec<u8>,
    ) -> Result<(), ApiError> {
        limits::validate_key(&key)?;
        limits::validate_checkpoint(&data)?;
        match self
            .propose(Command::SaveCheckpoint { key, fence, data })
            .await?
        {
            Response::CheckpointSaved => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// One lock.
    pub async fn lock(&self, key: &str) -> Result<Option<LockView>, ApiError> {
        limits::validate_key(key)?;
        Ok(self.consensus.read(|t, now| t.lock(key, now)).await?)
    }

    /// Locks under a prefix.
    pub async fn locks(&self, prefix: &str, limit: usize) -> Result<Vec<LockView>, ApiError> {
        if prefix.len() > limits::MAX_KEY_LEN {
            return Err(LockError::Invalid {
                field: "prefix".into(),
                reason: format!(
                    "is {} bytes; the limit is {}",
                    prefix.len(),
                    limits::MAX_KEY_LEN
                ),
            }
            .into());
        }
        let limit = if limit == 0 {
            MAX_LIST
        } else {
            limit.min(MAX_LIST)
        };
        Ok(self
            .consensus
            .read(|t, now| t.locks(prefix, limit, now))
            .await?)
    }

    /// One lease.
    pub async fn lease(&self, id: LeaseId) -> Result<Option<LeaseView>, ApiError> {
        Ok(self.consensus.read(|t, now| t.lease(id, now)).await?)
    }

    /// Leases in id order.
    pub async fn leases(&self, limit: usize) -> Result<Vec<LeaseView>, ApiError> {
        let limit = if limit == 0 {
            MAX_LIST
        } else {
            limit.min(MAX_LIST)
        };
        Ok(self.consensus.read(|t, now| t.leases(limit, now)).await?)
    }

    /// Lock events from now on, for keys under `prefix`.
    pub fn watch(&self, prefix: String) -> Watch {
        Watch {
            rx: self.consensus.hub().subscribe(),
            prefix,
        }
    }
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
