//! leaseholdd — `Correctness`.
//!
//! One session lease per TTL per client, renewed by one keepalive however many
//! locks hang off it. Acquire and release carry a request id, so a retry after
//! a lost reply never acts twice. The server answers a lease that asks for a
//! key it already holds with the hold it has; a `Lease` is one holder, so a
//! second acquire of a key this client holds goes out under a lease of its
//! own (revoked when that lock is released) and waits or is refused as it
//! would from another client.
//!
//! The URL may name a cluster's nodes (`http://a:7419,b:7419,c:7419`):
//! calls go to the leader, following `not_leader` answers and moving past
//! nodes that cannot be reached (`endpoints`).
//!
//! Two transports to the one server port. The operations that never wait
//! (grant, keepalive, try-acquire, release, checkpoint, revoke) go over the
//! framed protocol: the protobuf messages of the gRPC API, length-prefixed,
//! multiplexed over one connection per client (`leasehold_proto::frame`). That
//! skips HTTP on both ends: measured on a 2-core machine, an acquire plus a
//! release cost the server ~62 µs of CPU over gRPC, ~40 µs over HTTP/1.1 with
//! JSON, and less again framed. An acquire that waits, `status` and `watch`
//! use gRPC: a caller that gives up on a wait resets its stream, and the
//! server withdraws the wait at once.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::endpoints::Rpc;
use futures::stream::BoxStream;
use futures::StreamExt;
use leasehold_proto::frame::Op;
use leasehold_proto::v1 as pb;
use tokio::time::Instant;
use tonic::{Code, Status};

use super::endpoints::Endpoints;
use super::frames::CallError;
use super::{Acquired, Backend, Guarantee, Hold, LockEvent, LockOptions, LockStatus};
use crate::keeper::{Keeper, Liveness, RenewError};
use crate::TlsOptions;
use crate::{Error, Fence, Result};

/// Attempts for an idempotent request when the server cannot be reached.
const ATTEMPTS: usize = 3;

/// Pause before retry `attempt` (1-based) of a request the server did not
/// answer: 50 ms more each time, at most a second.
fn backoff(attempt: usize) -> Duration {
    Duration::from_millis((50 * attempt as u64).min(1_000))
}

/// The leaseholdd backend.
pub struct Leaseholdd {
    /// The deployment's endpoints; calls go to its leader.
    endpoints: Arc<Endpoints>,
    /// Session leases by TTL in milliseconds.
    sessions: Mutex<HashMap<u64, Arc<Session>>>,
    /// Held while a session is being granted.
    granting: tokio::sync::Mutex<()>,
}

struct Session {
    lease: u64,
    keeper: Mutex<Option<Keeper>>,
    liveness: Liveness,
    /// Keys held, or being acquired, under this lease.
    keys: Mutex<HashSet<String>>,
    /// Made for one lock only: revoked when that lock is released.
    private: bool,
}

/// A key claimed on a session; unclaimed when dropped.
struct Claim {
    session: Arc<Session>,
    key: String,
}

impl Claim {
    /// `None` if the session already has the key.
    fn take(session: &Arc<Session>, key: &str) -> Option<Claim> {
        let mut keys = session.keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.insert(key.to_string()).then(|| Claim {
            session: session.clone(),
            key: key.to_string(),
        })
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.session
            .keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
    }
}

fn metadata(status: &Status, name: &str) -> Option<String> {
    status
        .metadata()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

fn is_transient(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled
    ) && metadata(status, "leasehold-code").is_none()
        || metadata(status, "leasehold-code").as_deref() == Some("unavailable")
}

/// Maps a gRPC error for an operation on `key`.
fn error(key: &str, status: Status) -> Error {
    if metadata(&status, "leasehold-code").is_none() && is_transient(&status) {
        return Error::Unavailable(status.message().to_string());
    }
    lock_error(
        key,
        metadata(&status, "leasehold-code").as_deref(),
        status.message().to_string(),
        |name| metadata(&status, &format!("leasehold-{name}")),
    )
}

/// Maps the server's error code (and its detail fields, by their gRPC
/// metadata names) to ours; both transports carry the same ones.
fn lock_error(
    key: &str,
    code: Option<&str>,
    message: String,
    field: impl Fn(&str) -> Option<String>,
) -> Error {
    let fence = |name| field(name).and_then(|v| v.parse().ok());
    match code {
        Some("held") => Error::Held {
            key: key.to_string(),
            holder: field("holder").unwrap_or_default(),
            fence: fence("fence"),
        },
        Some("lock_delayed") => {
            Error::lock_delayed(key, field("delay-left-ms").unwrap_or_default())
        }
        Some("stale_fence") => Error::StaleFence {
            presented: fence("presented-fence").unwrap_or(0),
            current: fence("current-fence"),
        },
        Some("wait_timeout") => Error::Timeout {
            key: key.to_string(),
        },
        Some("lease_expired") | Some("lease_not_found") => Error::LeaseLost {
            key: key.to_string(),
            reason: message,
        },
        Some("invalid_argument") => Error::InvalidArgument(message),
        Some("not_leader") | Some("unavailable") | Some("tls_required") => {
            Error::Unavailable(message)
        }
        Some("outcome_unknown") => Error::OutcomeUnknown(message),
        Some("unauthenticated") => Error::Unauthenticated(message),
        Some("permission_denied") => Error::PermissionDenied(message),
        _ => Error::Other(message),
    }
}

