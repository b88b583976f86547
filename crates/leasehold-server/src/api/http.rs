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
//! | `GET /v1/locks[?prefix=]`        | list locks                                   |
//! | `GET /v1/locks/KEY`              | describe one lock (KEY may contain `/`)      |
//! | `GET /v1/watch[?prefix=]`        | server-sent events: acquired/released/expired|

use std::convert::Infallible;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use futures::Stream;
use leasehold_core::{LockError, LockView};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::service::{AcquireArgs, ApiError, LockService};

type Result<T> = std::result::Result<T, ApiError>;

/// The HTTP routes over `service`.
pub fn router(service: LockService) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/leases", post(grant).get(list_leases))
        .route("/v1/leases/:id", get(describe_lease).delete(revoke))
        .route("/v1/leases/:id/keepalive", post(keep_alive))
        .route("/v1/acquire", post(acquire))
        .route("/v1/release", post(release))
        .route("/v1/checkpoint", post(checkpoint))
        .route("/v1/locks", get(list_locks))
        .route("/v1/locks/*key", get(describe_lock))
        .route("/v1/watch", get(watch))
        .with_state(service)
}

fn body<T>(json: std::result::Result<Json<T>, JsonRejection>) -> Result<T> {
    json.map(|Json(t)| t)
        .map_err(|e| ApiError::invalid("body", e.body_text()))
}

fn query<T>(q: std::result::Result<Query<T>, QueryRejection>) -> Result<T> {
    q.map(|Query(t)| t)
        .map_err(|e| ApiError::invalid("query", e.body_text()))
}

fn lease_id(raw: &str) -> Result<u64> {
    raw.parse()
        .map_err(|_| ApiError::invalid("lease", format!("{raw:?} is not a lease id")))
}

async fn health(State(s): State<LockService>) -> Json<Value> {
    let c = s.consensus();
    Json(json!({
        "status": "ok",
        "leader": c.now().is_some(),
        "last_applied": c.last_applied(),
    }))
}

