//! The lock service's operations, shared by the gRPC and HTTP surfaces.
//!
//! Input is validated here, before anything reaches the log, so bad input
//! costs no disk write and changes nothing. The table validates again inside
//! `apply`, which keeps it safe whatever proposes to it.
//!
//! # Layout
//! - this file: [`LockService`], the caller it acts for (token, client
//!   certificate, this machine or not) and how it reads and proposes;
//! - `locks`: leases and locks: grant, keep alive, revoke, acquire, release,
//!   checkpoints;
//! - `wait`: the wait protocol of a queued acquire, and its rules;
//! - `reads`: one lock or lease, and lists of them a page at a time;
//! - `watch`: lock events as they happen, and the node's recent ones;
//! - `cluster`: membership;
//! - `auth`: roles, tokens and the audit trail;
//! - `proposals`: each command proposed, typed with the answer it gets;
//! - `errors`: [`ApiError`], what every operation fails with.

mod auth;
mod cluster;
mod errors;
mod locks;
mod proposals;
mod reads;
mod wait;
mod watch;

use std::sync::Arc;

use leasehold_core::auth::{AuthState, Permission, TokenId};
use leasehold_core::{Command, Growth, LockError, LockTable};

use crate::admission::{Quotas, Usage};
use crate::auth_cache::Known;
use crate::context::NodeContext;
use crate::raft::Consensus;
use proposals::Proposal;

pub use auth::{AuthView, NewToken, RoleView};
use errors::unexpected;
pub use errors::ApiError;
pub use locks::{AcquireArgs, LeaseSpec, Renewal};
pub use reads::{Page, LIST_KEYS_PER_LEASE, MAX_LIST};
pub use watch::{resume_point, Watch, WatchEvent};

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
    /// The node's metrics and auth cache.
    context: Arc<NodeContext>,
    bearer: Option<Arc<str>>,
    /// Refuse callers from elsewhere while auth is off (`--require-auth`).
    require_auth: bool,
    /// The caller is on this machine.
    local: bool,
    /// The subject of the client certificate the caller showed, if any:
    /// named in the audit trail.
    certificate: Option<Arc<str>>,
    /// How many of this connection's refusals may be held back at once
    /// (`Admission::hold_back`); `None`: the node's bound only.
    held_back: Option<Arc<tokio::sync::Semaphore>>,
    #[cfg(feature = "planted-bugs")]
    planted: Option<PlantedBug>,
}

impl LockService {
    /// Serves operations from `consensus`, counting them in `context`'s
    /// metrics and checking tokens through its cache.
    pub fn new(consensus: Consensus, context: Arc<NodeContext>) -> Self {
        LockService {
            consensus,
            context,
            bearer: None,
            require_auth: false,
            local: false,
            certificate: None,
            held_back: None,
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

    /// This service for one connection that carries up to `places` calls
    /// at once: at most a quarter of them may be refusals held back.
    pub fn for_connection(&self, places: usize) -> LockService {
        LockService {
            held_back: Some(Arc::new(tokio::sync::Semaphore::new((places / 4).max(1)))),
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
        let cache = &self.context.auth;
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

    /// The node's metrics and auth cache.
    pub fn context(&self) -> &NodeContext {
        &self.context
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
        self.context.metrics.request(op, code, started.elapsed());
        result
    }

    /// Refuses a request if what it asks (`asks`, its commands in order)
    /// would grow the table past a quota, or it comes too fast from its
    /// token (`crate::admission`). Checked against what this node applied:
    /// on the leader, the table as it stands. A request that starts with a
    /// grant the table already answered is a retry, and so is the rest of it.
    async fn admit(&self, asks: &[Command]) -> Result<(), ApiError> {
        let admission = &self.context.admission;
        if *admission.quotas() == Quotas::default() {
            return Ok(());
        }
        let (token, role, growth, usage) = self
            .consensus
            .read_local(|t| {
                let token = self.caller(t.auth()).ok().flatten();
                let usage = Usage {
                    leases: t.lease_count(),
                    locks: t.held_count(),
                    waiters: t.waiter_count(),
                    token: token.map(|token| t.owned_by(token)).unwrap_or_default(),
                };
                let mut growth = Growth::default();
                for (i, ask) in asks.iter().enumerate() {
                    let more = t.growth(ask, token);
                    if i == 0 && more.is_none() && matches!(ask, Command::Grant { .. }) {
                        break;
                    }
                    growth.leases += more.leases;
                    growth.keys += more.keys;
                    growth.waits += more.waits;
                }
                let role = token.and_then(|token| t.auth().role_name(token).map(str::to_string));
                (token, role, growth, usage)
            })
            .await;
        match admission.admit(token, role.as_deref(), growth, usage) {
            Ok(()) => Ok(()),
            Err(refused) => {
                admission
                    .hold_back(&refused, self.held_back.as_deref())
                    .await;
                Err(ApiError::ResourceExhausted(refused.message))
            }
        }
    }

    /// Checks a command's input ([`Command::validate`]), proposes it, and
    /// takes its answer out of the table's response. Bad input is refused
    /// before anything reaches the log.
    async fn propose<P: Proposal>(&self, proposal: P) -> Result<P::Answer, ApiError> {
        let command = proposal.into_command();
        command.validate()?;
        let response = self.consensus.propose(command).await??;
        P::answer(response).map_err(unexpected)
    }

    /// Proposes a caller's command, on behalf of its token. It is always
    /// wrapped, with auth off too: a leader that has not yet applied the
    /// entry that turned auth on still proposes it as the caller's, and the
    /// table refuses it there. Bad input is refused first, before the
    /// token is looked at.
    async fn propose_as<P: Proposal>(&self, proposal: P) -> Result<P::Answer, ApiError> {
        let command = proposal.into_command();
        command.validate()?;
        let token = self.caller_here().await?;
        let command = Command::As {
            token,
            command: Box::new(command),
        };
        let response = self.consensus.propose(command).await??;
        P::answer(response).map_err(unexpected)
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