impl CallError {
    fn into_error(self, key: &str) -> Error {
        match self {
            CallError::Unsent(m) => Error::Unavailable(m),
            CallError::Transport(m) => Error::OutcomeUnknown(m),
            CallError::Server(reply) => lock_error(
                key,
                Some(reply.code.as_str()).filter(|c| !c.is_empty()),
                reply.message,
                |name| reply.details.get(name).cloned(),
            ),
        }
    }
}

impl Leaseholdd {
    /// Connects to `http://host:port`, or to a cluster's nodes,
    /// `http://host1:port,host2:port,...`: calls go to the leader.
    /// `https://` endpoints trust the system's roots; see [`Self::connect_tls`].
    pub async fn connect(url: &str) -> Result<Leaseholdd> {
        Self::connect_tls(url, &TlsOptions::default()).await
    }

    /// Connects as [`Self::connect`], with the CA and client certificate
    /// of `tls` for `https://` endpoints.
    pub async fn connect_tls(url: &str, tls: &TlsOptions) -> Result<Leaseholdd> {
        Self::connect_with(url, tls, None).await
    }

    /// Connects as [`Self::connect_tls`], presenting `token` (an access
    /// token, `lh_<id>_<secret>`) with every call. A token the server
    /// refuses fails here, with [`Error::Unauthenticated`].
    pub async fn connect_with(
        url: &str,
        tls: &TlsOptions,
        token: Option<&str>,
    ) -> Result<Leaseholdd> {
        Ok(Leaseholdd {
            endpoints: Arc::new(Endpoints::connect(url, tls, token).await?),
            sessions: Mutex::new(HashMap::new()),
            granting: tokio::sync::Mutex::new(()),
        })
    }

    fn live_session(&self, ttl_ms: u64) -> Option<Arc<Session>> {
        let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions
            .get(&ttl_ms)
            .filter(|s| s.liveness.is_live())
            .cloned()
    }

    /// The live session for this TTL, made if needed.
    async fn session(&self, ttl: Duration, holder: &str) -> Result<Arc<Session>> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        if let Some(s) = self.live_session(ttl_ms) {
            return Ok(s);
        }
        // One grant at a time: concurrent first calls share the session the
        // first of them makes instead of each granting a lease of its own.
        let _granting = self.granting.lock().await;
        if let Some(s) = self.live_session(ttl_ms) {
            return Ok(s);
        }
        let session = self.open_session(ttl, holder, false).await?;
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ttl_ms, session.clone());
        Ok(session)
    }

    /// `key` claimed on the session for `ttl`, or, if this client already
    /// holds it there, on a lease of its own: this acquire is another holder.
    /// Takes `key`, or the lock set `set` (sorted, `key` its first) when
    /// not empty.
    async fn acquire_keys(
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
        let (mode, permits) = super::wire_mode(opts.mode);
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

    async fn claim(&self, key: &str, ttl: Duration, holder: &str) -> Result<Claim> {
        if let Some(claim) = Claim::take(&self.session(ttl, holder).await?, key) {
            return Ok(claim);
        }
        let private = self.open_session(ttl, holder, true).await?;
        Claim::take(&private, key)
            .ok_or_else(|| Error::Other("a new lease already holds the key".into()))
    }

    /// Grants a lease and starts renewing it.
    async fn open_session(
        &self,
        ttl: Duration,
        holder: &str,
        private: bool,
    ) -> Result<Arc<Session>> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        // The deadline counts from the first send: a retry may be answered
        // with the lease that send made.
        let sent_at = Instant::now();
        // A retry with the same id gets the lease the first grant made, so a
        // reply lost on the way leaves no lease behind.
        let grant = pb::GrantRequest {
            ttl_ms,
            holder: holder.to_string(),
            request_id: rand::random::<u64>() | 1,
        };
        let lease = call_again::<pb::GrantResponse>(&self.endpoints, Op::Grant, &grant, "")
            .await?
            .lease_id;
        let endpoints = self.endpoints.clone();
        let keeper = Keeper::spawn(ttl, sent_at, move || {
            let endpoints = endpoints.clone();
            async move {
                let renew = pb::KeepAliveRequest { lease_id: lease };
                let route = endpoints.route();
                // A node cut off from its majority may take the call and not
                // answer for a while: with other nodes to try, give up on it
                // after a sixth of the TTL (at least 200 ms), with time left
                // before the deadline. With one node there is nowhere else.
                let call = endpoints.call::<pb::KeepAliveResponse>(Op::KeepAlive, &renew);
                let attempt = if endpoints.len() > 1 {
                    (ttl / 6).max(Duration::from_millis(200))
                } else {
                    Duration::MAX
                };
                match tokio::time::timeout(attempt, call).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => match e.into_error("") {
                        Error::Unavailable(m) | Error::OutcomeUnknown(m) => {
                            Err(RenewError::Transient(m))
                        }
                        // The session's lease, not a key: its own reason.
                        Error::LeaseLost { reason, .. } => Err(RenewError::Lost(reason)),
                        e => Err(RenewError::Lost(e.to_string())),
                    },
                    Err(_) => {
                        endpoints.failed(&route).await;
                        Err(RenewError::Transient(format!(
                            "no answer from {} within {attempt:?}",
                            route.addr,
                        )))
                    }
                }
            }
        });
        Ok(Arc::new(Session {
            lease,
            liveness: keeper.liveness().clone(),
            keeper: Mutex::new(Some(keeper)),
            keys: Mutex::new(HashSet::new()),
            private,
        }))
    }

    /// Stops renewing a session and ends it on the server.
    async fn end_session(endpoints: &Endpoints, session: &Session) {
        let keeper = session
            .keeper
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(k) = keeper {
            k.stop().await;
        }
        let revoke = pb::RevokeRequest {
            lease_id: session.lease,
        };
        let _ = endpoints
            .call::<pb::RevokeResponse>(Op::Revoke, &revoke)
            .await;
    }
}

