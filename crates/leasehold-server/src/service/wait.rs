//! The wait protocol: how an acquire that queues hears its outcome.
//!
//! The rules, each for a failure the others do not cover:
//! 1. **Register before proposing.** The call registers for the wait's end
//!    with the hub before it proposes the acquire, so a grant applied in the
//!    same step is not missed.
//! 2. **A grant heard in a newer leadership is re-claimed.** A new leader
//!    gives waits a window to be re-attached and takes back a grant nobody
//!    comes for; a call that heard such a grant proposes its acquire again
//!    (same request id), and keeps the grant only once that is answered.
//! 3. **No outcome means withdraw, then report a timeout.** A call that heard
//!    nothing by its deadline withdraws the wait (which also takes back a
//!    grant made to it) and says it timed out only once the withdrawal took
//!    effect; otherwise the outcome is unknown and the caller retries with
//!    the same request, which re-attaches wherever the wait now lives.
//! 4. **Only the latest attempt withdraws.** A dropped call withdraws its
//!    wait ([`CancelOnDrop`]) unless a later attempt of the same wait (same
//!    lease, key and request id) replaced it, here or on another node.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Command, Grant, LeaseId, LockError, RequestId, WaitEnd};

use super::proposals::{Joined, Proposal, Queue, Take, Withdraw};
use super::{unexpected, AcquireArgs, ApiError, LockService};
use crate::hub::WaitResult;
use crate::raft::Consensus;

impl LockService {
    /// Acquires `args.key` (or the set `args.set`) under `lease` as a wait:
    /// registers for the outcome, proposes the acquire (the same request
    /// again, if it was proposed before: that re-attaches to the wait and
    /// answers a grant that came in between), and listens.
    pub(super) async fn wait(&self, lease: LeaseId, args: &AcquireArgs) -> Result<Grant, ApiError> {
        let command = args.command(lease);
        let hub = self.consensus.hub().clone();
        let outcome = hub.wait_for(lease, &args.key);
        let node_attempt = hub.attempt_begin(lease, &args.key, args.request_id);
        let mut cancel = CancelOnDrop {
            consensus: Some(self.consensus.clone()),
            lease,
            key: args.key.clone(),
            request_id: args.request_id,
            hub: hub.clone(),
            node_attempt,
            attempt: 0,
            ended: false,
        };
        let queued_at = std::time::Instant::now();
        let first = self.propose_as(Queue(command.clone())).await;
        let queued_in = self.consensus.read_local(|t| t.epoch()).await;
        let result = match first {
            Ok(Joined::Granted(grant)) => Ok(grant),
            Ok(Joined::Queued { attempt, .. }) => {
                cancel.attempt = attempt;
                // The table's own deadline ends the wait; the margin covers a
                // leader change that would lose the tick.
                let limit = Duration::from_millis(args.wait_ms) + Duration::from_secs(2);
                match tokio::time::timeout(limit, outcome).await {
                    Ok(Ok(WaitResult::Granted(grant)))
                        if self.consensus.read_local(|t| t.epoch()).await == queued_in =>
                    {
                        self.context.metrics.waited(queued_at.elapsed());
                        Ok(grant)
                    }
                    // A leadership began while this call waited: the new
                    // leader gave the wait a window to be re-attached
                    // (`REATTACH_MS`) and takes a grant made in it back
                    // unless its caller comes for it. This call heard the
                    // grant, perhaps on a node that no longer leads, but
                    // never came for it. It does now, with the same request:
                    // answered with the grant, which is then kept; or, here
                    // on a follower, refused, and the caller's retry at the
                    // leader re-attaches and is answered with it.
                    Ok(Ok(WaitResult::Granted(_))) => match self.propose_as(Take(command)).await {
                        Ok(grant) => {
                            self.context.metrics.waited(queued_at.elapsed());
                            Ok(grant)
                        }
                        Err(ApiError::Lock(e)) => Err(e.into()),
                        // Not confirmed: leave `cancel` armed. If this came
                        // back for the grant after all, it is a later attempt
                        // in the table, and the withdrawal leaves the grant
                        // to the caller's retry, or to the end of its lease.
                        Err(e) => {
                            hub.forget(lease, &args.key);
                            return Err(e);
                        }
                    },
                    Ok(Ok(WaitResult::Ended(WaitEnd::LeaseGone))) => {
                        Err(LockError::LeaseExpired { lease }.into())
                    }
                    Ok(Ok(WaitResult::Ended(_))) => Err(LockError::WaitTimeout {
                        key: args.key.clone(),
                    }
                    .into()),
                    // No outcome heard here (e.g. this node was cut off
                    // and another leads): the wait may have been granted
                    // elsewhere. Withdraw it now, and say it timed out only
                    // once the withdrawal took effect (it also takes back a
                    // grant made to this wait). Otherwise the outcome is
                    // unknown: the caller retries with the same request,
                    // which re-attaches wherever the wait now lives.
                    Ok(Err(_)) | Err(_) => {
                        hub.forget(lease, &args.key);
                        cancel.withdraw_now().await?;
                        return Err(LockError::WaitTimeout {
                            key: args.key.clone(),
                        }
                        .into());
                    }
                }
            }
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
}

/// Withdraws a wait when the waiting call is dropped before it saw an outcome.
///
/// Only the latest attempt of a wait withdraws it: a retry of the same
/// acquire (same lease, key and request id), here or through another node,
/// re-attaches to the wait in the table, and the earlier attempt, abandoned
/// by its caller, must not then withdraw the wait, or take back a grant, that
/// the retry is answering. The table numbers the attempts and ignores a
/// withdrawal by any but the latest; on this node, an attempt that a later
/// one here replaced does not propose one at all.
struct CancelOnDrop {
    consensus: Option<Consensus>,
    lease: LeaseId,
    key: String,
    request_id: RequestId,
    hub: Arc<crate::hub::Hub>,
    /// This attempt's number among the wait's attempts on this node.
    node_attempt: u64,
    /// Its number in the table, from its `Queued` answer; 0 while unknown
    /// (no answer came), which withdraws whichever attempt the wait has.
    attempt: u64,
    /// The attempt was ended by [`CancelOnDrop::withdraw_now`].
    ended: bool,
}

impl CancelOnDrop {
    /// Ends this attempt, and withdraws the wait now if it is the latest on
    /// this node. Fails when the withdrawal may not have taken effect.
    async fn withdraw_now(&mut self) -> Result<(), ApiError> {
        let Some(consensus) = self.consensus.take() else {
            return Ok(());
        };
        self.ended = true;
        let latest =
            self.hub
                .attempt_end(self.lease, &self.key, self.request_id, self.node_attempt);
        if !latest {
            // A retry of this wait is being answered on this node.
            return Ok(());
        }
        let command = Command::CancelWait {
            lease: self.lease,
            key: self.key.clone(),
            request_id: self.request_id,
            attempt: self.attempt,
        };
        let response = consensus.propose(command).await??;
        Withdraw::answer(response).map_err(unexpected)
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let latest =
            self.hub
                .attempt_end(self.lease, &self.key, self.request_id, self.node_attempt);
        let Some(consensus) = self.consensus.take() else {
            return;
        };
        if !latest {
            return;
        }
        let command = Command::CancelWait {
            lease: self.lease,
            key: std::mem::take(&mut self.key),
            request_id: self.request_id,
            attempt: self.attempt,
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
