//! Leasehold client: locks that are a lease plus a fencing token.
//!
//! A [`Lease`] renews itself every TTL/3 and tells you the moment it is lost:
//! when renewal fails, the store says it expired, or the client-side deadline
//! (`sent_at + ttl - margin`) passes, whichever comes first — so the client
//! always gives up before the store does. Every write the lock protects should
//! carry the lease's fencing token, so that the resource can refuse a holder
//! that was paused past its lease.
//!
//! ```no_run
//! use std::time::Duration;
//! use leasehold::{Client, LockOptions};
//!
//! # async fn write_ledger(_fence: u64) {}
//! # async fn run() -> Result<(), leasehold::Error> {
//! let locks = Client::connect("http://127.0.0.1:7419").await?;
//! let lease = locks
//!     .acquire("order:42", LockOptions::default().ttl(Duration::from_secs(10)))
//!     .await?;
//! tokio::select! {
//!     _ = async {
//!         for _ in 0..100 {
//!             // Check right before each fenced action; fails once the lease is lost.
//!             let Ok(fence) = lease.token() else { break };
//!             write_ledger(fence).await;
//!         }
//!     } => {}
//!     _ = lease.lost() => eprintln!("lease lost: {}; stopping", lease.lost_reason()),
//! }
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Backends
//! [`Client::connect`] picks the store by URL; each declares the
//! [`Guarantee`] it can give, and [`ClientBuilder::require`] refuses a
//! backend that promises less than you need.
//!
//! | URL | backend | guarantee |
//! |---|---|---|
//! | `http://host:7419` | leaseholdd | Correctness |
//! | `postgres://user@host/db` | PostgreSQL | Correctness |
//! | `etcd://host:2379` | etcd | Correctness |
//! | `redis://host:6379` | one Redis | Efficiency |
//! | `redlock://h1:p,h2:p,h3:p` | Redlock | Efficiency, no fencing tokens |
//! | `memory://` | this process only | Correctness (in-process) |
//!
//! The in-memory store is leaseholdd's own lock table inside the process,
//! with the server's semantics: a FIFO queue of waiters, lock-delay,
//! checkpoints and one sequence of fencing tokens.
//!
//! # Features
//! Each store but the in-memory one is a cargo feature, and all are on by
//! default:
//!
//! | feature | stores | brings in |
//! |---|---|---|
//! | `leaseholdd` | `http://`, `https://` | tonic, prost, rustls |
//! | `redis` | `redis://`, `redlock://` | redis |
//! | `postgres` | `postgres://` | tokio-postgres |
//! | `etcd` | `etcd://` | etcd-client |
//!
//! A URL whose store is not built is refused with
//! [`Error::BackendNotBuilt`], which names the feature to enable.
//! [`TlsOptions`] is always there; loading it (and
//! `TlsOptions::grpc`) needs `leaseholdd`.
#![deny(missing_docs)]

pub mod backend;
mod client;
pub mod election;
mod error;
pub mod keeper;
mod lease;
#[cfg(feature = "planted-bugs")]
pub mod planted;
mod tls;

pub use backend::{Backend, Guarantee, LockEvent, LockOptions, LockStatus};
pub use client::{Client, ClientBuilder, DEFAULT_ENDPOINT};
pub use election::{Election, Leader, Leadership};
pub use error::{Error, Result};
pub use lease::{Lease, LeaseHandle};
pub use leasehold_core::limits::MAX_RENEWALS_PER_CALL;
pub use leasehold_core::Mode;
#[cfg(feature = "leaseholdd")]
pub use tls::diagnose as diagnose_tls;
pub use tls::{advice as tls_advice, explain as explain_tls, TlsOptions};

/// A fencing token.
pub type Fence = u64;
