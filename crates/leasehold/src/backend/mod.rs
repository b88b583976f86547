//! The lock stores, one file each, behind [`Backend`]: what every store
//! implements, and [`connect`], which picks one by URL.
//!
//! Each store but the in-memory one is behind a cargo feature of its own
//! (all on by default): `leaseholdd`, `redis` (Redis and Redlock),
//! `postgres`, `etcd`. A URL whose store is left out of the build is
//! refused with [`Error::BackendNotBuilt`], which names the feature.

#[cfg(feature = "leaseholdd")]
mod endpoints;
#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "leaseholdd")]
pub(crate) mod frames;
#[cfg(feature = "leaseholdd")]
pub mod leaseholdd;
pub mod memory;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redis")]
pub mod redlock;

use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;

use crate::keeper::Liveness;
use crate::tls::TlsOptions;
use crate::{Error, Fence, Mode, Result};

/// Opens the backend a URL names.
pub async fn connect(url: &str) -> Result<Arc<dyn Backend>> {
    connect_tls(url, &TlsOptions::default()).await
}

/// Opens the backend a URL names; an `https://` leaseholdd with `tls`.
pub async fn connect_tls(url: &str, tls: &TlsOptions) -> Result<Arc<dyn Backend>> {
    connect_with(url, tls, None).await
}

/// Opens the backend a URL names; a leaseholdd with `tls` (for
/// `https://`) and presenting `token` (other stores ignore both).
pub async fn connect_with(
    url: &str,
    tls: &TlsOptions,
    token: Option<&str>,
) -> Result<Arc<dyn Backend>> {
    let scheme = url.split_once("://").map(|(s, _)| s).unwrap_or("");
    // Only leaseholdd takes TLS options and a token.
    #[cfg(not(feature = "leaseholdd"))]
    let _ = (tls, token);
    match scheme {
        #[cfg(feature = "leaseholdd")]
        "http" | "https" | "leasehold" => Ok(Arc::new(
            leaseholdd::Leaseholdd::connect_with(url, tls, token).await?,
        )),
        #[cfg(not(feature = "leaseholdd"))]
        "http" | "https" | "leasehold" => Err(Error::BackendNotBuilt {
            backend: "leaseholdd",
            feature: "leaseholdd",
        }),
        "memory" => Ok(Arc::new(memory::Memory::new())),
        #[cfg(feature = "redis")]
        "redis" | "rediss" => Ok(Arc::new(redis::Redis::connect(url).await?)),
        #[cfg(feature = "redis")]
        "redlock" => Ok(Arc::new(redlock::Redlock::connect(url).await?)),
        #[cfg(not(feature = "redis"))]
        "redis" | "rediss" => Err(Error::BackendNotBuilt {
            backend: "redis",
            feature: "redis",
        }),
        #[cfg(not(feature = "redis"))]
        "redlock" => Err(Error::BackendNotBuilt {
            backend: "redlock",
            feature: "redis",
        }),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(Arc::new(postgres::Postgres::connect(url).await?)),
        #[cfg(not(feature = "postgres"))]
        "postgres" | "postgresql" => Err(Error::BackendNotBuilt {
            backend: "postgres",
            feature: "postgres",
        }),
        #[cfg(feature = "etcd")]
        "etcd" => Ok(Arc::new(etcd::Etcd::connect(url).await?)),
        #[cfg(not(feature = "etcd"))]
        "etcd" => Err(Error::BackendNotBuilt {
            backend: "etcd",
            feature: "etcd",
        }),
        _ => Err(Error::InvalidArgument(format!(
            "unknown backend URL {url:?}: use http://HOST:PORT (leaseholdd), redis://, redlock://, postgres://, etcd:// or memory://"
        ))),
    }
}

/// What a backend can promise (DESIGN §1 "Guarantees are part of the type").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Guarantee {
    /// May lose a grant on failover or restart; no usable fencing. Fine for
    /// avoiding duplicate work, not for protecting data.
    Efficiency,
    /// Consensus- or database-backed and durable, with fencing tokens that
    /// never go back.
    Correctness,
}

