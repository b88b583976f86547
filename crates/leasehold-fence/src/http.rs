//! HTTP: a tower layer that refuses stale writers, and the header clients send.
//!
//! Server side: `Router::new().route(...).layer(FenceLayer::new(gate))`. Each
//! request that changes something (not `GET`/`HEAD`/`OPTIONS`) must carry
//! `Fencing-Token: N`; the resource is the `Fencing-Resource` header or, if
//! absent, the request path. The layer holds a per-resource lock from the
//! admission until the handler has answered, so a lower token admitted first
//! cannot finish its write after a higher one. A stale token gets `409` with a
//! body that names both numbers; a missing token `428`, a malformed one `400`.
//!
//! Client side: send [`FENCING_TOKEN`] with the lease's token, e.g.
//! `request.header(FENCING_TOKEN, lease.token()?)`.

use std::collections::hash_map::DefaultHasher;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{Method, Request, Response, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;
use tower::{Layer, Service};

use crate::{FenceGate, GateError};

/// The header that carries the fencing token.
pub const FENCING_TOKEN: &str = "fencing-token";
/// The header that names the resource (defaults to the request path).
pub const FENCING_RESOURCE: &str = "fencing-resource";

const SHARDS: usize = 64;

/// Adds fence checks to a service.
#[derive(Clone)]
pub struct FenceLayer {
    gate: Arc<dyn FenceGate>,
    order: Arc<Vec<tokio::sync::Mutex<()>>>,
}

impl FenceLayer {
    /// Checks tokens against `gate`.
    pub fn new(gate: Arc<dyn FenceGate>) -> Self {
        FenceLayer {
            gate,
            order: Arc::new((0..SHARDS).map(|_| tokio::sync::Mutex::new(())).collect()),
        }
    }
}

impl<S> Layer<S> for FenceLayer {
    type Service = FenceService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        FenceService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`FenceLayer`] wraps around yours.
#[derive(Clone)]
pub struct FenceService<S> {
    inner: S,
    layer: FenceLayer,
}

fn refuse(
    status: StatusCode,
    code: &str,
    message: String,
    extra: serde_json::Value,
) -> Response<Body> {
    let mut error = json!({ "code": code, "message": message });
    if let (Some(e), serde_json::Value::Object(more)) = (error.as_object_mut(), extra) {
        e.extend(more);
    }
    (status, Json(json!({ "error": error }))).into_response()
}

impl<S> Service<Request<Body>> for FenceService<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        // The clone that was made ready is the one we must call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        Box::pin(async move {
            if matches!(
                *request.method(),
                Method::GET | Method::HEAD | Method::OPTIONS
            ) {
                return inner.call(request).await;
            }
            let resource = request
                .headers()
                .get(FENCING_RESOURCE)
                .and_then(|v| v.to_str().ok())
                .map_or_else(|| request.uri().path().to_string(), str::to_string);
            let Some(raw) = request.headers().get(FENCING_TOKEN) else {
                return Ok(refuse(
                    StatusCode::PRECONDITION_REQUIRED,
                    "fence_required",
                    format!("writes to {resource:?} need a {FENCING_TOKEN} header"),
                    json!({}),
                ));
            };
            let Some(fence) = raw.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()) else {
                return Ok(refuse(
                    StatusCode::BAD_REQUEST,
                    "invalid_argument",
                    format!("{FENCING_TOKEN} must be a non-negative integer"),
                    json!({}),
                ));
            };
            let mut h = DefaultHasher::new();
            resource.hash(&mut h);
            let _order = layer.order[(h.finish() as usize) % SHARDS].lock().await;
            match layer.gate.admit(&resource, fence).await {
                Ok(()) => inner.call(request).await,
                Err(GateError::Stale(stale)) => Ok(refuse(
                    StatusCode::CONFLICT,
                    "stale_fence",
                    stale.to_string(),
                    json!({ "presented": stale.presented, "highest": stale.highest }),
                )),
                Err(e @ GateError::Store(_)) => Ok(refuse(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    e.to_string(),
                    json!({}),
                )),
                Err(e @ GateError::NotWriter { .. }) => Ok(refuse(
                    StatusCode::CONFLICT,
                    "not_writer",
                    e.to_string(),
                    json!({}),
                )),
            }
        })
    }
}
