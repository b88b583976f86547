//! One mapping from errors to gRPC statuses and HTTP responses.
//!
//! | code               | gRPC                  | HTTP |
//! |--------------------|-----------------------|------|
//! | `invalid_argument` | `INVALID_ARGUMENT`    | 400  |
//! | `lease_not_found`  | `NOT_FOUND`           | 404  |
//! | `lease_expired`    | `FAILED_PRECONDITION` | 410  |
//! | `held`             | `FAILED_PRECONDITION` | 409  |
//! | `lock_delayed`     | `FAILED_PRECONDITION` | 409  |
//! | `stale_fence`      | `FAILED_PRECONDITION` | 409  |
//! | `wait_timeout`     | `DEADLINE_EXCEEDED`   | 408  |
//! | `unauthenticated`  | `UNAUTHENTICATED`     | 401  |
//! | `permission_denied`| `PERMISSION_DENIED`   | 403  |
//! | `not_leader`       | `UNAVAILABLE`         | 503  |
//! | `unavailable`      | `UNAVAILABLE`         | 503  |
//! | `outcome_unknown`  | `UNAVAILABLE`         | 503  |
//! | `not_found`        | `UNIMPLEMENTED`       | 404  |
//! | `method_not_allowed` | `UNIMPLEMENTED`     | 405  |
//! | `not_added`        | `FAILED_PRECONDITION` | 409  |
//! | `tls_required`     | `UNAVAILABLE`         | 400  |
//! | `watch_behind`     | `ABORTED`             | 410  |
//! | `resource_exhausted` | `RESOURCE_EXHAUSTED` | 429  |
//! | `internal`         | `INTERNAL`            | 500  |
//!
//! gRPC statuses carry the code in the `leasehold-code` metadata entry, plus
//! `leasehold-holder`, `leasehold-lease` and `leasehold-fence` for `held`,
//! `leasehold-current-fence` for `stale_fence`, `leasehold-leader` for
//! `not_leader`, and `leasehold-key` and `leasehold-needed` (or
//! `leasehold-lease`) for `permission_denied`. HTTP bodies are `{"error": {"code", "message", ...}}`,
//! and a `not_leader` body names the leader both as `leader` (`host:port`)
//! and as `leader_url` (`http://host:port`, or `https://`). The
//! framed protocol sends an `ErrorReply` with the code, the message and the
//! same details by their names without the `leasehold-` prefix.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use leasehold_core::LockError;
use leasehold_proto::v1 as pb;
use serde_json::json;
use tonic::metadata::MetadataValue;

use crate::raft::ConsensusError;
use crate::service::ApiError;

fn grpc_code(e: &ApiError) -> tonic::Code {
    match e {
        ApiError::Lock(LockError::Invalid { .. }) => tonic::Code::InvalidArgument,
        ApiError::Lock(LockError::LeaseNotFound { .. }) => tonic::Code::NotFound,
        ApiError::Lock(LockError::WaitTimeout { .. }) => tonic::Code::DeadlineExceeded,
        ApiError::Lock(LockError::Unauthenticated { .. }) => tonic::Code::Unauthenticated,
        ApiError::Lock(LockError::PermissionDenied { .. } | LockError::NotOwner { .. }) => {
            tonic::Code::PermissionDenied
        }
        ApiError::Lock(_) => tonic::Code::FailedPrecondition,
        ApiError::Consensus(_) => tonic::Code::Unavailable,
        ApiError::NotFound(_) | ApiError::MethodNotAllowed(_) => tonic::Code::Unimplemented,
        ApiError::NotAdded(_) => tonic::Code::FailedPrecondition,
        ApiError::TlsRequired(_) => tonic::Code::Unavailable,
        ApiError::WatchBehind(_) => tonic::Code::Aborted,
        ApiError::ResourceExhausted(_) => tonic::Code::ResourceExhausted,
        ApiError::Internal(_) => tonic::Code::Internal,
    }
}

