//! The HTTP/JSON surface, for curl, scripts and clients in any language.
//!
//! | method and path                  | does                                         |
//! |----------------------------------|----------------------------------------------|
//! | `GET /health`                    | liveness and whether this node leads         |
//! | `GET /metrics`                   | Prometheus text                              |
//! | `POST /v1/leases`                | grant a lease `{ttl_ms, holder}`             |
//! | `GET /v1/leases[/ID]`            | list leases / describe one                   |
//! | `POST /v1/leases/ID/keepalive`   | renew a lease                                |
//! | `DELETE /v1/leases/ID`           | revoke a lease, releasing its locks          |
//! | `POST /v1/acquire`               | acquire `{key, lease or ttl_ms, wait_ms, …}` |
//! | `POST /v1/release`               | release `{key, fence}`                       |
//! | `POST /v1/checkpoint`            | save `{key, fence, data}`                    |
//! | `GET /v1/locks[?prefix=&held=]`  | list locks (`held=true`: held or waited for) |
//! | `GET /v1/locks/KEY`              | describe one lock (KEY may contain `/`)      |
//! | `GET /v1/watch[?prefix=&after_index=&after_seq=]` | server-sent events, resumable |
//! | `GET /v1/events[?prefix=]`       | the node's last 200 lock events              |
//! | `GET /v1/cluster`                | members, roles, term, leader, lag            |
//! | `POST /v1/cluster/members`       | add `{id, addr}`: learner, caught up, voter  |
//! | `DELETE /v1/cluster/members/ID`  | remove a member                              |
//! | `GET /v1/auth`                   | auth on/off, roles, tokens, audit trail      |
//! | `POST /v1/auth/enable`           | turn auth on `[{secret}]`; the root token    |
//! | `POST /v1/auth/disable`          | turn auth off                                |
//! | `PUT /v1/auth/roles/NAME`        | set a role `{rules: [{prefix, permission}]}` |
//! | `DELETE /v1/auth/roles/NAME`     | delete a role no token uses                  |
//! | `POST /v1/auth/tokens`           | create a token `{name, role[, secret]}`      |
//! | `DELETE /v1/auth/tokens/ID`      | revoke a token                               |
//!
//! With auth on, every route but `/health`, `/metrics` and the dashboard's
//! files needs `Authorization: Bearer <token>` (see `docs/auth.md`).

//!
//! Every error, including an unknown path, a wrong method, an undecodable
//! path segment and a body that is not exactly one JSON object, is the JSON
//! body `{"error": {"code", "message", ...}}` of [`super::error`].

use std::convert::Infallible;

use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{async_trait, Json, Router};
use base64::Engine;
use bytes::Bytes;
use futures::Stream;
use leasehold_core::{LeaseId, LockView};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::hub::history::Position;
use crate::service::{AcquireArgs, ApiError, LeaseSpec, LockService};

mod operator;
use operator::{
    add_member, auth_state, backup, cluster_status, create_token, delete_role, disable_auth,
    enable_auth, remove_member, revoke_token, set_role, transfer_leader, EnableBody, MemberBody,
    RoleBody, TokenBody, TransferBody,
};

type Result<T> = std::result::Result<T, ApiError>;

/// A JSON request body: exactly one JSON value (nothing after it), whatever
/// the content type says.
struct Body<T>(T);

#[async_trait]
impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| ApiError::invalid("body", e.body_text()))?;
        // `from_slice` refuses trailing bytes after the value.
        serde_json::from_slice(&bytes)
            .map(Body)
            .map_err(|e| ApiError::invalid("body", e))
    }
}

/// The path's one parameter, percent-decoded as UTF-8.
struct Param(String);

#[async_trait]
impl<S: Send + Sync> FromRequestParts<S> for Param {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self> {
        axum::extract::Path::<String>::from_request_parts(parts, state)
            .await
            .map(|p| Param(p.0))
            .map_err(|e| ApiError::invalid("path", e.body_text()))
    }
}

/// The service acting for the request's bearer token (`Authorization:
/// Bearer <token>`), if it has one.
struct Caller(LockService);

#[async_trait]
impl FromRequestParts<LockService> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, service: &LockService) -> Result<Self> {
        let service = super::caller_service(
            service,
            parts
                .headers
                .get(axum::http::header::AUTHORIZATION)
                .map(|v| v.to_str().ok()),
            parts.extensions.get(),
            parts.extensions.get(),
        )?;
        Ok(Caller(service))
    }
}

/// The query string.
struct Query<T>(T);

