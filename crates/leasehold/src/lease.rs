//! The `Lease` guard: a held lock that renews itself and says when it is lost.

use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::backend::{Acquired, Hold};
use crate::keeper::Liveness;
use crate::{Error, Fence, Result};

/// A held lock.
///
/// It renews itself in the background. When renewal fails, the store says it
/// expired, or the client-side deadline passes, [`lost`](Lease::lost)
/// completes and [`token`](Lease::token) starts failing: stop mutating then.
/// Dropping it releases the lock in the background (ownership-checked, so it
/// never releases a newer holder's lock); [`release`](Lease::release) does it
/// now and says how it went.
pub struct Lease {
    handle: LeaseHandle,
    checkpoint: Option<Vec<u8>>,
    hold: Option<Box<dyn Hold>>,
}

/// A cheap, cloneable view of a lease, for the work it protects (see
/// [`Client::with_lock`](crate::Client::with_lock)).
#[derive(Clone)]
pub struct LeaseHandle {
    key: String,
    fence: Option<Fence>,
    backend: &'static str,
    liveness: Liveness,
}

impl LeaseHandle {
    /// The key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fencing token, if the backend has them (Redlock does not).
    pub fn fence(&self) -> Option<Fence> {
        self.fence
    }

    /// The fencing token to put on a write, checked now: fails with
    /// [`Error::LeaseLost`] once the lease is lost or its client-side deadline
    /// has passed, and with [`Error::Unsupported`] on a backend without tokens.
    /// Call it right before each fenced action.
    pub fn token(&self) -> Result<Fence> {
        let fence = self.fence.ok_or(Error::Unsupported {
            backend: self.backend,
            what: "fencing tokens",
        })?;
        if !self.liveness.is_live() {
            return Err(self.lost_error());
        }
        Ok(fence)
    }

    /// Whether the lease is still good right now.
    pub fn is_live(&self) -> bool {
        self.liveness.is_live()
    }

    /// The client-side deadline: past it without a successful renewal the
    /// lease is lost. It moves forward with each renewal.
    pub fn deadline(&self) -> tokio::time::Instant {
        self.liveness.deadline()
    }

    /// Completes when the lease is lost.
    pub fn lost(&self) -> WaitForCancellationFutureOwned {
        self.liveness.token().clone().cancelled_owned()
    }

    /// A token cancelled when the lease is lost.
    pub fn lost_token(&self) -> CancellationToken {
        self.liveness.token().clone()
    }

    /// Why the lease was lost.
    pub fn lost_reason(&self) -> String {
        self.liveness.reason()
    }

    fn lost_error(&self) -> Error {
        Error::LeaseLost {
            key: self.key.clone(),
            reason: self.liveness.reason(),
        }
    }
}

impl Lease {
    pub(crate) fn new(key: &str, backend: &'static str, acquired: Acquired) -> Lease {
        Lease {
            handle: LeaseHandle {
                key: key.to_string(),
                fence: acquired.fence,
                backend,
                liveness: acquired.liveness,
            },
            checkpoint: acquired.checkpoint,
            hold: Some(acquired.hold),
        }
    }

    /// A cloneable view of this lease.
    pub fn handle(&self) -> LeaseHandle {
        self.handle.clone()
    }

    /// The key.
    pub fn key(&self) -> &str {
        self.handle.key()
    }

    /// The fencing token, if the backend has them.
    pub fn fence(&self) -> Option<Fence> {
        self.handle.fence()
    }

    /// The fencing token, checked now. See [`LeaseHandle::token`].
    pub fn token(&self) -> Result<Fence> {
        self.handle.token()
    }

    /// Whether the lease is still good right now.
    pub fn is_live(&self) -> bool {
        self.handle.is_live()
    }

    /// The client-side deadline. See [`LeaseHandle::deadline`].
    pub fn deadline(&self) -> tokio::time::Instant {
        self.handle.deadline()
    }

    /// Completes when the lease is lost.
    pub fn lost(&self) -> WaitForCancellationFutureOwned {
        self.handle.lost()
    }

    /// A token cancelled when the lease is lost.
    pub fn lost_token(&self) -> CancellationToken {
        self.handle.lost_token()
    }

    /// Why the lease was lost.
    pub fn lost_reason(&self) -> String {
        self.handle.lost_reason()
    }

    /// What the previous holder saved with this lock.
    pub fn checkpoint(&self) -> Option<&[u8]> {
        self.checkpoint.as_deref()
    }

    /// Saves a checkpoint for the next holder, fenced by this lease's token.
    /// At most 64 KiB (`leasehold_core::limits::MAX_CHECKPOINT_LEN`) on every
    /// backend; larger is refused with [`Error::InvalidArgument`] before
    /// anything is sent.
    pub async fn save_checkpoint(&self, data: &[u8]) -> Result<()> {
        leasehold_core::limits::validate_checkpoint(data)
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        if !self.is_live() {
            return Err(self.handle.lost_error());
        }
        match &self.hold {
            Some(hold) => hold.save_checkpoint(data).await,
            None => Err(self.handle.lost_error()),
        }
    }

    /// Releases the lock now. After a loss this returns [`Error::LeaseLost`];
    /// the ownership-checked release still goes out, and cannot touch a newer
    /// holder's lock. If no node took the release, or its answer was lost,
    /// this returns [`Error::Unavailable`] or [`Error::OutcomeUnknown`], and
    /// the leaseholdd backend keeps sending it in the background until it is
    /// answered or the lease ends.
    pub async fn release(mut self) -> Result<()> {
        let live = self.is_live();
        let released = match self.hold.take() {
            Some(hold) => hold.release().await,
            None => Ok(()),
        };
        if !live {
            return Err(self.handle.lost_error());
        }
        released
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(hold) = self.hold.take() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let key = self.handle.key.clone();
                runtime.spawn(async move {
                    if let Err(e) = hold.release().await {
                        tracing::debug!(%key, error = %e, "background release");
                    }
                });
            }
        }
    }
}