fn http_status(e: &ApiError) -> StatusCode {
    match e {
        ApiError::Lock(LockError::Invalid { .. }) => StatusCode::BAD_REQUEST,
        ApiError::Lock(LockError::LeaseNotFound { .. }) => StatusCode::NOT_FOUND,
        ApiError::Lock(LockError::LeaseExpired { .. }) => StatusCode::GONE,
        ApiError::Lock(LockError::WaitTimeout { .. }) => StatusCode::REQUEST_TIMEOUT,
        ApiError::Lock(LockError::Unauthenticated { .. }) => StatusCode::UNAUTHORIZED,
        ApiError::Lock(LockError::PermissionDenied { .. } | LockError::NotOwner { .. }) => {
            StatusCode::FORBIDDEN
        }
        ApiError::Lock(_) => StatusCode::CONFLICT,
        ApiError::Consensus(_) => StatusCode::SERVICE_UNAVAILABLE,
        ApiError::NotFound(_) => StatusCode::NOT_FOUND,
        ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
        ApiError::NotAdded(_) => StatusCode::CONFLICT,
        ApiError::TlsRequired(_) => StatusCode::BAD_REQUEST,
        ApiError::WatchBehind(_) => StatusCode::GONE,
        ApiError::ResourceExhausted(_) => StatusCode::TOO_MANY_REQUESTS,
        ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// Extra fields that let a caller act on the error without parsing the message.
fn details(e: &ApiError) -> Vec<(&'static str, String)> {
    match e {
        ApiError::Lock(LockError::Held {
            holder,
            lease,
            fence,
            ..
        }) => vec![
            ("holder", holder.clone()),
            ("lease", lease.to_string()),
            ("fence", fence.to_string()),
        ],
        ApiError::Lock(LockError::StaleFence {
            presented, current, ..
        }) => {
            let mut d = vec![("presented-fence", presented.to_string())];
            if let Some(c) = current {
                d.push(("current-fence", c.to_string()));
            }
            d
        }
        ApiError::Lock(LockError::LockDelayed { left_ms, .. }) => {
            vec![("delay-left-ms", left_ms.to_string())]
        }
        ApiError::Lock(LockError::PermissionDenied { key, needed }) => {
            vec![("key", key.clone()), ("needed", needed.to_string())]
        }
        ApiError::Lock(LockError::NotOwner { lease }) => vec![("lease", lease.to_string())],
        ApiError::Consensus(ConsensusError::NotLeader { leader: Some(l) }) => {
            vec![("leader", l.clone())]
        }
        _ => Vec::new(),
    }
}

impl From<ApiError> for pb::ErrorReply {
    fn from(e: ApiError) -> Self {
        pb::ErrorReply {
            code: e.code().to_string(),
            message: e.to_string(),
            details: details(&e)
                .into_iter()
                .map(|(name, value)| (name.to_string(), value))
                .collect(),
        }
    }
}

impl From<ApiError> for tonic::Status {
    fn from(e: ApiError) -> Self {
        let mut status = tonic::Status::new(grpc_code(&e), e.to_string());
        let md = status.metadata_mut();
        md.insert("leasehold-code", MetadataValue::from_static(e.code()));
        for (name, value) in details(&e) {
            let key = format!("leasehold-{name}");
            if let (Ok(k), Ok(v)) = (
                tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
                MetadataValue::try_from(value.as_str()),
            ) {
                md.insert(k, v);
            }
        }
        status
    }
}

/// The `leasehold-code` of a gRPC status that tonic made itself, before a
/// call reached us (a message over the size limit, one that does not
/// decode): every refusal carries a code.
fn code_of(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::InvalidArgument | tonic::Code::OutOfRange => "invalid_argument",
        tonic::Code::Unimplemented => "not_found",
        tonic::Code::Unauthenticated => "unauthenticated",
        tonic::Code::PermissionDenied => "permission_denied",
        tonic::Code::Unavailable => "unavailable",
        _ => "internal",
    }
}

/// Adds `leasehold-code` to a gRPC response that failed without one
/// (a status in the headers: tonic's answer to a request it refused).
pub async fn with_code(mut response: Response) -> Response {
    let headers = response.headers_mut();
    let code = headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .map(tonic::Code::from);
    if let Some(code) = code.filter(|c| *c != tonic::Code::Ok) {
        if !headers.contains_key("leasehold-code") {
            headers.insert(
                "leasehold-code",
                axum::http::HeaderValue::from_static(code_of(code)),
            );
        }
    }
    response
}

tokio::task_local! {
    /// `http` or `https`: how clients reach the nodes, for a `leader_url`.
    /// Set around each HTTP request (`http::router`); `http` outside one.
    pub static SCHEME: &'static str;
}

/// On an HTTP response: the leader's URL a follower named, for a client
/// that asked to be redirected there (`http::router`).
#[derive(Debug, Clone)]
pub struct LeaderUrl(pub String);

/// `http` or `https` for the request being served ([`SCHEME`]).
pub fn scheme() -> &'static str {
    SCHEME.try_with(|s| *s).unwrap_or("http")
}

impl ApiError {
    /// The leader's URL a `not_leader` names, scheme included.
    fn leader_url(&self) -> Option<String> {
        match self {
            ApiError::Consensus(ConsensusError::NotLeader { leader: Some(l) }) => {
                Some(format!("{}://{l}", scheme()))
            }
            _ => None,
        }
    }

    /// The JSON body of this error: `{"error": {"code", "message", ...}}`,
    /// on an HTTP response or an SSE `error` event.
    pub fn body(&self) -> serde_json::Value {
        let mut body = serde_json::Map::new();
        body.insert("code".into(), json!(self.code()));
        body.insert("message".into(), json!(self.to_string()));
        for (name, value) in details(self) {
            let name = name.replace('-', "_");
            // Names (a key, a holder) stay strings even when they look like numbers.
            let text = matches!(name.as_str(), "key" | "holder" | "needed" | "leader");
            let v = match value.parse::<u64>() {
                Ok(n) if !text => json!(n),
                _ => json!(value),
            };
            body.insert(name, v);
        }
        if let Some(url) = self.leader_url() {
            body.insert("leader_url".into(), json!(url));
        }
        json!({ "error": body })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (http_status(&self), axum::Json(self.body())).into_response();
        if let Some(url) = self.leader_url() {
            response.extensions_mut().insert(LeaderUrl(url));
        }
        response
    }
}