#[async_trait]
impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Query(q.0))
            .map_err(|e| ApiError::invalid("query", e.body_text()))
    }
}

/// Whether `request` is a gRPC call (its answer must be a gRPC status).
pub fn is_grpc(request: &Request) -> bool {
    request
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// Any path no route has: a JSON 404, or gRPC's `UNIMPLEMENTED` to a gRPC
/// call of a method this server does not have.
pub async fn not_found(request: Request) -> Response {
    if is_grpc(&request) {
        let status = tonic::Status::from(ApiError::NotFound(format!(
            "no method {}",
            request.uri().path()
        )));
        return status.into_http().map(axum::body::Body::new);
    }
    ApiError::NotFound(format!(
        "no route {} {}",
        request.method(),
        request.uri().path()
    ))
    .into_response()
}

async fn method_not_allowed(request: Request) -> Response {
    ApiError::MethodNotAllowed(format!(
        "{} is not allowed on {}",
        request.method(),
        request.uri().path()
    ))
    .into_response()
}

/// The request header with which a client asks a follower for a `307
/// Temporary Redirect` to the leader instead of a `503 not_leader`.
pub const FOLLOW_LEADER: &str = "leasehold-follow-leader";

/// Runs a request with `scheme` known to its errors (a follower's
/// `leader_url`), and answers a `not_leader` with a redirect to the same
/// path at the leader when the request asked for one ([`FOLLOW_LEADER`]).
/// A follower proposes nothing before it refuses, so resending the same
/// request to the leader is as safe as sending it there first.
async fn at_leader(
    State(scheme): State<&'static str>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    let follow = request
        .headers()
        .get(FOLLOW_LEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| matches!(v.trim(), "1" | "true" | "yes"));
    let path = request
        .uri()
        .path_and_query()
        .map_or("/".to_string(), |p| p.as_str().to_string());
    let mut response = super::error::SCHEME.scope(scheme, next.run(request)).await;
    if follow {
        if let Some(super::error::LeaderUrl(url)) = response.extensions().get().cloned() {
            if let Ok(location) = axum::http::HeaderValue::try_from(format!("{url}{path}")) {
                *response.status_mut() = axum::http::StatusCode::TEMPORARY_REDIRECT;
                response
                    .headers_mut()
                    .insert(axum::http::header::LOCATION, location);
            }
        }
    }
    response
}

/// The HTTP routes over `service`; `scheme` is how clients reach the nodes.
pub fn router(service: LockService, scheme: &'static str) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .route("/v1/leases", post(grant).get(list_leases))
        .route("/v1/leases/:id", get(describe_lease).delete(revoke))
        .route("/v1/leases/:id/keepalive", post(keep_alive))
        .route("/v1/acquire", post(acquire))
        .route("/v1/release", post(release))
        .route("/v1/checkpoint", post(checkpoint))
        .route("/v1/locks", get(list_locks))
        .route("/v1/locks/*key", get(describe_lock))
        .route("/v1/watch", get(watch))
        .route("/v1/events", get(recent_events))
        .route("/v1/cluster", get(cluster_status))
        .route("/v1/auth", get(auth_state))
        .route("/v1/auth/enable", post(enable_auth))
        .route("/v1/auth/disable", post(disable_auth))
        .route(
            "/v1/auth/roles/:name",
            axum::routing::put(set_role).delete(delete_role),
        )
        .route("/v1/auth/tokens", post(create_token))
        .route("/v1/auth/tokens/:id", axum::routing::delete(revoke_token))
        .route("/v1/cluster/members", post(add_member))
        .route("/v1/cluster/transfer-leader", post(transfer_leader))
        .route("/v1/snapshot", get(backup))
        .route(
            "/v1/cluster/members/:id",
            axum::routing::delete(remove_member),
        )
        .merge(super::ui::routes())
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(service)
        .layer(axum::middleware::from_fn_with_state(scheme, at_leader))
}

fn lease_id(raw: &str) -> Result<u64> {
    raw.parse()
        .map_err(|_| ApiError::invalid("lease", format!("{raw:?} is not a lease id")))
}

/// `status` is `ok`, or `removed` (with a 503) on a node that learned it is
/// no longer a member of its group: stop it and delete its data dir.
async fn health(State(s): State<LockService>) -> (axum::http::StatusCode, Json<Value>) {
    let c = s.consensus();
    let cluster = c.membership().status();
    let alarm = c.table_alarm();
    let (code, status) = if c.membership().removed() {
        (axum::http::StatusCode::SERVICE_UNAVAILABLE, "removed")
    } else if alarm.is_some() {
        // Serving still; an operator must look (`alarm` says at what).
        (axum::http::StatusCode::OK, "degraded")
    } else {
        (axum::http::StatusCode::OK, "ok")
    };
    let body = Json(json!({
        "status": status,
        "alarm": alarm,
        "id": cluster.id,
        // Leads and may serve: its clock is armed.
        "leader": c.now().is_some(),
        "role": cluster.role,
        "term": cluster.term,
        "leader_id": cluster.leader,
        "leader_url": cluster.leader_addr.as_ref().map(|addr| format!("{}://{addr}", super::error::scheme())),
        "leader_addr": cluster.leader_addr,
        "last_applied": c.last_applied(),
        "commit_index": cluster.commit_index,
    }));
    (code, body)
}

/// `docs/openapi.yaml`, as JSON (made by `build.rs`).
const OPENAPI: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/openapi.json"));

async fn openapi() -> impl IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        OPENAPI,
    )
}