#[async_trait::async_trait]
impl Backend for Leaseholdd {
    fn name(&self) -> &'static str {
        "leaseholdd"
    }

    fn guarantee(&self) -> Guarantee {
        Guarantee::Correctness
    }

    fn supports_lock_delay(&self) -> bool {
        true
    }

    fn supports_modes(&self) -> bool {
        true
    }

    async fn acquire(
        &self,
        key: &str,
        holder: &str,
        opts: &LockOptions,
        wait: Option<Duration>,
    ) -> Result<Acquired> {
        self.acquire_keys(key, &[], holder, opts, wait).await
    }

    async fn acquire_set(
        &self,
        keys: &[String],
        holder: &str,
        opts: &LockOptions,
        wait: Option<Duration>,
    ) -> Result<Acquired> {
        let mut set = keys.to_vec();
        set.sort_unstable();
        set.dedup();
        let Some(first) = set.first().cloned() else {
            return Err(Error::InvalidArgument("a lock set needs a key".into()));
        };
        self.acquire_keys(&first, &set, holder, opts, wait).await
    }

    async fn status(&self, prefix: &str) -> Result<Vec<LockStatus>> {
        let request = pb::ListLocksRequest {
            prefix: prefix.to_string(),
            limit: 0,
            start_after: String::new(),
            held_only: false,
        };
        let call = |mut rpc: Rpc| {
            let request = request.clone();
            async move { rpc.list_locks(request).await }
        };
        let locks = self
            .endpoints
            .grpc(call)
            .await
            .map_err(|s| error(prefix, s))?
            .locks;
        Ok(locks
            .into_iter()
            .map(|l| LockStatus {
                key: l.key,
                holder: l
                    .holder
                    .as_ref()
                    .map(|h| h.holder.clone())
                    .unwrap_or_default(),
                fence: l.holder.as_ref().map(|h| h.fence),
                lease: l.holder.as_ref().map(|h| h.lease_id),
                ttl_left_ms: l.holder.as_ref().map_or(0, |h| h.ttl_left_ms),
                waiters: l.waiters.len(),
                holders: l
                    .holders
                    .iter()
                    .map(|h| (h.holder.clone(), h.fence))
                    .collect(),
                permits: l.permits,
                shared: l
                    .holders
                    .first()
                    .is_some_and(|h| h.mode() == pb::Mode::Shared),
                checkpoint: l.checkpoint.map(|data| (l.checkpoint_fence, data)),
            })
            .collect())
    }

    async fn watch(&self, prefix: &str) -> Result<BoxStream<'static, Result<LockEvent>>> {
        // Every node applies every entry, so any node can serve a watch.
        let stream = self
            .endpoints
            .route()
            .rpc
            .clone()
            .watch(pb::WatchRequest {
                prefix: prefix.to_string(),
            })
            .await
            .map_err(|s| error(prefix, s))?
            .into_inner();
        Ok(stream
            .map(|item| {
                item.map(|e| LockEvent {
                    kind: match pb::lock_event::Kind::try_from(e.kind) {
                        Ok(pb::lock_event::Kind::Acquired) => "acquired",
                        Ok(pb::lock_event::Kind::Released) => "released",
                        Ok(pb::lock_event::Kind::Expired) => "expired",
                        Ok(pb::lock_event::Kind::Checkpoint) => "checkpoint",
                        _ => "unknown",
                    }
                    .to_string(),
                    key: e.key,
                    fence: e.fence,
                    holder: e.holder,
                    data: e.data,
                })
                .map_err(|s| error("", s))
            })
            .boxed())
    }

    async fn release_by_fence(&self, key: &str, fence: Fence) -> Result<()> {
        release(&self.endpoints, key, fence).await
    }

    async fn close(&self) {
        let sessions: Vec<Arc<Session>> = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .map(|(_, s)| s)
            .collect();
        for s in sessions {
            Self::end_session(&self.endpoints, &s).await;
        }
    }
}

