//! `Client`: one lock API over any backend, chosen by URL.

use std::future::Future;
use std::sync::Arc;

use crate::backend::{Backend, Guarantee, LockEvent, LockOptions, LockStatus};
use crate::lease::{Lease, LeaseHandle};
use crate::tls::TlsOptions;
use crate::{Error, Fence, Mode, Result};

/// The default leaseholdd endpoint.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:7419";

/// A lock client. Cheap to clone; clones share one backend (and, for
/// leaseholdd, one session lease per TTL, renewed with one keepalive however
/// many locks hang off it).
#[derive(Clone)]
pub struct Client {
    backend: Arc<dyn Backend>,
    holder: String,
}

/// Builds a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    url: String,
    require: Guarantee,
    holder: Option<String>,
    tls: TlsOptions,
    token: Option<String>,
}

impl ClientBuilder {
    /// Refuses to build unless the backend gives at least this guarantee.
    pub fn require(mut self, guarantee: Guarantee) -> Self {
        self.require = guarantee;
        self
    }

    /// How this client names itself to others on contention (default: host/pid).
    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = Some(holder.into());
        self
    }

    /// The CA and client certificate for `https://` leaseholdd endpoints.
    pub fn tls(mut self, tls: TlsOptions) -> Self {
        self.tls = tls;
        self
    }

    /// The access token leaseholdd's auth needs (`lh_<id>_<secret>`, from
    /// `leasehold auth token create`); sent with every call.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into()).filter(|t: &String| !t.is_empty());
        self
    }

    /// Connects.
    pub async fn connect(self) -> Result<Client> {
        let backend =
            crate::backend::connect_with(&self.url, &self.tls, self.token.as_deref()).await?;
        Client::with_backend(backend, self.require, self.holder)
    }
}

fn default_holder() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}/pid-{}", std::process::id())
}

/// The same limits leaseholdd enforces (`leasehold_core::limits`), checked for
/// every backend before anything is sent, so bad input gets one clear error
/// whatever the store.
fn validate(key: &str, opts: &LockOptions) -> Result<()> {
    use leasehold_core::limits;
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    limits::validate_key(key)
        .and_then(|()| limits::validate_ttl(ms(opts.ttl)))
        .and_then(|()| limits::validate_wait(ms(opts.wait), ms(opts.lock_delay)))
        .and_then(|()| limits::validate_mode(opts.mode))
        .map_err(|e| Error::InvalidArgument(e.to_string()))
}

impl Client {
    /// Connects to a lock store by URL: `http://host:port` (leaseholdd),
    /// `redis://…`, `redlock://h1:p1,h2:p2,h3:p3`, `postgres://…`,
    /// `etcd://host:port`, `memory://`.
    pub async fn connect(url: &str) -> Result<Client> {
        Self::builder(url).connect().await
    }

    /// Connects to `LEASEHOLD_ENDPOINT`, or the default local leaseholdd,
    /// with TLS files from `LEASEHOLD_CACERT`, `LEASEHOLD_CLIENT_CERT` and
    /// `LEASEHOLD_CLIENT_KEY` ([`TlsOptions::from_env`]), the access
    /// token in `LEASEHOLD_TOKEN`, and the holder name in `LEASEHOLD_HOLDER`
    /// (else host/pid), as every Leasehold client reads them.
    pub async fn from_env() -> Result<Client> {
        let url =
            std::env::var("LEASEHOLD_ENDPOINT").unwrap_or_else(|_| DEFAULT_ENDPOINT.to_string());
        let mut builder = Self::builder(&url).tls(TlsOptions::from_env());
        if let Ok(token) = std::env::var("LEASEHOLD_TOKEN") {
            builder = builder.token(token);
        }
        if let Ok(holder) = std::env::var("LEASEHOLD_HOLDER") {
            if !holder.is_empty() {
                builder = builder.holder(holder);
            }
        }
        builder.connect().await
    }

    /// A builder, to require a guarantee or name the holder.
    pub fn builder(url: &str) -> ClientBuilder {
        ClientBuilder {
            url: url.to_string(),
            require: Guarantee::Efficiency,
            holder: None,
            tls: TlsOptions::default(),
            token: None,
        }
    }

    /// A client over an existing backend, refusing it if it promises less
    /// than `require`.
    pub fn with_backend(
        backend: Arc<dyn Backend>,
        require: Guarantee,
        holder: Option<String>,
    ) -> Result<Client> {
        if backend.guarantee() < require {
            return Err(Error::InsufficientGuarantee {
                backend: backend.name(),
                why: backend.efficiency_reason(),
            });
        }
        Ok(Client {
            backend,
            holder: holder.unwrap_or_else(default_holder),
        })
    }

    /// What the backend promises.
    pub fn guarantee(&self) -> Guarantee {
        self.backend.guarantee()
    }

    /// The shared limits, and what this backend can do.
    fn validate(&self, key: &str, opts: &LockOptions) -> Result<()> {
        validate(key, opts)?;
        if !opts.lock_delay.is_zero() && !self.backend.supports_lock_delay() {
            return Err(Error::Unsupported {
                backend: self.backend.name(),
                what: "lock-delay",
            });
        }
        if opts.mode != Mode::Exclusive && !self.backend.supports_modes() {
            return Err(Error::Unsupported {
                backend: self.backend.name(),
                what: "shared holds and semaphores",
            });
        }
        Ok(())
    }