/// How to take a lock.
#[derive(Debug, Clone)]
pub struct LockOptions {
    /// The lease TTL. Renewal runs every TTL/3.
    pub ttl: Duration,
    /// How long `acquire` waits for the lock (ignored by `try_acquire`).
    pub wait: Duration,
    /// After an expiry of this hold, nobody may take the key for this long
    /// (where the backend supports it).
    pub lock_delay: Duration,
    /// How the hold shares the key: alone (the default), as one of many
    /// readers, or as one of a semaphore's permits (leaseholdd only).
    pub mode: Mode,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: Duration::from_secs(15),
            wait: Duration::from_secs(30),
            lock_delay: Duration::ZERO,
            mode: Mode::Exclusive,
        }
    }
}

impl LockOptions {
    /// These options with another TTL.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// These options with another wait.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// These options with a lock-delay.
    pub fn lock_delay(mut self, lock_delay: Duration) -> Self {
        self.lock_delay = lock_delay;
        self
    }

    /// A reader's hold of a read/write lock: shared with other readers,
    /// never with a writer (an exclusive hold of the same key). A waiting
    /// writer stops new readers, so writers never starve.
    pub fn shared(mut self) -> Self {
        self.mode = Mode::Shared;
        self
    }

    /// One permit of a counting semaphore of `permits`: up to that many
    /// holders at once, each with its own fencing token, the rest waiting in
    /// line. Every holder must name the same number.
    pub fn permits(mut self, permits: u32) -> Self {
        self.mode = Mode::Permit { permits };
        self
    }
}

/// The wire form of a mode: (`mode`, `permits`) of an acquire request.
#[cfg(feature = "leaseholdd")]
pub(crate) fn wire_mode(mode: Mode) -> (leasehold_proto::v1::Mode, u32) {
    use leasehold_proto::v1::Mode as Wire;
    match mode {
        Mode::Exclusive => (Wire::Exclusive, 0),
        Mode::Shared => (Wire::Shared, 0),
        Mode::Permit { permits } => (Wire::Permit, permits),
    }
}

/// A granted lock, as a backend hands it to [`Lease`](crate::Lease).
pub struct Acquired {
    /// The fencing token, where the backend has them.
    pub fence: Option<Fence>,
    /// What the previous holder saved.
    pub checkpoint: Option<Vec<u8>>,
    /// Lost when renewal fails or the client deadline passes.
    pub liveness: Liveness,
    /// Releases and checkpoints this hold.
    pub hold: Box<dyn Hold>,
}

/// One held lock, from the backend's side.
#[async_trait::async_trait]
pub trait Hold: Send + Sync + 'static {
    /// Stops any renewal of this hold, waits until none is in flight, then
    /// releases it, checking ownership. Never releases a newer holder's lock.
    async fn release(self: Box<Self>) -> Result<()>;

    /// Saves a checkpoint fenced by this hold's token.
    async fn save_checkpoint(&self, _data: &[u8]) -> Result<()> {
        Err(Error::Unsupported {
            backend: "this",
            what: "checkpoints",
        })
    }
}

/// A lock as listed by `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockStatus {
    /// The key.
    pub key: String,
    /// Who holds it (empty if free).
    pub holder: String,
    /// The holder's token.
    pub fence: Option<Fence>,
    /// The holder's lease id (leaseholdd; `None` where the store has no
    /// leases, or the key is free).
    pub lease: Option<u64>,
    /// Milliseconds until the holder's lease expires unless renewed.
    pub ttl_left_ms: u64,
    /// How many wait in its queue.
    pub waiters: usize,
    /// Every holder: (name, token), the first first; several for readers
    /// or a semaphore.
    pub holders: Vec<(String, Fence)>,
    /// A semaphore's size (0 for a lock).
    pub permits: u32,
    /// Whether the holders are readers of a read/write lock.
    pub shared: bool,
    /// The checkpoint stored with the key, and the token of the holder that
    /// saved it (leaseholdd).
    pub checkpoint: Option<(Fence, Vec<u8>)>,
}

