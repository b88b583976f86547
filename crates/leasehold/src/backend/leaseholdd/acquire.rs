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
        // A wait outlives the call that carries it: if the server restarts or
        // leadership moves, the call breaks and is retried with the same
        // request id until the wait's deadline, which re-attaches to the
        // place in the queue (the server keeps it for a few seconds).
        let wait_until = wait.map(|w| Instant::now() + w);
        let wait_left = || {
            wait_until.map_or(0, |until| {
                let left = until.saturating_duration_since(Instant::now());
                u64::try_from(left.as_millis()).unwrap_or(u64::MAX).max(1)
            })
        };
        let retry_unavailable = |attempt: usize| {
            attempt + 1 < ATTEMPTS
                || wait_until.is_some_and(|until| Instant::now() + backoff(attempt + 1) < until)
        };
        let mut renewed_session = false;
        let mut attempt = 0;
        let lock_delay_ms = u64::try_from(opts.lock_delay.as_millis()).unwrap_or(u64::MAX);
        let (mode, permits) = crate::backend::wire_mode(opts.mode);
        loop {
            // A set goes out under a lease of its own, ended with it.
            let claim = if set.is_empty() {
                self.claim(key, opts.ttl, holder).await
            } else {
                self.open_session(opts.ttl, holder, true)
                    .await
                    .and_then(|s| {
                        Claim::take(&s, key)
                            .ok_or_else(|| Error::Other("a new lease already holds the key".into()))
                    })
            };
            let claim = match claim {
                Ok(c) => Arc::new(c),
                // E.g. a pooled connection the restarted server had closed.
                Err(Error::Unavailable(_) | Error::OutcomeUnknown(_))
                    if retry_unavailable(attempt) =>
                {
                    attempt += 1;
                    tokio::time::sleep(backoff(attempt)).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let session = claim.session.clone();
            let wait_ms = wait_left();
            let request = pb::AcquireRequest {
                lease_id: session.lease,
                key: if set.is_empty() {
                    key.to_string()
                } else {
                    String::new()
                },
                keys: set.to_vec(),
                wait_ms,
                lock_delay_ms,
                request_id,
                mode: mode.into(),
                permits,
                ..Default::default()
            };
            let granted = if wait_ms == 0 {
                match self.endpoints.acquire(&request, claim.clone()).await {
                    Ok(r) => Ok((r.fence, r.checkpoint)),
                    Err(e) => Err(e.into_error(key)),
                }
            } else {
                let call = |mut rpc: Rpc| {
                    let request = request.clone();
                    async move { rpc.acquire(request).await }
                };
                match self.endpoints.grpc(call).await {
                    Ok(r) => Ok((r.fence, r.checkpoint)),
                    Err(s) => Err(error(key, s)),
                }
            };
            match granted {
                Ok((fence, checkpoint)) => {
                    return Ok(Acquired {
                        fence: Some(fence),
                        checkpoint,
                        liveness: session.liveness.child(),
                        hold: Box::new(LeaseholddHold {
                            endpoints: self.endpoints.clone(),
                            key: key.to_string(),
                            fence,
                            claim,
                        }),
                    });
                }
                Err(e) => {
                    if session.private {
                        Self::end_session(&self.endpoints, &session).await;
                    }
                    let open = matches!(e, Error::Unavailable(_) | Error::OutcomeUnknown(_));
                    if open && !session.private && !retry_unavailable(attempt) {
                        // Given up with the outcome open: the wait may have
                        // been granted, or may still be, to the session.
                        settle_acquire(self.endpoints.clone(), claim.clone(), request.clone());
                        return Err(e);
                    }
                    match e {
                        // The session expired under us (e.g. the server was down
                        // longer than its TTL): start a new one, once.
                        Error::LeaseLost { .. } if !renewed_session => {
                            session
                                .liveness
                                .lose("the server no longer knows this session");
                            renewed_session = true;
                        }
                        Error::Unavailable(_) | Error::OutcomeUnknown(_)
                            if retry_unavailable(attempt) =>
                        {
                            attempt += 1;
                            tokio::time::sleep(backoff(attempt)).await;
                        }
                        e => return Err(e),
                    }
                }
            }
        }
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
