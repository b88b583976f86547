//! Fence gates: the half of a fencing token that protects anything.
//!
//! A lock service hands out tokens; only the resource can refuse a holder that
//! was paused past its lease. A gate remembers, per resource, the highest token
//! it has admitted, and admits a write with token `t` only if `t >= highest`
//! (equal: the same holder writes again), raising `highest` to `t` in the same
//! atomic step. A refused write changes nothing and names both numbers.
//!
//! | gate | where the highest token lives | atomic with the write by |
//! |---|---|---|
//! | [`MemoryGate`] | this process, sharded maps | a shard mutex |
//! | [`PostgresGate`] | a `leasehold_fences` table, or your own column | the same statement or transaction |
//! | [`RedisGate`] | a hash `leasehold:fences` | one Lua script that checks and writes |
//! | [`http::FenceLayer`] | any gate | the gate, before the handler runs |
//! | [`FileGate`] | a `.fence` file beside the file | `flock` + write-then-rename |
//!
//! A resource behind a read/write lock takes writes only from its writer:
//! [`ReadWriteGate`] asks the lock service whether a token is the writer's
//! (an exclusive hold of the key, not a reader's) before its inner gate
//! checks the order.
//!
//! ```
//! use leasehold_fence::{FenceGate, MemoryGate, Stale};
//! # tokio_test_block_on(async {
//! let gate = MemoryGate::new();
//! gate.admit("ledger", 33).await.unwrap();
//! gate.admit("ledger", 34).await.unwrap();
//! let err = gate.admit("ledger", 33).await.unwrap_err();
//! assert_eq!(err.to_string(), "stale fence 33 < 34 for \"ledger\"");
//! # });
//! # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
//! # }
//! ```
#![deny(missing_docs)]

mod file;
pub mod http;
mod memory;
mod postgres;
mod redis;
mod rw;

pub use file::FileGate;
pub use memory::MemoryGate;
pub use postgres::PostgresGate;
pub use redis::RedisGate;
pub use rw::{ReadWriteGate, WriterCheck};

/// A fencing token.
pub type Fence = u64;

/// A write refused because a newer holder has written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stale fence {presented} < {highest} for {resource:?}")]
pub struct Stale {
    /// The resource.
    pub resource: String,
    /// The token the write carried.
    pub presented: Fence,
    /// The highest token admitted so far.
    pub highest: Fence,
}

/// Why a gate refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// A newer holder has written; this write must not land.
    #[error(transparent)]
    Stale(#[from] Stale),
    /// The gate's store failed; nothing was admitted.
    #[error("fence gate store: {0}")]
    Store(String),
    /// A write whose token is not the writer's of the read/write lock (a
    /// reader's, or no longer held): refused, nothing admitted.
    #[error("token {fence} does not hold {key:?} as its writer; write to {resource:?} refused")]
    NotWriter {
        /// The resource.
        resource: String,
        /// The read/write lock's key.
        key: String,
        /// The token the write carried.
        fence: Fence,
    },
}

/// Admits writes whose fencing token is at least the highest seen.
#[async_trait::async_trait]
pub trait FenceGate: Send + Sync {
    /// Admits `fence` for `resource` (and remembers it) or refuses it with
    /// [`Stale`]. Atomic: of two concurrent calls, a lower token never lands
    /// after a higher one.
    async fn admit(&self, resource: &str, fence: Fence) -> Result<(), GateError>;

    /// The highest token admitted for `resource` (0 if none).
    async fn highest(&self, resource: &str) -> Result<Fence, GateError>;
}
