//! Leases and locks: grant, keep alive and revoke a lease; acquire (at
//! once, or through the wait protocol in `wait`), release, and save a
//! checkpoint.

use leasehold_core::{limits, Command, Fence, Grant, LeaseId, LockError, Mode, RequestId};

use super::proposals::{Joined, NewLease, Proposal, Queue, Release, Renew, Revoke, Save, Take};
#[cfg(feature = "planted-bugs")]
use super::PlantedBug;
use super::{audit, ApiError, LockService};

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
    /// How the hold shares the key.
    pub mode: Mode,
    /// A lock set: every one of these keys, all or nothing, with one token
    /// (then `key` is ignored and `mode` must be exclusive). Empty for one key.
    pub set: Vec<String>,
}

impl AcquireArgs {
    /// The command that acquires (or re-attaches to the wait) under `lease`.
    pub(super) fn command(&self, lease: LeaseId) -> Command {
        if self.set.is_empty() {
            Command::Acquire {
                lease,
                key: self.key.clone(),
                wait_ms: self.wait_ms,
                lock_delay_ms: self.lock_delay_ms,
                request_id: self.request_id,
                mode: self.mode,
            }
        } else {
            Command::AcquireSet {
                lease,
                keys: self.set.clone(),
                wait_ms: self.wait_ms,
                lock_delay_ms: self.lock_delay_ms,
                request_id: self.request_id,
            }
        }
    }
}

/// One lease's answer in [`LockService::keep_alive_many`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewal {
    /// The lease.
    pub lease: LeaseId,
    /// Its TTL and how many keys it holds, or why it was not renewed.
    pub answer: Result<(u64, u64), LockError>,
}

impl LockService {
    /// Creates a lease. A retry with the same `request_id` (and the same TTL
    /// and holder) answers with the lease the first one made.
    pub async fn grant(
        &self,
        ttl_ms: u64,
        holder: String,
        request_id: RequestId,
    ) -> Result<(LeaseId, u64), ApiError> {
        self.measured("grant", async move {
            let grant = Command::Grant {
                ttl_ms,
                holder: holder.clone(),
                request_id,
            };
            self.admit(&[grant]).await?;
            let lease = NewLease {
                ttl_ms,
                holder,
                request_id,
            };
            self.propose_as(lease).await
        })
        .await
    }

    /// Renews a lease to its full TTL: its TTL, and how many keys it holds.
    pub async fn keep_alive(&self, lease: LeaseId) -> Result<(u64, u64), ApiError> {
        self.measured(
            "keep_alive",
            async move { self.propose_as(Renew(lease)).await },
        )
        .await
    }

    /// Renews many leases in one call, each answered as [`keep_alive`]
    /// would answer it alone, in the order asked; a lease named twice is
    /// renewed once. They go into the log together, in as few entries as
    /// they fit: what one call saves is the call and the proposal per
    /// lease, not the renewal. A failure of the whole (this node does not lead, the
    /// outcome is unknown, the caller's token is refused) fails the call:
    /// renewing again is always safe.
    ///
    /// [`keep_alive`]: LockService::keep_alive
    pub async fn keep_alive_many(&self, leases: Vec<LeaseId>) -> Result<Vec<Renewal>, ApiError> {
        self.measured("keep_alive_many", async move {
            if leases.len() > limits::MAX_RENEWALS_PER_CALL {
                return Err(ApiError::invalid(
                    "lease_ids",
                    format!(
                        "names {} leases; at most {} in one call: split it",
                        leases.len(),
                        limits::MAX_RENEWALS_PER_CALL
                    ),
                ));
            }
            let token = self.caller_here().await?;
            let mut distinct = leases.clone();
            distinct.sort_unstable();
            distinct.dedup();
            let renewals = distinct
                .iter()
                .map(|&lease| Command::As {
                    token,
                    command: Box::new(Command::KeepAlive { lease }),
                })
                .collect();
            let outcomes = self.consensus.propose_urgent(renewals).await?;
            let mut answers = std::collections::HashMap::with_capacity(distinct.len());
            for (lease, outcome) in distinct.into_iter().zip(outcomes) {
                let answer = match outcome {
                    Ok(response) => Ok(Renew::answer(response).map_err(super::unexpected)?),
                    Err(refused) => Err(refused),
                };
                answers.insert(lease, answer);
            }
            Ok(leases
                .into_iter()
                .map(|lease| Renewal {
                    lease,
                    answer: answers
                        .get(&lease)
                        .cloned()
                        .unwrap_or(Err(LockError::LeaseNotFound { lease })),
                })
                .collect())
        })
        .await
    }