async fn metrics(State(s): State<LockService>) -> impl IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.context().metrics.render(&gauges(s.consensus()).await),
    )
}

/// What `/metrics`' gauges show, read off the node.
async fn gauges(consensus: &crate::raft::Consensus) -> crate::metrics::Gauges {
    let (leases, held, waiters, next_fence, now) = consensus
        .read_local(|t| {
            (
                t.lease_count(),
                t.held_count(),
                t.waiter_count(),
                t.next_fence(),
                t.now(),
            )
        })
        .await;
    let cluster = consensus.membership().status();
    crate::metrics::Gauges {
        leases: leases as u64,
        locks_held: held as u64,
        waiters: waiters as u64,
        fence_next: next_fence,
        applied_index: consensus.last_applied(),
        table_time_ms: now,
        is_leader: consensus.now().is_some(),
        table_hash_mismatch: consensus.table_alarm().is_some(),
        term: cluster.term,
        last_log_index: cluster.last_log_index,
        commit_index: cluster.commit_index,
        snapshot_index: cluster.snapshot_index,
        // The leader's lag behind itself is no lag: its peers only.
        replication_lag: cluster
            .members
            .iter()
            .filter(|m| m.id != cluster.id)
            .filter_map(|m| m.lag.map(|lag| (m.id, lag)))
            .collect(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantBody {
    ttl_ms: u64,
    #[serde(default)]
    holder: String,
    #[serde(default)]
    request_id: u64,
}

async fn grant(Caller(s): Caller, Body(b): Body<GrantBody>) -> Result<Json<Value>> {
    let (lease, ttl_ms) = s.grant(b.ttl_ms, b.holder, b.request_id).await?;
    Ok(Json(json!({ "lease": lease, "ttl_ms": ttl_ms })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LeasesQuery {
    #[serde(default)]
    limit: usize,
    #[serde(default)]
    start_after: LeaseId,
}

async fn list_leases(Caller(s): Caller, Query(q): Query<LeasesQuery>) -> Result<Json<Value>> {
    let page = s.leases(q.start_after, q.limit).await?;
    Ok(Json(
        json!({ "leases": page.items, "next_start_after": page.next }),
    ))
}

async fn describe_lease(Caller(s): Caller, Param(id): Param) -> Result<Json<Value>> {
    Ok(Json(json!(s.lease(lease_id(&id)?).await?)))
}

#[derive(Serialize)]
struct KeepAliveReply {
    ttl_ms: u64,
    key_count: u64,
}

async fn keep_alive(Caller(s): Caller, Param(id): Param) -> Result<Json<KeepAliveReply>> {
    let (ttl_ms, key_count) = s.keep_alive(lease_id(&id)?).await?;
    Ok(Json(KeepAliveReply { ttl_ms, key_count }))
}

async fn revoke(Caller(s): Caller, Param(id): Param) -> Result<Json<Value>> {
    let released = s.revoke(lease_id(&id)?).await?;
    Ok(Json(json!({ "released": released })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireBody {
    /// One key, or
    #[serde(default)]
    key: String,
    /// a lock set: these keys, all or nothing, one token.
    #[serde(default)]
    keys: Vec<String>,
    /// An existing lease, or none to grant one with `ttl_ms` for this lock.
    lease: Option<u64>,
    ttl_ms: Option<u64>,
    #[serde(default)]
    holder: String,
    #[serde(default)]
    wait_ms: u64,
    #[serde(default)]
    lock_delay_ms: u64,
    #[serde(default)]
    request_id: u64,
    /// `exclusive` (the default), `shared` (a reader) or `permit` (one of a
    /// semaphore's `permits`; `permits` alone implies it).
    mode: Option<String>,
    #[serde(default)]
    permits: u32,
}

/// The table's mode for an acquire body's `mode` and `permits`.
fn acquire_mode(mode: Option<&str>, permits: u32) -> Result<leasehold_core::Mode> {
    let wire = match mode {
        None if permits > 0 => leasehold_proto::v1::Mode::Permit,
        None | Some("exclusive") => leasehold_proto::v1::Mode::Exclusive,
        Some("shared") => leasehold_proto::v1::Mode::Shared,
        Some("permit") => leasehold_proto::v1::Mode::Permit,
        Some(other) => {
            return Err(ApiError::invalid(
                "mode",
                format!("is {other:?}; give exclusive, shared or permit"),
            ))
        }
    };
    super::calls::mode(wire.into(), permits)
}

/// Fields in alphabetical order, as a JSON map would print them.
#[derive(Serialize)]
struct AcquireReply {
    /// The checkpoint as text, when it is UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    checkpoint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    checkpoint_base64: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    checkpoint_fence: Option<u64>,
    fence: u64,
    /// The key (absent for a lock set, which says `keys`).
    #[serde(skip_serializing_if = "String::is_empty")]
    key: String,
    /// A lock set's keys, sorted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    keys: Vec<String>,
    lease: u64,
}

fn limits_sorted(mut keys: Vec<String>) -> Vec<String> {
    keys.sort_unstable();
    keys.dedup();
    keys
}

async fn acquire(Caller(s): Caller, Body(b): Body<AcquireBody>) -> Result<Json<AcquireReply>> {
    let lease = match (b.lease, b.ttl_ms) {
        (Some(lease), None) => LeaseSpec::Existing(lease),
        // One command: a retry with the same request id gets the same lease.
        (None, Some(ttl_ms)) => LeaseSpec::New {
            ttl_ms,
            holder: b.holder,
        },
        _ => {
            return Err(ApiError::invalid(
                "lease",
                "give exactly one of `lease` (an existing lease) or `ttl_ms` (a new one)",
            ))
        }
    };
    let grant = s
        .acquire(AcquireArgs {
            lease,
            key: b.key.clone(),
            wait_ms: b.wait_ms,
            lock_delay_ms: b.lock_delay_ms,
            request_id: b.request_id,
            mode: acquire_mode(b.mode.as_deref(), b.permits)?,
            set: b.keys.clone(),
        })
        .await?;
    let mut out = AcquireReply {
        checkpoint: None,
        checkpoint_base64: None,
        checkpoint_fence: None,
        fence: grant.fence,
        key: b.key,
        keys: limits_sorted(b.keys),
        lease: grant.lease,
    };
    if let Some(cp) = grant.checkpoint {
        out.checkpoint_fence = Some(cp.fence);
        out.checkpoint_base64 = Some(base64::engine::general_purpose::STANDARD.encode(&cp.data));
        out.checkpoint = std::str::from_utf8(&cp.data).ok().map(str::to_string);
    }
    Ok(Json(out))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseBody {
    key: String,
    fence: u64,
    #[serde(default)]
    request_id: u64,
}

#[derive(Serialize)]
struct ReleaseReply {
    fence: u64,
    released: String,
}

async fn release(Caller(s): Caller, Body(b): Body<ReleaseBody>) -> Result<Json<ReleaseReply>> {
    s.release(b.key.clone(), b.fence, b.request_id).await?;
    Ok(Json(ReleaseReply {
        fence: b.fence,
        released: b.key,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckpointBody {
    key: String,
    fence: u64,
    /// UTF-8 text.
    data: Option<String>,
    /// Or any bytes, base64-encoded.
    data_base64: Option<String>,
}

async fn checkpoint(Caller(s): Caller, Body(b): Body<CheckpointBody>) -> Result<Json<Value>> {
    let data = match (b.data, b.data_base64) {
        (Some(text), None) => text.into_bytes(),
        (None, Some(encoded)) => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|e| ApiError::invalid("data_base64", e))?,
        (None, None) => Vec::new(),
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "data",
                "give `data` or `data_base64`, not both",
            ))
        }
    };
    let bytes = data.len();
    s.save_checkpoint(b.key.clone(), b.fence, data).await?;
    Ok(Json(
        json!({ "key": b.key, "fence": b.fence, "bytes": bytes }),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    #[serde(default)]
    prefix: String,
    #[serde(default)]
    limit: usize,
    #[serde(default)]
    start_after: String,
    /// Only keys held or waited for.
    #[serde(default)]
    held: bool,
}

async fn list_locks(Caller(s): Caller, Query(q): Query<ListQuery>) -> Result<Json<Value>> {
    let page = s
        .locks(&q.prefix, Some(q.start_after.as_str()), q.limit, q.held)
        .await?;
    Ok(Json(
        json!({ "locks": page.items, "next_start_after": page.next }),
    ))
}

async fn describe_lock(Caller(s): Caller, Param(key): Param) -> Result<Json<Value>> {
    let view = s.lock(&key).await?.unwrap_or(LockView {
        key,
        holder: None,
        holders: Vec::new(),
        permits: 0,
        waiters: Vec::new(),
        has_checkpoint: false,
        checkpoint: None,
        delay_left_ms: 0,
    });
    let checkpoint = view.checkpoint.clone();
    let mut out = json!(view);
    // The checkpoint and who saved it: an election's value and its leader.
    if let (Some(cp), Some(fields)) = (checkpoint, out.as_object_mut()) {
        let data = base64::engine::general_purpose::STANDARD.encode(&cp.data);
        fields.insert("checkpoint_base64".into(), json!(data));
        fields.insert("checkpoint_fence".into(), json!(cp.fence));
    }
    Ok(Json(out))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WatchQuery {
    #[serde(default)]
    prefix: String,
    /// Resume after this log index (the last event's `index`).
    after_index: Option<u64>,
    /// With `after_index`: the last event's `seq`.
    after_seq: Option<u32>,
}

/// Where a watch resumes: `after_index` (and `after_seq`), or the
/// `Last-Event-ID` header an `EventSource` sends when it reconnects (the
/// last event's id, `INDEX.SEQ`). Both at once must agree.
fn resume_point(q: &WatchQuery, headers: &HeaderMap) -> Result<Option<Position>> {
    let query = crate::service::resume_point(q.after_index, q.after_seq)?;
    let header = match headers.get("last-event-id") {
        None => None,
        Some(v) => Some(v.to_str().ok().and_then(Position::parse).ok_or_else(|| {
            ApiError::invalid(
                "Last-Event-ID",
                "is not an event id (INDEX.SEQ, as the stream sent it)",
            )
        })?),
    };
    match (query, header) {
        (Some(q), Some(h)) if q != h => Err(ApiError::invalid(
            "after_index",
            format!("says {q} but Last-Event-ID says {h}: send one of them"),
        )),
        (q, h) => Ok(q.or(h)),
    }
}

async fn watch(
    Caller(s): Caller,
    headers: HeaderMap,
    Query(q): Query<WatchQuery>,
) -> Result<Sse<impl Stream<Item = std::result::Result<SseEvent, Infallible>>>> {
    let after = resume_point(&q, &headers)?;
    let watch = s.watch(q.prefix, after).await?;
    let stream = futures::stream::unfold(Some(watch), |watch| async move {
        let mut watch = watch?;
        let (event, next) = match watch.next().await {
            // The id is what a client sends back to resume after it.
            Ok(e) => (
                SseEvent::default()
                    .event(e.kind)
                    .id(e.position().to_string())
                    .data(json!(e).to_string()),
                Some(watch),
            ),
            // The same JSON body as any other error.
            Err(e) => (
                SseEvent::default()
                    .event("error")
                    .data(e.body().to_string()),
                None,
            ),
        };
        Some((Ok(event), next))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

async fn recent_events(Caller(s): Caller, Query(q): Query<WatchQuery>) -> Result<Json<Value>> {
    Ok(Json(json!({ "events": s.recent_events(&q.prefix).await? })))
}

/// Every request body this API decodes, fed `data` as a body is (see
/// [`crate::fuzzing`]).
pub(crate) fn fuzz_bodies(data: &[u8]) {
    fn body<T: DeserializeOwned>(data: &[u8]) -> Option<T> {
        serde_json::from_slice(data).ok()
    }
    let _ = body::<GrantBody>(data);
    if let Some(acquire) = body::<AcquireBody>(data) {
        let _ = acquire_mode(acquire.mode.as_deref(), acquire.permits);
    }
    let _ = body::<ReleaseBody>(data);
    let _ = body::<CheckpointBody>(data);
    let _ = body::<MemberBody>(data);
    let _ = body::<TransferBody>(data);
    let _ = body::<EnableBody>(data);
    let _ = body::<RoleBody>(data);
    let _ = body::<TokenBody>(data);
    let _ = body::<Value>(data);
}
