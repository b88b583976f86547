//! Acquiring a key or a lock set on a session, and releasing the hold.

use std::sync::Arc;
use std::time::Duration;

use leasehold_proto::frame::Op;
use leasehold_proto::v1 as pb;
use tokio::time::Instant;

use super::errors::{error, unsettled};
use super::retry::{backoff, call_again, ATTEMPTS};
use super::session::Claim;
use super::settle::{release_request, settle_acquire, settle_release};
use super::Leaseholdd;
use crate::backend::endpoints::{Endpoints, Rpc};
use crate::backend::{Acquired, Hold, LockOptions};
use crate::{Error, Fence, Result};

/// How an acquire goes on trying while no node answers: [`ATTEMPTS`] times,
/// or, for one that waits, until its wait's deadline. A wait outlives the
/// call that carries it: if the server restarts or leadership moves, the
/// call breaks and is sent again with the same request id until the
/// deadline, which re-attaches to the place in the queue (the server keeps
/// it for a few seconds).
struct Retrying {
    wait_until: Option<Instant>,
    attempt: usize,
}

impl Retrying {
    fn new(wait: Option<Duration>) -> Retrying {
        Retrying {
            wait_until: wait.map(|w| Instant::now() + w),
            attempt: 0,
        }
    }

    /// What is left of the wait, in milliseconds (at least 1; 0: no wait).
    fn wait_ms(&self) -> u64 {
        self.wait_until.map_or(0, |until| {
            let left = until.saturating_duration_since(Instant::now());
            u64::try_from(left.as_millis()).unwrap_or(u64::MAX).max(1)
        })
    }

    /// Whether `e` leaves room for another try: nothing was done, or the
    /// outcome is open, and attempts or the wait are not spent.
    fn may_retry(&self, e: &Error) -> bool {
        unanswered(e)
            && (self.attempt + 1 < ATTEMPTS
                || self
                    .wait_until
                    .is_some_and(|until| Instant::now() + backoff(self.attempt + 1) < until))
    }

    async fn pause(&mut self) {
        self.attempt += 1;
        tokio::time::sleep(backoff(self.attempt)).await;
    }
}

/// Nothing was done, or it may have been: no answer to go by.
fn unanswered(e: &Error) -> bool {
    matches!(e, Error::Unavailable(_) | Error::OutcomeUnknown(_))
}