async fn metrics(State(s): State<LockService>) -> impl IntoResponse {
    let (leases, held, next_fence, now) = s
        .consensus()
        .read_local(|t| (t.lease_count(), t.held_count(), t.next_fence(), t.now()));
    let leader = u8::from(s.consensus().now().is_some());
    let text = format!(
        "# HELP leasehold_leases Live leases.\n# TYPE leasehold_leases gauge\nleasehold_leases {leases}\n\
         # HELP leasehold_locks_held Held locks.\n# TYPE leasehold_locks_held gauge\nleasehold_locks_held {held}\n\
         # HELP leasehold_fence_next The next fencing token.\n# TYPE leasehold_fence_next counter\nleasehold_fence_next {next_fence}\n\
         # HELP leasehold_raft_applied_index Last applied Raft log index.\n# TYPE leasehold_raft_applied_index counter\nleasehold_raft_applied_index {}\n\
         # HELP leasehold_table_time_ms Table time in milliseconds.\n# TYPE leasehold_table_time_ms counter\nleasehold_table_time_ms {now}\n\
         # HELP leasehold_is_leader Whether this node leads.\n# TYPE leasehold_is_leader gauge\nleasehold_is_leader {leader}\n",
        s.consensus().last_applied()
    );
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        text,
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantBody {
    ttl_ms: u64,
    #[serde(default)]
    holder: String,
}

async fn grant(
    State(s): State<LockService>,
    b: std::result::Result<Json<GrantBody>, JsonRejection>,
) -> Result<Json<Value>> {
    let b = body(b)?;
    let (lease, ttl_ms) = s.grant(b.ttl_ms, b.holder).await?;
    Ok(Json(json!({ "lease": lease, "ttl_ms": ttl_ms })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitQuery {
    #[serde(default)]
    limit: usize,
}

async fn list_leases(
    State(s): State<LockService>,
    q: std::result::Result<Query<LimitQuery>, QueryRejection>,
) -> Result<Json<Value>> {
    let q = query(q)?;
    Ok(Json(json!({ "leases": s.leases(q.limit).await? })))
}

async fn describe_lease(
    State(s): State<LockService>,
    Path(id): Path<String>,
) -> Result<Json<Value>> {
    let lease = lease_id(&id)?;
    match s.lease(lease).await? {
        Some(v) => Ok(Json(json!(v))),
        None => Err(LockError::LeaseNotFound { lease }.into()),
    }
}

#[derive(Serialize)]
struct KeepAliveReply {
    ttl_ms: u64,
}

async fn keep_alive(
    State(s): State<LockService>,
    Path(id): Path<String>,
) -> Result<Json<KeepAliveReply>> {
    let ttl_ms = s.keep_alive(lease_id(&id)?).await?;
    Ok(Json(KeepAliveReply { ttl_ms }))
}

async fn revoke(State(s): State<LockService>, Path(id): Path<String>) -> Result<Json<Value>> {
    let released = s.revoke(lease_id(&id)?).await?;
    Ok(Json(json!({ "released": released })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireBody {
    key: String,
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
    key: String,
    lease: u64,
}

async fn acquire(
    State(s): State<LockService>,
    b: std::result::Result<Json<AcquireBody>, JsonRejection>,
) -> Result<Json<AcquireReply>> {
    let b = body(b)?;
    leasehold_core::limits::validate_key(&b.key)?;
    let (lease, fresh) = match (b.lease, b.ttl_ms) {
        (Some(lease), None) => (lease, false),
        (None, Some(ttl_ms)) => (s.grant(ttl_ms, b.holder).await?.0, true),
        _ => {
            return Err(ApiError::invalid(
                "lease",
                "give exactly one of `lease` (an existing lease) or `ttl_ms` (a new one)",
            ))
        }
    };
    let result = s
        .acquire(AcquireArgs {
            lease,
            key: b.key.clone(),
            wait_ms: b.wait_ms,
            lock_delay_ms: b.lock_delay_ms,
            request_id: b.request_id,
        })
        .await;
    let grant = match result {
        Ok(g) => g,
        Err(e) => {
            if fresh {
                // The lease was made for this lock only; do not leave it behind.
                let _ = s.revoke(lease).await;
            }
            return Err(e);
        }
    };
    let mut out = AcquireReply {
        checkpoint: None,
        checkpoint_base64: None,
        checkpoint_fence: None,
        fence: grant.fence,
        key: b.key,
        lease,
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

async fn release(
    State(s): State<LockService>,
    b: std::result::Result<Json<ReleaseBody>, JsonRejection>,
) -> Result<Json<ReleaseReply>> {
    let b = body(b)?;
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

async fn checkpoint(
    State(s): State<LockService>,
    b: std::result::Result<Json<CheckpointBody>, JsonRejection>,
) -> Result<Json<Value>> {
    let b = body(b)?;
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
}

async fn list_locks(
    State(s): State<LockService>,
    q: std::result::Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Value>> {
    let q = query(q)?;
    Ok(Json(json!({ "locks": s.locks(&q.prefix, q.limit).await? })))
}

async fn describe_lock(
    State(s): State<LockService>,
    Path(key): Path<String>,
) -> Result<Json<Value>> {
    let view = s.lock(&key).await?.unwrap_or(LockView {
        key,
        holder: None,
        waiters: Vec::new(),
        has_checkpoint: false,
        delay_left_ms: 0,
    });
    Ok(Json(json!(view)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WatchQuery {
    #[serde(default)]
    prefix: String,
}

async fn watch(
    State(s): State<LockService>,
    q: std::result::Result<Query<WatchQuery>, QueryRejection>,
) -> Result<Sse<impl Stream<Item = std::result::Result<SseEvent, Infallible>>>> {
    let q = query(q)?;
    let watch = s.watch(q.prefix);
    let stream = futures::stream::unfold(Some(watch), |watch| async move {
        let mut watch = watch?;
        let (event, next) = match watch.next().await {
            Ok(e) => (
                SseEvent::default().event(e.kind).data(json!(e).to_string()),
                Some(watch),
            ),
            Err(e) => (SseEvent::default().event("error").data(e.to_string()), None),
        };
        Some((Ok(event), next))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}
