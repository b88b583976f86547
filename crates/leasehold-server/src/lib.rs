//! `leaseholdd`, the Leasehold lock server.
//!
//! # Layout
//!
//! Public are what the binary, the CLI's embedded demo and the simulation
//! use; the rest is private to the server.
//!
//! - [`raft`]: openraft glue. The lock table from `leasehold-core` is the state
//!   machine; the log and snapshots live on disk with group commit. All openraft
//!   types stay in this module.
//! - [`hub`]: hands applied events to queued acquirers and watch streams, and
//!   keeps the recent ones for watches that resume.
//! - [`context`]: the node's metrics and auth cache, passed where needed.
//! - `auth_cache`: callers' tokens, remembered until auth changes.
//! - [`service`]: the operations, validated at the edge, over [`raft::Consensus`].
//! - `metrics`: Prometheus metrics.
//! - [`expiry`]: the leader's driver that proposes ticks when something is due.
//! - `api`: gRPC (tonic) and HTTP/JSON (axum) on one port, errors mapped in one place.
//! - [`net`]: one client connection: protocol sniffing, timeouts, the cap.
//! - [`server`]: wiring, for the binary and for tests.
//! - [`allocator`]: when freed memory goes back to the operating system.

pub mod admission;
pub mod allocator;
mod api;
mod auth_cache;
pub mod config_file;
pub mod context;
pub mod expiry;
#[doc(hidden)]
pub mod fuzzing;
pub mod hub;
mod metrics;
pub mod net;
pub mod raft;
pub mod server;
pub mod service;
mod shutdown;
pub mod tls;