    /// Ends a lease, releasing its locks.
    pub async fn revoke(&self, lease: LeaseId) -> Result<Vec<String>, ApiError> {
        self.measured("revoke", async move {
            // Revoking another token's lease is an admin act: audited.
            let others = self
                .consensus
                .read_local(|t| {
                    let who = self.caller(t.auth()).ok().flatten()?;
                    let owner = t.lease(lease, t.now())?.owner;
                    (owner != Some(who)).then(|| (t.auth().who(Some(who)), t.auth().who(owner)))
                })
                .await;
            let released = self.propose_as(Revoke(lease)).await?;
            if let Some((who, owner)) = others {
                audit(
                    &who,
                    &format!(
                        "lease {lease} of {owner} revoked, releasing {} keys",
                        released.len()
                    ),
                );
            }
            Ok(released)
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
            if !args.set.is_empty() {
                let mut asks = Vec::new();
                if let LeaseSpec::New { ttl_ms, holder } = &args.lease {
                    asks.push(Command::Grant {
                        ttl_ms: *ttl_ms,
                        holder: holder.clone(),
                        request_id: args.request_id,
                    });
                }
                let lease = match args.lease {
                    LeaseSpec::Existing(lease) => lease,
                    LeaseSpec::New { .. } => 0,
                };
                asks.push(args.command(lease));
                self.admit(&asks).await?;
                return self.acquire_set(args).await;
            }
            let command = match &args.lease {
                LeaseSpec::Existing(lease) => args.command(*lease),
                LeaseSpec::New { ttl_ms, holder } => Command::GrantAndAcquire {
                    ttl_ms: *ttl_ms,
                    holder: holder.clone(),
                    key: args.key.clone(),
                    wait_ms: args.wait_ms,
                    lock_delay_ms: args.lock_delay_ms,
                    request_id: args.request_id,
                    mode: args.mode,
                },
            };
            // Checked before the wait registers for an outcome.
            command.validate()?;
            self.admit(std::slice::from_ref(&command)).await?;
            if args.wait_ms == 0 {
                return self.propose_as(Take(command)).await;
            }
            let lease = match args.lease {
                LeaseSpec::Existing(lease) => lease,
                // The new lease's id is known only from the answer: queue (or
                // take the key) first, then wait as that lease.
                LeaseSpec::New { .. } => match self.propose_as(Queue(command)).await? {
                    Joined::Granted(grant) => return Ok(grant),
                    Joined::Queued { lease, .. } => {
                        let waited = self.wait(lease, &args).await;
                        if waited.is_err() {
                            // Made for this lock alone: do not leave it behind.
                            let _ = self.propose(Revoke(lease)).await;
                        }
                        return waited;
                    }
                },
            };
            self.wait(lease, &args).await
        })
        .await
    }

    /// A lock set: every key of `args.set`, all or nothing, one token. A
    /// new lease for it is granted first, and revoked if the set is not
    /// granted; a wait listens on the set's first key, since every key of
    /// a set is granted in one step.
    async fn acquire_set(&self, mut args: AcquireArgs) -> Result<Grant, ApiError> {
        if !args.key.is_empty() {
            return Err(ApiError::invalid(
                "key",
                "give one `key`, or a set of `keys`, not both",
            ));
        }
        args.set = limits::validate_set(&args.set)?;
        args.key = match args.set.first() {
            Some(first) => first.clone(),
            None => return Err(ApiError::invalid("keys", "a lock set needs a key")),
        };
        // Checked before a lease is granted for it.
        args.command(0).validate()?;
        if args.mode != Mode::Exclusive {
            return Err(ApiError::invalid(
                "mode",
                "a lock set is held exclusively, with one token",
            ));
        }
        let (lease, made) = match &args.lease {
            LeaseSpec::Existing(lease) => (*lease, false),
            LeaseSpec::New { ttl_ms, holder } => {
                let lease = NewLease {
                    ttl_ms: *ttl_ms,
                    holder: holder.clone(),
                    request_id: args.request_id,
                };
                (self.propose_as(lease).await?.0, true)
            }
        };
        let result = if args.wait_ms == 0 {
            self.propose_as(Take(args.command(lease))).await
        } else {
            self.wait(lease, &args).await
        };
        if made && result.is_err() {
            // Made for this set alone: do not leave it behind.
            let _ = self.propose(Revoke(lease)).await;
        }
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
            #[cfg(feature = "planted-bugs")]
            let fence = match self.planted {
                Some(PlantedBug::BlindRelease) => self
                    .consensus
                    .read_local(|t| t.lock(&key, 0))
                    .await
                    .and_then(|l| l.holder)
                    .map_or(fence, |h| h.fence),
                _ => fence,
            };
            let release = Release {
                key,
                fence,
                request_id,
            };
            self.propose_as(release).await
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
            #[cfg(feature = "planted-bugs")]
            if self.planted == Some(PlantedBug::LostCheckpoint) {
                return Ok(());
            }
            self.admit(&[]).await?;
            self.propose_as(Save { key, fence, data }).await
        })
        .await
    }
}
