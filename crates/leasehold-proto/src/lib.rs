//! Generated types for the Leasehold gRPC API, and the [`frame`]d protocol
//! that carries the same messages without HTTP.
//!
//! The contract lives in `proto/leasehold.proto` at the repository root so that
//! clients in other languages can be generated from the same file.

pub mod codec;
pub mod frame;

/// The encoded `FileDescriptorSet` of `leasehold.proto` and `raft.proto`,
/// for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptors.bin"));

/// Raft between nodes (internal): package `leasehold.raft.v1`.
#[allow(clippy::all, missing_docs)]
pub mod raft {
    tonic::include_proto!("leasehold.raft.v1");
}

/// Version 1 of the API: package `leasehold.v1`.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("leasehold.v1");
}
