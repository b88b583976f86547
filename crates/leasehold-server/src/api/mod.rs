//! The wire surfaces on one port: gRPC, HTTP/JSON, and the framed protocol
//! ([`leasehold_proto::frame`]) the Rust client uses for calls that never wait.
//!
//! All call the same [`LockService`]; errors map
//! to gRPC codes, HTTP statuses and framed replies in one place ([`error`]).

mod calls;
pub mod error;
pub mod frames;
pub mod grpc;
mod health;
pub mod http;
mod ui;

use crate::service::LockService;

/// The whole API as one router: gRPC requests (HTTP/2, `application/grpc`) go
/// to the tonic service, everything else to the HTTP/JSON routes. With
/// `peer_certificates`, Raft calls need a connection with a peer's
/// certificate naming the node they come from. `scheme` is what clients
/// reach every node with (`http` or `https`), for the leader's URL a
/// follower names.
pub fn router(service: LockService, peer_certificates: bool, scheme: &'static str) -> axum::Router {
    let mut routes = tonic::service::Routes::new(grpc::server(service.clone()))
        .add_service(service.consensus().peers().grpc_service(peer_certificates))
        .add_service(health::service(service.consensus()));
    if let Some(reflection) = health::reflection() {
        routes = routes.add_service(reflection);
    }
    let grpc = routes
        .into_axum_router()
        .layer(axum::middleware::map_response(error::with_code));
    http::router(service, scheme)
        .merge(grpc)
        .fallback(http::not_found)
}

/// The service for one call: acting for the token of its `authorization`
/// value (`Bearer <token>`, the scheme in any case; `None` if it has no
/// such header, and `Some(None)` if the value is not text), for a caller on
/// this machine or not (`Local`, if the connection said), who showed a
/// client certificate with this subject or none.
fn caller_service(
    service: &LockService,
    authorization: Option<Option<&str>>,
    local: Option<&Local>,
    certificate: Option<&crate::tls::ClientSubject>,
) -> Result<LockService, crate::service::ApiError> {
    let bearer = match authorization {
        None => None,
        Some(value) => Some(value.and_then(bearer).ok_or_else(|| {
            leasehold_core::LockError::Unauthenticated {
                reason: "the authorization header must be `Bearer <token>`".into(),
            }
        })?),
    };
    let local = local.is_some_and(|l| l.0);
    Ok(service
        .from_local(local)
        .with_bearer(bearer)
        .with_certificate(certificate.map(|c| c.0.clone())))
}

/// Whether a connection comes from this machine. A request extension the
/// connection sets, for what only a local operator may do.
#[derive(Debug, Clone, Copy)]
pub struct Local(pub bool);

fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}