async fn release(endpoints: &Endpoints, key: &str, fence: Fence) -> Result<()> {
    call_again::<pb::ReleaseResponse>(endpoints, Op::Release, &release_request(key, fence), key)
        .await
        .map(drop)
}

fn release_request(key: &str, fence: Fence) -> pb::ReleaseRequest {
    pb::ReleaseRequest {
        key: key.to_string(),
        fence,
        request_id: rand::random::<u64>() | 1,
    }
}

/// Whether an error leaves the outcome of a call open: nobody took it, or
/// its answer was lost.
fn unsettled<T>(result: &Result<T>) -> bool {
    matches!(
        result,
        Err(Error::Unavailable(_) | Error::OutcomeUnknown(_))
    )
}

/// Pause between background attempts to settle a call.
const SETTLE_PAUSE: Duration = Duration::from_millis(500);

/// Sends `request` (a release) again in the background, with the same
/// request id, until its outcome is known or the session's lease is over
/// (which frees the key anyway). The claim on the key is kept meanwhile, so
/// this client does not take the key again on the same session before it is
/// released: a later acquire of it goes out under a lease of its own and
/// waits its turn.
fn settle_release(endpoints: Arc<Endpoints>, claim: Arc<Claim>, request: pb::ReleaseRequest) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        while claim.session.liveness.is_live() {
            tokio::time::sleep(SETTLE_PAUSE).await;
            let result = endpoints
                .call::<pb::ReleaseResponse>(Op::Release, &request)
                .await
                .map_err(|e| e.into_error(&request.key));
            if !unsettled(&result) {
                tracing::debug!(key = %request.key, ?result, "a release whose answer was lost is settled");
                return;
            }
        }
    });
}

/// Asks again in the background, with the same request id, for an acquire
/// on a shared session whose outcome was left open (the caller was told
/// so), until the answer is known; a grant it turns out to have made is
/// released. The claim on the key is kept meanwhile (see [`settle_release`]).
fn settle_acquire(endpoints: Arc<Endpoints>, claim: Arc<Claim>, mut request: pb::AcquireRequest) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    // Re-attach, and let the server withdraw the wait at once if it is
    // still queued.
    request.wait_ms = request.wait_ms.min(1);
    runtime.spawn(async move {
        while claim.session.liveness.is_live() {
            tokio::time::sleep(SETTLE_PAUSE).await;
            let call = |mut rpc: Rpc| {
                let request = request.clone();
                async move { rpc.acquire(request).await }
            };
            let result = endpoints
                .grpc(call)
                .await
                .map_err(|s| error(&request.key, s));
            match result {
                Ok(granted) => {
                    let release = release_request(&request.key, granted.fence);
                    let result = call_again::<pb::ReleaseResponse>(
                        &endpoints,
                        Op::Release,
                        &release,
                        &request.key,
                    )
                    .await;
                    if unsettled(&result) {
                        settle_release(endpoints, claim, release);
                    }
                    return;
                }
                result if unsettled(&result) => {}
                _ => return,
            }
        }
    });
}

/// Sends a framed call that is safe to send again (it carries a request id,
/// or acting twice is acting once) up to [`ATTEMPTS`] times while no node
/// could take it or its answer was lost.
async fn call_again<R: prost::Message + Default>(
    endpoints: &Endpoints,
    op: Op,
    request: &impl prost::Message,
    key: &str,
) -> Result<R> {
    let mut attempt = 0;
    loop {
        match endpoints
            .call::<R>(op, request)
            .await
            .map_err(|e| e.into_error(key))
        {
            Err(Error::Unavailable(_) | Error::OutcomeUnknown(_)) if attempt + 1 < ATTEMPTS => {
                attempt += 1;
                tokio::time::sleep(backoff(attempt)).await;
            }
            result => return result,
        }
    }
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
