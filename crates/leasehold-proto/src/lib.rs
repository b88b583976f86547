//! Generated types for the Leasehold gRPC API.
//!
//! The contract lives in `proto/leasehold.proto` at the repository root so that
//! clients in other languages can be generated from the same file.
#![allow(clippy::all, missing_docs)]

/// Version 1 of the API: package `leasehold.v1`.
pub mod v1 {
    tonic::include_proto!("leasehold.v1");
}