impl Leaseholdd {
    /// `key` claimed on the session for `ttl`, or, if this client already
    /// holds it there, on a lease of its own: this acquire is another holder.
    /// Takes `key`, or the lock set `set` (sorted, `key` its first) when
    /// not empty.
    pub(super) async fn acquire_keys(
        &self,
        key: &str,
        set: &[String],
        holder: &str,
        opts: &LockOptions,
        wait: Option<Duration>,
    ) -> Result<Acquired> {
        let request_id = rand::random::<u64>() | 1;
        let mut retrying = Retrying::new(wait);
        let mut renewed_session = false;
        loop {
            let claim = match self.claim_for(key, set, opts.ttl, holder).await {
                Ok(claim) => Arc::new(claim),
                // E.g. a pooled connection the restarted server had closed.
                Err(e) if retrying.may_retry(&e) => {
                    retrying.pause().await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let request = acquire_request(&claim, key, set, opts, retrying.wait_ms(), request_id);
            let e = match self.send_acquire(&request, &claim, key).await {
                Ok((fence, checkpoint)) => {
                    let liveness = claim.session.liveness.child();
                    let keys = if set.is_empty() {
                        vec![key.to_string()]
                    } else {
                        set.to_vec()
                    };
                    claim.granted(keys, liveness.clone());
                    return Ok(Acquired {
                        fence: Some(fence),
                        checkpoint,
                        liveness,
                        hold: Box::new(LeaseholddHold {
                            endpoints: self.endpoints.clone(),
                            key: key.to_string(),
                            fence,
                            claim,
                        }),
                    });
                }
                Err(e) => e,
            };
            let session = claim.session.clone();
            if session.private {
                Self::end_session(&self.endpoints, &session).await;
            }
            match e {
                e if retrying.may_retry(&e) => retrying.pause().await,
                // Given up with the outcome open: the wait may have been
                // granted, or may still be, to the session.
                e if unanswered(&e) && !session.private => {
                    settle_acquire(self.endpoints.clone(), claim, request);
                    return Err(e);
                }
                // The session expired under us (e.g. the server was down
                // longer than its TTL): start a new one, once.
                Error::LeaseLost { .. } if !renewed_session => {
                    session
                        .liveness
                        .lose("the server no longer knows this session");
                    renewed_session = true;
                }
                e => return Err(e),
            }
        }
    }

    /// The claim an acquire goes out under: `key` on the session for
    /// `ttl`, or a lock set on a lease of its own, ended with it.
    async fn claim_for(
        &self,
        key: &str,
        set: &[String],
        ttl: Duration,
        holder: &str,
    ) -> Result<Claim> {
        if set.is_empty() {
            return self.claim(key, ttl, holder).await;
        }
        let session = self.open_session(ttl, holder, true).await?;
        Claim::take(&session, key)
            .ok_or_else(|| Error::Other("a new lease already holds the key".into()))
    }

    /// Sends an acquire: framed when it does not wait, over gRPC when it
    /// does (a caller that gives up resets its stream, and the server
    /// withdraws the wait at once). Its token and the checkpoint it found.
    async fn send_acquire(
        &self,
        request: &pb::AcquireRequest,
        claim: &Arc<Claim>,
        key: &str,
    ) -> Result<(Fence, Option<Vec<u8>>)> {
        if request.wait_ms == 0 {
            return match self.endpoints.acquire(request, claim.clone()).await {
                Ok(r) => Ok((r.fence, r.checkpoint)),
                Err(e) => Err(e.into_error(key)),
            };
        }
        let call = |mut rpc: Rpc| {
            let request = request.clone();
            async move { rpc.acquire(request).await }
        };
        match self.endpoints.grpc(call).await {
            Ok(r) => Ok((r.fence, r.checkpoint)),
            Err(s) => Err(error(key, s)),
        }
    }
}

/// The acquire request for `key` (or the set `set`) under `claim`'s lease.
fn acquire_request(
    claim: &Claim,
    key: &str,
    set: &[String],
    opts: &LockOptions,
    wait_ms: u64,
    request_id: u64,
) -> pb::AcquireRequest {
    let (mode, permits) = crate::backend::wire_mode(opts.mode);
    pb::AcquireRequest {
        lease_id: claim.session.lease,
        key: if set.is_empty() {
            key.to_string()
        } else {
            String::new()
        },
        keys: set.to_vec(),
        wait_ms,
        lock_delay_ms: u64::try_from(opts.lock_delay.as_millis()).unwrap_or(u64::MAX),
        request_id,
        mode: mode.into(),
        permits,
        ..Default::default()
    }
}

pub(super) async fn release(endpoints: &Endpoints, key: &str, fence: Fence) -> Result<()> {
    call_again::<pb::ReleaseResponse>(endpoints, Op::Release, &release_request(key, fence), key)
        .await
        .map(drop)
}

struct LeaseholddHold {
    endpoints: Arc<Endpoints>,
    key: String,
    fence: Fence,
    /// The key on its session, held until this hold is gone.
    claim: Arc<Claim>,
}

#[async_trait::async_trait]
impl Hold for LeaseholddHold {
    async fn release(self: Box<Self>) -> Result<()> {
        // The session's renewal covers other locks too and goes on; the
        // release is ownership-checked by this hold's token. A lease made
        // for this lock alone ends with it.
        self.claim.releasing();
        let request = release_request(&self.key, self.fence);
        let released =
            call_again::<pb::ReleaseResponse>(&self.endpoints, Op::Release, &request, &self.key)
                .await
                .map(drop);
        if self.claim.session.private {
            Leaseholdd::end_session(&self.endpoints, &self.claim.session).await;
        } else if unsettled(&released) {
            // Left open, the key would stay held by a session that renews
            // other locks: settle it in the background.
            settle_release(self.endpoints.clone(), self.claim.clone(), request);
        }
        released
    }

    async fn save_checkpoint(&self, data: &[u8]) -> Result<()> {
        let request = pb::SaveCheckpointRequest {
            key: self.key.clone(),
            fence: self.fence,
            data: data.to_vec(),
        };
        // Saving the same bytes under the same token twice is saving them
        // once, so a call that found no leader or got no answer is retried.
        let op = Op::SaveCheckpoint;
        call_again::<pb::SaveCheckpointResponse>(&self.endpoints, op, &request, &self.key)
            .await
            .map(drop)
    }
}
