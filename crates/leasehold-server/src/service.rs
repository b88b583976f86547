//! The lock service's operations, shared by the gRPC and HTTP surfaces.
//!
//! Input is validated here, before anything reaches the log, so bad input
//! costs no disk write and changes nothing. The table validates again inside
//! `apply`, which keeps it safe whatever proposes to it.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::auth::{
    self, AuditEntry, AuthChange, AuthState, Permission, Role, Rule, TokenId, TokenView,
};
use leasehold_core::{
    limits, Command, Event, Fence, Grant, LeaseId, LeaseView, LockError, LockTable, LockView, Mode,
    RequestId, Response, WaitEnd,
};
use tokio::sync::broadcast;

use crate::auth_cache::Known;
use crate::hub::{Stamped, WaitResult};
use crate::raft::{ClusterStatus, Consensus, ConsensusError, NodeId};

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
    /// A node to add did not answer or catch up; it is not a member.
    #[error("{0}")]
    NotAdded(String),
    /// Plaintext on a port that speaks TLS only; nothing was done.
    #[error("{0}")]
    TlsRequired(String),
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
    /// How the hold shares the key.
    pub mode: Mode,
    /// A lock set: every one of these keys, all or nothing, with one token
    /// (then `key` is ignored and `mode` must be exclusive). Empty for one key.
    pub set: Vec<String>,
}

