//! The wire surfaces: gRPC and HTTP/JSON on one port.
//!
//! Both call the same [`LockService`](crate::service::LockService); errors map
//! to gRPC codes and HTTP statuses in one place ([`error`]).

pub mod error;
pub mod grpc;
pub mod http;

use crate::service::LockService;

/// The whole API as one router: gRPC requests (HTTP/2, `application/grpc`) go
/// to the tonic service, everything else to the HTTP/JSON routes.
pub fn router(service: LockService) -> axum::Router {
    let grpc = tonic::service::Routes::new(grpc::server(service.clone())).into_axum_router();
    http::router(service).merge(grpc)
}