    /// The backend's name.
    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// Takes `key` if it is free; answers at once.
    pub async fn try_acquire(&self, key: &str, opts: LockOptions) -> Result<Lease> {
        self.validate(key, &opts)?;
        let acquired = self.backend.acquire(key, &self.holder, &opts, None).await?;
        Ok(Lease::new(key, self.backend.name(), acquired))
    }

    /// Takes `key`, waiting up to `opts.wait` (in the server's FIFO queue on
    /// backends that have one).
    pub async fn acquire(&self, key: &str, opts: LockOptions) -> Result<Lease> {
        self.validate(key, &opts)?;
        let wait = Some(opts.wait);
        let acquired = self.backend.acquire(key, &self.holder, &opts, wait).await?;
        Ok(Lease::new(key, self.backend.name(), acquired))
    }

    /// Takes every key of `keys` if all are free, all or nothing, with one
    /// fencing token for the set (leaseholdd); answers at once. The lease's
    /// `key()` is the keys joined with `,`; its release releases them all.
    pub async fn try_acquire_set(&self, keys: &[&str], opts: LockOptions) -> Result<Lease> {
        self.take_set(keys, opts, false).await
    }

    /// Takes every key of `keys`, all or nothing, with one fencing token,
    /// waiting up to `opts.wait` in every key's queue at once (the server
    /// orders sets, so two sets never wait for each other, whatever order
    /// the keys are listed in).
    pub async fn acquire_set(&self, keys: &[&str], opts: LockOptions) -> Result<Lease> {
        self.take_set(keys, opts, true).await
    }

    async fn take_set(&self, keys: &[&str], opts: LockOptions, wait: bool) -> Result<Lease> {
        let Some(first) = keys.first() else {
            return Err(Error::InvalidArgument(
                "a lock set needs at least one key".into(),
            ));
        };
        self.validate(first, &opts)?;
        let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        leasehold_core::limits::validate_set(&keys)
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        if opts.mode != Mode::Exclusive {
            return Err(Error::InvalidArgument(
                "a lock set is held exclusively, with one token".into(),
            ));
        }
        let wait = wait.then_some(opts.wait);
        let acquired = self
            .backend
            .acquire_set(&keys, &self.holder, &opts, wait)
            .await?;
        Ok(Lease::new(&keys.join(","), self.backend.name(), acquired))
    }

    /// Takes `key` (waiting as `acquire` does), runs `body` with the lease, and
    /// releases. If the lease is lost first, `body` is cancelled (dropped at its
    /// next `.await`) and this returns [`Error::LeaseLost`].
    pub async fn with_lock<T, F, Fut>(&self, key: &str, opts: LockOptions, body: F) -> Result<T>
    where
        F: FnOnce(LeaseHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        let lease = self.acquire(key, opts).await?;
        let handle = lease.handle();
        let lost = lease.lost();
        let outcome = tokio::select! {
            biased;
            _ = lost => None,
            value = body(handle.clone()) => Some(value),
        };
        match outcome {
            Some(value) => {
                lease.release().await?;
                Ok(value)
            }
            None => {
                let reason = lease.lost_reason();
                drop(lease);
                Err(Error::LeaseLost {
                    key: key.to_string(),
                    reason,
                })
            }
        }
    }

    /// Locks under a prefix (leaseholdd).
    pub async fn status(&self, prefix: &str) -> Result<Vec<LockStatus>> {
        self.backend.status(prefix).await
    }

    /// Whether `fence` holds `key` as its only, exclusive holder now: the
    /// writer of a read/write lock (not a reader, not a semaphore permit).
    /// A [`leasehold_fence`-style] read/write gate asks this before it lets
    /// a write through. One linearizable read (leaseholdd).
    pub async fn is_writer(&self, key: &str, fence: Fence) -> Result<bool> {
        let status = self.backend.status(key).await?;
        Ok(status.iter().any(|l| {
            l.key == key
                && l.fence == Some(fence)
                && !l.shared
                && l.permits == 0
                && l.holders.len() == 1
        }))
    }

    /// A stream of lock events under a prefix from now on (leaseholdd).
    /// It outlives the node it comes from: a broken stream goes on at
    /// another endpoint after the last event it delivered, losing and
    /// repeating nothing, or ends with [`Error::WatchBehind`] when no node
    /// still has those events (list again, then watch again).
    pub async fn watch(
        &self,
        prefix: &str,
    ) -> Result<futures::stream::BoxStream<'static, Result<LockEvent>>> {
        self.backend.watch(prefix, None).await
    }

    /// [`Client::watch`] from just after the event at `index` and `seq`
    /// (an event's [`LockEvent::index`] and [`LockEvent::seq`], from an
    /// earlier watch): every event since, then on as `watch` does.
    pub async fn watch_after(
        &self,
        prefix: &str,
        index: u64,
        seq: u32,
    ) -> Result<futures::stream::BoxStream<'static, Result<LockEvent>>> {
        self.backend.watch(prefix, Some((index, seq))).await
    }

    /// Releases `key` if `fence` still holds it; never anyone else's hold.
    pub async fn release_by_fence(&self, key: &str, fence: Fence) -> Result<()> {
        self.backend.release_by_fence(key, fence).await
    }

    /// Ends this client's sessions, releasing what they hold.
    pub async fn close(&self) {
        self.backend.close().await;
    }
}