impl AcquireArgs {
    /// The command that acquires (or re-attaches to the wait) under `lease`.
    fn command(&self, lease: LeaseId) -> Command {
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
    /// A checkpoint save is acknowledged without being proposed.
    LostCheckpoint,
}

/// The operations, over a running consensus node, on behalf of whoever
/// presented [`bearer`](LockService::with_bearer) (nobody, by default).
///
/// With auth on, every call is checked against the caller's token: reads
/// inside the linearizable read, writes by the table when they apply (see
/// [`LockTable::authorize`]), so a token revoked a moment before is refused.
#[derive(Clone)]
pub struct LockService {
    consensus: Consensus,
    bearer: Option<Arc<str>>,
    /// Refuse callers from elsewhere while auth is off (`--require-auth`).
    require_auth: bool,
    /// The caller is on this machine.
    local: bool,
    /// The subject of the client certificate the caller showed, if any:
    /// named in the audit trail.
    certificate: Option<Arc<str>>,
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
            bearer: None,
            require_auth: false,
            local: false,
            certificate: None,
            #[cfg(feature = "planted-bugs")]
            planted: None,
        }
    }

    /// This service, refusing every caller that is not on this machine
    /// while auth is off (`--require-auth`): a node that listens on the
    /// network fails closed until an operator on it runs `auth enable`.
    pub fn requiring_auth(mut self, require: bool) -> Self {
        self.require_auth = require;
        self
    }

    /// This service for a caller on this machine (`local`) or elsewhere.
    pub fn from_local(&self, local: bool) -> LockService {
        LockService {
            local,
            ..self.clone()
        }
    }

    /// This service acting for the holder of `bearer` (a token, without
    /// the `Bearer ` scheme).
    pub fn with_bearer(&self, bearer: Option<&str>) -> LockService {
        LockService {
            bearer: bearer.map(Arc::from),
            ..self.clone()
        }
    }

    /// This service for a caller who showed a client certificate with this
    /// subject (or none).
    pub fn with_certificate(&self, subject: Option<Arc<str>>) -> LockService {
        LockService {
            certificate: subject,
            ..self.clone()
        }
    }

    /// The token this call acts for, by `auth`: `None` with auth off.
    fn caller(&self, auth: &AuthState) -> Result<Option<TokenId>, LockError> {
        if !auth.enabled() {
            return self.open_caller();
        }
        match &self.bearer {
            Some(bearer) => auth.authenticate(bearer).map(Some),
            None => Err(no_token()),
        }
    }

    /// The caller's token by this node's applied state: a check before
    /// anything is proposed, so a bad token costs no disk write. The table
    /// checks again when the command applies.
    async fn caller_here(&self) -> Result<Option<TokenId>, ApiError> {
        let cache = &self.consensus.hub().auth;
        let version = cache.version();
        match cache.get(version, self.bearer.as_ref()) {
            Some(Known::Off) => return Ok(self.open_caller()?),
            Some(Known::Token(answer)) => return Ok(answer.map(Some)?),
            Some(Known::Unknown) | None => {}
        }
        let (enabled, answer) = self
            .consensus
            .read_local(|t| {
                let auth = t.auth();
                let answer = self.bearer.as_ref().map(|b| auth.authenticate(b));
                (auth.enabled(), answer)
            })
            .await;
        cache.put(version, enabled, self.bearer.as_ref().zip(answer.clone()));
        if !enabled {
            return Ok(self.open_caller()?);
        }
        match answer {
            Some(answer) => Ok(answer.map(Some)?),
            None => Err(no_token().into()),
        }
    }

    /// The caller while auth is off: anyone, unless `--require-auth` keeps
    /// out callers from elsewhere.
    fn open_caller(&self) -> Result<Option<TokenId>, LockError> {
        if self.require_auth && !self.local {
            return Err(LockError::Unauthenticated {
                reason: "this node requires auth (--require-auth) and it is not enabled yet: run `leasehold auth enable` on the node's machine".to_string(),
            });
        }
        Ok(None)
    }

    /// Refuses a token this node does not know (with auth off, any token
    /// passes: it is not looked at).
    pub async fn check_token(&self) -> Result<(), ApiError> {
        self.caller_here().await.map(drop)
    }

    /// Checks, with a live token, that the caller may do `needed` on `key`.
    fn allowed(&self, t: &LockTable, key: &str, needed: Permission) -> Result<(), LockError> {
        let who = self.caller(t.auth())?;
        t.auth().check(who, key, needed)
    }

    /// A linearizable read on behalf of the caller.
    async fn read_as<T>(
        &self,
        f: impl FnOnce(&LockTable, Option<TokenId>, u64) -> Result<T, LockError>,
    ) -> Result<T, ApiError> {
        // A node that is not the leader refuses a token it knows is bad
        // before it says where the leader is.
        self.caller_here().await?;
        Ok(self
            .consensus
            .read(|t, now| {
                let who = self.caller(t.auth())?;
                f(t, who, now)
            })
            .await??)
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

    /// Proposes a caller's command, on behalf of its token. It is always
    /// wrapped, with auth off too: a leader that has not yet applied the
    /// entry that turned auth on still proposes it as the caller's, and the
    /// table refuses it there.
    async fn propose_as(&self, command: Command) -> Result<Response, ApiError> {
        let token = self.caller_here().await?;
        self.propose(Command::As {
            token,
            command: Box::new(command),
        })
        .await
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
            match self.propose_as(command).await? {
                Response::LeaseGranted { lease, ttl_ms } => Ok((lease, ttl_ms)),
                other => Err(unexpected(other)),
            }
        })
        .await
    }

    /// Renews a lease to its full TTL.
    pub async fn keep_alive(&self, lease: LeaseId) -> Result<u64, ApiError> {
        self.measured("keep_alive", async move {
            match self.propose_as(Command::KeepAlive { lease }).await? {
                Response::Renewed { ttl_ms } => Ok(ttl_ms),
                other => Err(unexpected(other)),
            }
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
            match self.propose_as(Command::Revoke { lease }).await? {
                Response::Revoked { released } => {
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
                }
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
            if !args.set.is_empty() {
                return self.acquire_set(args).await;
            }
            limits::validate_key(&args.key)?;
            limits::validate_wait(args.wait_ms, args.lock_delay_ms)?;
            limits::validate_mode(args.mode)?;
            let command = match &args.lease {
                LeaseSpec::Existing(lease) => args.command(*lease),
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
                        mode: args.mode,
                    }
                }
            };
            if args.wait_ms == 0 {
                return match self.propose_as(command).await? {
                    Response::Acquired(grant) => Ok(grant),
                    other => Err(unexpected(other)),
                };
            }
            let lease = match args.lease {
                LeaseSpec::Existing(lease) => lease,
                // The new lease's id is known only from the answer: queue (or
                // take the key) first, then wait as that lease.
                LeaseSpec::New { .. } => match self.propose_as(command).await? {
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
        limits::validate_wait(args.wait_ms, args.lock_delay_ms)?;
        if args.mode != Mode::Exclusive {
            return Err(ApiError::invalid(
                "mode",
                "a lock set is held exclusively, with one token",
            ));
        }
        let (lease, made) = match &args.lease {
            LeaseSpec::Existing(lease) => (*lease, false),
            LeaseSpec::New { ttl_ms, holder } => {
                let grant = Command::Grant {
                    ttl_ms: *ttl_ms,
                    holder: holder.clone(),
                    request_id: args.request_id,
                };
                match self.propose_as(grant).await? {
                    Response::LeaseGranted { lease, .. } => (lease, true),
                    other => return Err(unexpected(other)),
                }
            }
        };
        let result = if args.wait_ms == 0 {
            match self.propose_as(args.command(lease)).await {
                Ok(Response::Acquired(grant)) => Ok(grant),
                Ok(other) => Err(unexpected(other)),
                Err(e) => Err(e),
            }
        } else {
            self.wait(lease, &args).await
        };
        if made && result.is_err() {
            // Made for this set alone: do not leave it behind.
            let _ = self.propose(Command::Revoke { lease }).await;
        }
        result
    }

    /// Acquires `args.key` (or the set `args.set`) under `lease` as a wait:
    /// registers for the outcome, proposes the acquire (the same request
    /// again, if it was proposed before: that re-attaches to the wait and
    /// answers a grant that came in between), and listens.
    async fn wait(&self, lease: LeaseId, args: &AcquireArgs) -> Result<Grant, ApiError> {
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
        let first = self.propose_as(command.clone()).await;
        let queued_in = self.consensus.read_local(|t| t.epoch()).await;
        let result = match first {
            Ok(Response::Acquired(grant)) => Ok(grant),
            Ok(Response::Queued { attempt, .. }) => {
                cancel.attempt = attempt;
                // The table's own deadline ends the wait; the margin covers a
                // leader change that would lose the tick.
                let limit = Duration::from_millis(args.wait_ms) + Duration::from_secs(2);
                match tokio::time::timeout(limit, outcome).await {
                    Ok(Ok(WaitResult::Granted(grant)))
                        if self.consensus.read_local(|t| t.epoch()).await == queued_in =>
                    {
                        hub.metrics.waited(queued_at.elapsed());
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
                    Ok(Ok(WaitResult::Granted(_))) => match self.propose_as(command).await {
                        Ok(Response::Acquired(grant)) => {
                            hub.metrics.waited(queued_at.elapsed());
                            Ok(grant)
                        }
                        Ok(other) => Err(unexpected(other)),
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
                    .await
                    .and_then(|l| l.holder)
                    .map_or(fence, |h| h.fence),
                _ => fence,
            };
            match self
                .propose_as(Command::Release {
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
            #[cfg(feature = "planted-bugs")]
            if self.planted == Some(PlantedBug::LostCheckpoint) {
                return Ok(());
            }
            match self
                .propose_as(Command::SaveCheckpoint { key, fence, data })
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
            return Ok(self.consensus.read_local(|t| t.lock(key, 0)).await);
        }
        self.read_as(|t, who, now| {
            t.auth().check(who, key, Permission::Read)?;
            Ok(t.lock(key, now))
        })
        .await
    }

    /// Locks under a prefix, in key order, after the key `start_after`; and
    /// the cursor for the next page (the last key), if there are more. With
    /// `held_only`, only keys held or waited for.
    pub async fn locks(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
        held_only: bool,
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
            .read_as(|t, who, now| {
                let visible = |key: &str| {
                    t.auth()
                        .permission(who, key)
                        .is_ok_and(|p| p >= Permission::Read)
                };
                Ok(t.locks_where(prefix, start_after, limit + 1, now, held_only, visible))
            })
            .await?;
        let next = (items.len() > limit).then(|| {
            items.truncate(limit);
            items.last().map(|l| l.key.clone()).unwrap_or_default()
        });
        Ok(Page { items, next })
    }

    /// One live lease; the same error as a keepalive for one that is not.
    pub async fn lease(&self, id: LeaseId) -> Result<LeaseView, ApiError> {
        self.read_as(|t, who, now| {
            let view = t.lease(id, now).ok_or_else(|| t.no_lease(id))?;
            if !sees_lease(t.auth(), who, view.owner) {
                return Err(LockError::NotOwner { lease: id });
            }
            Ok(view)
        })
        .await
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
            .read_as(|t, who, now| {
                let visible = |owner| sees_lease(t.auth(), who, owner);
                Ok(t.leases_where(start_after, limit + 1, LIST_KEYS_PER_LEASE, now, visible))
            })
            .await?;
        let next = (items.len() > limit).then(|| {
            items.truncate(limit);
            items.last().map_or(0, |l| l.lease)
        });
        Ok(Page { items, next })
    }

    /// Lock events from now on, for keys under `prefix` that the caller
    /// may read. With auth on, the watch ends (`unauthenticated`) when its
    /// token is revoked, and follows changes to its role.
    pub async fn watch(&self, prefix: String) -> Result<Watch, ApiError> {
        validate_prefix(&prefix)?;
        // Subscribe first: an auth change from here on is seen as an event.
        let rx = self.consensus.hub().subscribe();
        let access = self.consensus.read_local(|t| self.access(t.auth())).await?;
        Ok(Watch {
            rx,
            prefix,
            access,
            service: self.clone(),
        })
    }

    /// The last lock events this node applied (at most
    /// [`RECENT_EVENTS`](crate::hub::RECENT_EVENTS)), oldest first, for keys
    /// under `prefix` that the caller may read: what happened just before
    /// a watch began.
    pub async fn recent_events(&self, prefix: &str) -> Result<Vec<WatchEvent>, ApiError> {
        validate_prefix(prefix)?;
        let access = self.consensus.read_local(|t| self.access(t.auth())).await?;
        Ok(self
            .consensus
            .hub()
            .recent()
            .into_iter()
            .filter_map(|e| watch_event(e, prefix, &access))
            .collect())
    }

    /// What the caller may read, to filter a watch.
    fn access(&self, auth: &AuthState) -> Result<Access, LockError> {
        let Some(token) = self.caller(auth)? else {
            return Ok(Access::All);
        };
        if auth.highest(Some(token))? < Permission::Read {
            return Err(LockError::PermissionDenied {
                key: String::new(),
                needed: Permission::Read,
            });
        }
        let role = auth.token_role(token).cloned().unwrap_or_default();
        Ok(Access::Role(role))
    }

    // ---- cluster ----

    /// Members, roles, term, leader and lag: for any caller with a live token.
    pub async fn cluster_status(&self) -> Result<ClusterStatus, ApiError> {
        self.caller_here().await?;
        Ok(self.consensus.cluster_status())
    }

    /// Adds a member (admin on every key).
    pub async fn add_member(&self, id: NodeId, addr: String) -> Result<ClusterStatus, ApiError> {
        let who = self.admin_here().await?;
        let what = format!("member {id} at {addr} added");
        let status = self.consensus.add_member(id, addr).await?;
        audit(&who, &what);
        Ok(status)
    }

    /// Removes a member (admin on every key).
    pub async fn remove_member(&self, id: NodeId) -> Result<ClusterStatus, ApiError> {
        let who = self.admin_here().await?;
        let status = self.consensus.remove_member(id).await?;
        audit(&who, &format!("member {id} removed"));
        Ok(status)
    }

    /// Checks the caller has admin on every key; who it is, for the audit log.
    async fn admin_here(&self) -> Result<String, ApiError> {
        Ok(self
            .consensus
            .read_local(|t| {
                self.allowed(t, "", Permission::Admin)?;
                let who = t.auth().who(self.caller(t.auth())?);
                Ok::<_, LockError>(match &self.certificate {
                    Some(subject) => format!("{who}, certificate {subject:?}"),
                    None => who,
                })
            })
            .await?)
    }

    // ---- auth ----

    /// Proposes a change to auth on behalf of the caller (anyone while auth
    /// is off; then admin on every key). Returns the token it created.
    async fn change_auth(&self, change: AuthChange) -> Result<Option<TokenId>, ApiError> {
        let at_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        // A repeated enable needs no token: the table answers it if it
        // names the root token's secret, and refuses it otherwise.
        let enable = matches!(change, AuthChange::Enable { .. });
        let token = match self.caller_here().await {
            Err(_) if enable && self.consensus.read_local(|t| t.auth().enabled()).await => None,
            caller => caller?,
        };
        let change = match &self.certificate {
            Some(subject) => Command::AuthWithCertificate {
                change,
                at_unix_ms,
                subject: subject.to_string(),
            },
            None => Command::Auth { change, at_unix_ms },
        };
        let command = Command::As {
            token,
            command: Box::new(change),
        };
        self.measured("auth", async move {
            match self.propose(command).await? {
                Response::AuthChanged { token } => Ok(token),
                other => Err(unexpected(other)),
            }
        })
        .await
    }

    /// Turns auth on; returns the root token (admin on every key), which is
    /// shown this once and stored only as a hash. With `secret` (chosen by
    /// the caller), a retry whose first answer was lost is answered with the
    /// same token.
    pub async fn enable_auth(&self, secret: Option<String>) -> Result<NewToken, ApiError> {
        let secret = secret_or_new(secret)?;
        let root_hash = auth::hash_secret(&secret);
        let id = self
            .change_auth(AuthChange::Enable { root_hash })
            .await?
            .ok_or_else(|| ApiError::Internal("no root token was made".into()))?;
        Ok(NewToken {
            id,
            token: auth::token_string(id, &secret),
        })
    }

    /// Turns auth off.
    pub async fn disable_auth(&self) -> Result<(), ApiError> {
        self.change_auth(AuthChange::Disable).await.map(drop)
    }

    /// Creates a role or replaces its rules.
    pub async fn set_role(&self, name: String, rules: Vec<Rule>) -> Result<(), ApiError> {
        self.change_auth(AuthChange::SetRole { name, rules })
            .await
            .map(drop)
    }

    /// Deletes a role that no token uses.
    pub async fn delete_role(&self, name: String) -> Result<(), ApiError> {
        self.change_auth(AuthChange::DeleteRole { name })
            .await
            .map(drop)
    }

    /// Creates a token for `role`; its secret is shown this once. With
    /// `secret` (chosen by the caller), a retry is answered with the token
    /// the first attempt made.
    pub async fn create_token(
        &self,
        name: String,
        role: String,
        secret: Option<String>,
    ) -> Result<NewToken, ApiError> {
        let secret = secret_or_new(secret)?;
        let hash = auth::hash_secret(&secret);
        let id = self
            .change_auth(AuthChange::CreateToken { name, role, hash })
            .await?
            .ok_or_else(|| ApiError::Internal("no token was made".into()))?;
        Ok(NewToken {
            id,
            token: auth::token_string(id, &secret),
        })
    }

    /// Revokes a token: every node refuses it once the revocation applies there.
    pub async fn revoke_token(&self, id: TokenId) -> Result<(), ApiError> {
        self.change_auth(AuthChange::RevokeToken { id })
            .await
            .map(drop)
    }

    /// Auth as it stands: on or off, roles, tokens (never their secrets or
    /// hashes), the audit trail. With auth on, for admin on every key.
    pub async fn auth_state(&self) -> Result<AuthView, ApiError> {
        self.read_as(|t, who, _| {
            let auth = t.auth();
            auth.check(who, "", Permission::Admin)?;
            Ok(AuthView {
                enabled: auth.enabled(),
                roles: auth
                    .roles()
                    .iter()
                    .map(|(name, role)| RoleView {
                        name: name.clone(),
                        rules: role.rules.clone(),
                    })
                    .collect(),
                tokens: auth.tokens(),
                audit: auth.audit().iter().cloned().collect(),
                caller: who,
            })
        })
        .await
    }
}

/// An admin act outside the replicated audit trail (membership, another
/// token's lease), in this node's log.
fn audit(who: &str, what: &str) {
    tracing::info!(target: "leasehold::audit", who, "{what}");
}

fn no_token() -> LockError {
    LockError::Unauthenticated {
        reason: "auth is enabled: present a token (authorization: Bearer <token>)".to_string(),
    }
}

/// Whether `who` may see a lease owned by `owner`: its own, or any with read
/// on every key.
fn sees_lease(auth: &AuthState, who: Option<TokenId>, owner: Option<TokenId>) -> bool {
    who.is_none()
        || owner == who
        || auth
            .permission(who, "")
            .is_ok_and(|p| p >= Permission::Read)
}

/// A caller's secret for a new token, checked, or 32 random bytes in hex.
fn secret_or_new(secret: Option<String>) -> Result<String, ApiError> {
    let Some(secret) = secret else {
        use rand::RngCore;
        let mut bytes = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        return Ok(bytes.iter().map(|b| format!("{b:02x}")).collect());
    };
    let allowed = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    if !(32..=256).contains(&secret.len()) || !secret.chars().all(allowed) {
        return Err(ApiError::invalid(
            "secret",
            "must be 32 to 256 characters of A-Z, a-z, 0-9, - and _ (e.g. 32 random bytes in hex)",
        ));
    }
    Ok(secret)
}

/// A token just made: its id and the whole token, shown once.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NewToken {
    /// The id, to revoke it by.
    pub id: TokenId,
    /// `lh_<id>_<secret>`, to present as `Authorization: Bearer <token>`.
    pub token: String,
}

/// A role and its rules.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RoleView {
    /// Its name.
    pub name: String,
    /// Its rules, by prefix.
    pub rules: Vec<Rule>,
}

/// Auth as `auth_state` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AuthView {
    /// Whether auth is on.
    pub enabled: bool,
    /// The roles.
    pub roles: Vec<RoleView>,
    /// The live tokens.
    pub tokens: Vec<TokenView>,
    /// The audit trail, oldest first (the last [`auth::AUDIT_CAPACITY`]).
    pub audit: Vec<AuditEntry>,
    /// The caller's token, if auth is on.
    pub caller: Option<TokenId>,
}

/// What a watcher may see.
enum Access {
    /// Everything: auth is off.
    All,
    /// What this role may read.
    Role(Role),
}

/// A key prefix (for lists and watches) is held to the key's length limit.
fn validate_prefix(prefix: &str) -> Result<(), ApiError> {
    Ok(limits::validate_prefix(prefix)?)
}

/// A subscription to lock events under a prefix.
pub struct Watch {
    rx: broadcast::Receiver<Stamped>,
    prefix: String,
    access: Access,
    service: LockService,
}

/// What a watcher sees.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WatchEvent {
    /// `acquired`, `released`, `expired`, or `checkpoint` (a holder saved
    /// one: an election's leader proclaiming its value, for one).
    pub kind: &'static str,
    /// The key.
    pub key: String,
    /// The token of the hold that began, ended or saved.
    pub fence: Fence,
    /// The lease of that hold.
    pub lease: LeaseId,
    /// Its holder's name.
    pub holder: String,
    /// When the node answering applied it, in Unix milliseconds on its
    /// wall clock.
    pub at_unix_ms: u64,
    /// With `checkpoint`: the bytes saved.
    #[serde(skip)]
    pub data: Option<Vec<u8>>,
    /// With `checkpoint`: the bytes saved, in base64 (HTTP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_base64: Option<String>,
}

impl Watch {
    /// The next event, or an error if this watcher fell too far behind (its
    /// events were dropped) or the server is stopping.
    pub async fn next(&mut self) -> Result<WatchEvent, ApiError> {
        loop {
            let stamped = match self.rx.recv().await {
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
            if let Event::AuthChanged { .. } = stamped.event {
                // The token may be gone, or its role changed.
                let service = &self.service;
                self.access = service
                    .consensus
                    .read_local(|t| service.access(t.auth()))
                    .await?;
                continue;
            }
            if let Some(event) = watch_event(stamped, &self.prefix, &self.access) {
                return Ok(event);
            }
        }
    }
}

/// What a watcher with `access` to keys under `prefix` sees of an event:
/// nothing unless it is a lock event on such a key.
fn watch_event(stamped: Stamped, prefix: &str, access: &Access) -> Option<WatchEvent> {
    let mut data = None;
    let (kind, key, fence, lease, holder) = match stamped.event {
        Event::CheckpointSaved {
            key,
            fence,
            lease,
            holder,
            data: saved,
        } => {
            data = Some(saved.to_vec());
            ("checkpoint", key, fence, lease, holder)
        }
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
        _ => return None,
    };
    let visible = match access {
        Access::All => true,
        Access::Role(role) => role.permission(&key) >= Permission::Read,
    };
    if !visible || !key.starts_with(prefix) {
        return None;
    }
    use base64::Engine;
    let data_base64 = data
        .as_ref()
        .map(|d| base64::engine::general_purpose::STANDARD.encode(d));
    Some(WatchEvent {
        kind,
        key: key.to_string(),
        fence,
        lease,
        holder: holder.to_string(),
        at_unix_ms: stamped.at_unix_ms,
        data,
        data_base64,
    })
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
        match consensus.propose(command).await {
            Ok(Ok(Response::WaitCancelled)) => Ok(()),
            Ok(Ok(other)) => Err(unexpected(other)),
            Ok(Err(e)) => Err(e.into()),
            Err(e) => Err(e.into()),
        }
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