/// A change to a lock, from `watch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockEvent {
    /// `acquired`, `released`, `expired`, or `checkpoint` (the holder saved
    /// one, in `data`).
    pub kind: String,
    /// The key.
    pub key: String,
    /// The token of the hold that began or ended.
    pub fence: Fence,
    /// The holder's name.
    pub holder: String,
    /// With `checkpoint`: the bytes saved (empty: cleared).
    pub data: Vec<u8>,
    /// The log index of the entry that made it (leaseholdd; 0 elsewhere).
    /// With `seq`, it orders events for the life of the deployment: a
    /// watch that breaks goes on after the last one it delivered.
    pub index: u64,
    /// Its ordinal among the lock events of that entry.
    pub seq: u32,
}

/// A lock store. Each implementation is one file under `backend/`; all of them
/// pass the same conformance suite (`tests/conformance.rs`).
#[async_trait::async_trait]
pub trait Backend: Send + Sync + 'static {
    /// A short name: `leaseholdd`, `redis`, `redlock`, `postgres`, `etcd`, `memory`.
    fn name(&self) -> &'static str;

    /// What this backend promises.
    fn guarantee(&self) -> Guarantee;

    /// For an efficiency backend, why it cannot promise correctness.
    fn efficiency_reason(&self) -> &'static str {
        ""
    }

    /// Whether it keeps a key from being taken for a while after its holder's
    /// lease expired ([`LockOptions::lock_delay`]). Where it does not, asking
    /// for a lock-delay is refused rather than silently ignored.
    fn supports_lock_delay(&self) -> bool {
        false
    }

    /// Whether it has shared holds and semaphores ([`LockOptions::mode`]).
    /// Where it does not, asking for one is refused.
    fn supports_modes(&self) -> bool {
        false
    }

    /// Takes `key`: at once when `wait` is `None`, otherwise waiting up to it.
    async fn acquire(
        &self,
        key: &str,
        holder: &str,
        opts: &LockOptions,
        wait: Option<Duration>,
    ) -> Result<Acquired>;

    /// Takes every key of `keys` at once, all or nothing, with one fencing
    /// token, waiting (like `acquire`) in every key's queue.
    async fn acquire_set(
        &self,
        _keys: &[String],
        _holder: &str,
        _opts: &LockOptions,
        _wait: Option<Duration>,
    ) -> Result<Acquired> {
        Err(Error::Unsupported {
            backend: self.name(),
            what: "lock sets",
        })
    }

    /// Lists locks under a prefix.
    async fn status(&self, _prefix: &str) -> Result<Vec<LockStatus>> {
        Err(Error::Unsupported {
            backend: self.name(),
            what: "listing locks",
        })
    }

    /// Streams lock events under a prefix: from now on, or every one after
    /// the position `after` (an event's `index` and `seq`).
    async fn watch(
        &self,
        _prefix: &str,
        _after: Option<(u64, u32)>,
    ) -> Result<BoxStream<'static, Result<LockEvent>>> {
        Err(Error::Unsupported {
            backend: self.name(),
            what: "watching locks",
        })
    }

    /// Releases a lock by key and token without holding it (an operator's or a
    /// script's release). Ownership is still checked by the token.
    async fn release_by_fence(&self, _key: &str, _fence: Fence) -> Result<()> {
        Err(Error::Unsupported {
            backend: self.name(),
            what: "release by fence",
        })
    }

    /// Ends sessions and stops background work.
    async fn close(&self) {}
}

/// The next pause of a jittered, bounded backoff: 5-15 ms, doubling per
/// attempt up to 80-240 ms.
#[cfg(any(feature = "redis", feature = "postgres"))]
pub(crate) fn backoff_delay(attempt: &mut u32) -> Duration {
    let base = Duration::from_millis(10u64 << (*attempt).min(4)); // 10 ms .. 160 ms
    *attempt += 1;
    let jitter = Duration::from_millis(rand::random::<u64>() % (base.as_millis() as u64 + 1));
    base / 2 + jitter
}

/// Waits with jittered, bounded backoff until `give_up`; `false` past it.
#[cfg(any(feature = "redis", feature = "postgres"))]
pub(crate) async fn backoff(attempt: &mut u32, give_up: tokio::time::Instant) -> bool {
    let at = tokio::time::Instant::now() + backoff_delay(attempt);
    if at >= give_up {
        return false;
    }
    tokio::time::sleep_until(at).await;
    true
}
