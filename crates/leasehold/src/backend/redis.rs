//! A single Redis — `Efficiency`.
//!
//! Acquire is `SET key value NX PX ttl` and an `INCR` of a fencing counter in
//! one Lua script; renew and release are scripts that compare the owner
//! before `PEXPIRE`/`DEL` (there is no blind `DEL`). A release publishes on
//! the key's channel; a waiting acquire subscribes to it and tries again when
//! it hears one, or when the holder's TTL runs out, with a bounded backoff
//! beneath both in case a message is missed. A lock-delay keeps the key in
//! Redis for the delay beyond the lease the holder counts (see `try_once`). The token is only as
//! durable as Redis: after a failover, or a restart without fsync, the lock
//! and the counter can both be lost and the counter can go back. Hence
//! efficiency: good for avoiding duplicate work, not for protecting data.

use parking_lot::Mutex;
use std::time::Duration;

use futures::StreamExt;
use redis::aio::{MultiplexedConnection, PubSub};
use redis::Script;
use tokio::time::Instant;

use super::{backoff_delay, Acquired, Backend, Guarantee, Hold, LockOptions};
use crate::keeper::{Keeper, RenewError};
use crate::{Error, Fence, Result};

const PREFIX: &str = "leasehold:lock:";
const CHECKPOINT_PREFIX: &str = "leasehold:checkpoint:";
const FENCE_KEY: &str = "leasehold:fence";
/// Where a release of a key is announced.
const RELEASED_PREFIX: &str = "leasehold:released:";

/// Sets the lock if free and takes a token; otherwise returns the holder's
/// value and its TTL left in milliseconds.
const ACQUIRE: &str = r"
if redis.call('SET', KEYS[1], 'pending', 'NX', 'PX', ARGV[2]) then
  local fence = redis.call('INCR', KEYS[2])
  redis.call('SET', KEYS[1], fence .. '|' .. ARGV[1], 'PX', ARGV[2])
  return {1, fence, redis.call('GET', KEYS[3]) or false}
end
return {0, redis.call('GET', KEYS[1]) or '', redis.call('PTTL', KEYS[1])}
";
const RENEW: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
";
/// Releases only if the value still names this fence (a release by token),
/// and tells the key's waiters.
const RELEASE: &str = r"
local v = redis.call('GET', KEYS[1])
if not v then return -1 end
local f = tonumber(string.match(v, '^(%d+)|'))
if f == tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', KEYS[2], ARGV[1])
  return 0
end
return f or -1
";
const CHECKPOINT: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[2], ARGV[2]) return 1 end
return 0
";

fn redis_error(e: redis::RedisError) -> Error {
    refusal(e.kind(), e.code(), e.detail(), e.to_string())
}

/// What a Redis error of `kind` (with the server's error `code` and
/// `detail`, when the server answered with one) asks of the caller;
/// `shown` is the whole error, for the message.
fn refusal(
    kind: redis::ErrorKind,
    code: Option<&str>,
    detail: Option<&str>,
    shown: String,
) -> Error {
    use redis::ErrorKind as Kind;
    match (kind, code) {
        (Kind::AuthenticationFailed, _) | (_, Some("NOAUTH" | "WRONGPASS")) => {
            Error::Unauthenticated(format!(
                "redis: {shown}: put the user and password in the URL (redis://USER:PASSWORD@HOST:PORT)"
            ))
        }
        (_, Some("NOPERM")) => Error::PermissionDenied(format!(
            "redis: {shown}: the user's ACL must allow EVAL, PUBLISH and SUBSCRIBE on the leasehold:* keys and channels"
        )),
        (_, Some("OOM")) => Error::ResourceExhausted {
            backend: "redis",
            reason: format!("{shown}: free memory in Redis or raise its maxmemory"),
        },
        (_, Some("ERR")) if detail.is_some_and(|d| d.contains("max number of clients")) => {
            Error::ResourceExhausted {
                backend: "redis",
                reason: format!("{shown}: close clients or raise Redis's maxclients"),
            }
        }
        (Kind::Moved | Kind::Ask | Kind::CrossSlot, _) => Error::Unsupported {
            backend: "redis",
            what: "Redis Cluster (point redis:// at one primary, or use redlock://)",
        },
        (Kind::InvalidClientConfig, _) => Error::InvalidArgument(format!("redis: {shown}")),
        // "Not now": a replica (after a failover), a server still loading
        // its data or busy with a script, a cluster without a primary.
        (
            Kind::ReadOnly
            | Kind::BusyLoadingError
            | Kind::TryAgain
            | Kind::ClusterDown
            | Kind::MasterDown,
            _,
        )
        | (_, Some("BUSY")) => Error::Unavailable(format!("redis: {shown}")),
        // Any other answer from the server (a script that failed, a key of
        // another type): sending it again will not change it.
        (_, Some(_)) | (Kind::TypeError | Kind::ParseError, _) => {
            Error::Other(format!("redis: {shown}"))
        }
        // No answer: the connection failed or closed.
        _ => Error::Unavailable(format!("redis: {shown}")),
    }
}

/// Parses `FENCE|OWNER|HOLDER`.
fn parse_value(v: &str) -> (Option<Fence>, String) {
    let mut parts = v.splitn(3, '|');
    let fence = parts.next().and_then(|f| f.parse().ok());
    let _owner = parts.next();
    (fence, parts.next().unwrap_or("").to_string())
}

/// Takes and holds locks in one Redis; shared by the Redlock backend per node.
#[derive(Clone)]
pub(crate) struct Node {
    pub(crate) conn: MultiplexedConnection,
    /// For connections of other kinds (waiters' subscriptions).
    client: redis::Client,
}

impl Node {
    pub(crate) async fn connect(url: &str) -> Result<Node> {
        let client = redis::Client::open(url)
            .map_err(|e| Error::InvalidArgument(format!("redis URL {url:?}: {e}")))?;
        let conn = tokio::time::timeout(
            Duration::from_secs(3),
            client.get_multiplexed_async_connection(),
        )
        .await
        .map_err(|_| Error::Unavailable(format!("redis at {url}: connect timed out")))?
        .map_err(redis_error)?;
        Ok(Node { conn, client })
    }

    /// `SET NX PX` with `value`; returns whether it was set.
    pub(crate) async fn set_nx(&self, key: &str, value: &str, ttl: Duration) -> Result<bool> {
        let r: Option<String> = redis::cmd("SET")
            .arg(format!("{PREFIX}{key}"))
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis() as u64)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(redis_error)?;
        Ok(r.is_some())
    }

    /// Extends the lock if `value` still owns it.
    pub(crate) async fn renew(&self, key: &str, value: &str, ttl: Duration) -> Result<bool> {
        let n: i64 = Script::new(RENEW)
            .key(format!("{PREFIX}{key}"))
            .arg(value)
            .arg(ttl.as_millis() as u64)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_error)?;
        Ok(n == 1)
    }

    /// Deletes the lock if `value` still owns it.
    pub(crate) async fn release_value(&self, key: &str, value: &str) -> Result<bool> {
        let n: i64 = Script::new("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0")
            .key(format!("{PREFIX}{key}"))
            .arg(value)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_error)?;
        Ok(n == 1)
    }
}

/// The single-Redis backend.
pub struct Redis {
    node: Node,
    /// A listening connection not in use, kept for the next wait.
    idle_listener: Mutex<Option<PubSub>>,
}

/// What one try found.
enum Attempt {
    Acquired(Acquired),
    /// Someone holds it, for this much longer unless renewed.
    Held(Error, Duration),
}

impl Redis {
    /// Connects to `redis://host:port[/db]`.
    pub async fn connect(url: &str) -> Result<Redis> {
        Ok(Redis {
            node: Node::connect(url).await?,
            idle_listener: Mutex::new(None),
        })
    }

    /// A connection subscribed to `key`'s releases, or `None` if Redis
    /// cannot give one now (the wait then polls).
    async fn listen(&self, key: &str) -> Option<PubSub> {
        let idle = self.idle_listener.lock().take();
        let mut listener = match idle {
            Some(l) => l,
            None => {
                tokio::time::timeout(Duration::from_secs(1), self.node.client.get_async_pubsub())
                    .await
                    .ok()?
                    .ok()?
            }
        };
        listener
            .subscribe(format!("{RELEASED_PREFIX}{key}"))
            .await
            .ok()?;
        Some(listener)
    }

    /// Keeps `listener` for the next wait once it no longer hears `key`.
    async fn stop_listening(&self, mut listener: PubSub, key: &str) {
        if listener
            .unsubscribe(format!("{RELEASED_PREFIX}{key}"))
            .await
            .is_ok()
        {
            *self.idle_listener.lock() = Some(listener);
        }
    }

    /// One try. The key lives `ttl + lock_delay` in Redis, renewed to that,
    /// while the holder counts its lease as `ttl`: a holder that stops
    /// renewing keeps the key from others for the lock-delay after its lease
    /// ends, and a release deletes it at once.
    async fn try_once(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        lock_delay: Duration,
    ) -> Result<Attempt> {
        let kept = ttl + lock_delay;
        let owner = format!("{:016x}|{holder}", rand::random::<u64>());
        let sent_at = Instant::now();
        let (taken, second, third): (i64, redis::Value, redis::Value) = Script::new(ACQUIRE)
            .key(format!("{PREFIX}{key}"))
            .key(FENCE_KEY)
            .key(format!("{CHECKPOINT_PREFIX}{key}"))
            .arg(&owner)
            .arg(kept.as_millis() as u64)
            .invoke_async(&mut self.node.conn.clone())
            .await
            .map_err(redis_error)?;
        if taken == 0 {
            let value: String = redis::from_redis_value(&second).unwrap_or_default();
            let (fence, holder) = parse_value(&value);
            // -2: gone since; -1: no TTL (not ours); either way, look again soon.
            let ttl_left: i64 = redis::from_redis_value(&third).unwrap_or(0);
            let held = Error::Held {
                key: key.to_string(),
                holder,
                fence,
            };
            let ttl_left = Duration::from_millis(u64::try_from(ttl_left).unwrap_or(0));
            return Ok(Attempt::Held(held, ttl_left));
        }
        let fence: Fence =
            redis::from_redis_value(&second).map_err(|e| Error::Other(format!("redis: {e}")))?;
        let checkpoint: Option<Vec<u8>> = redis::from_redis_value(&third).ok();
        let value = format!("{fence}|{owner}");
        let (node, k, v) = (self.node.clone(), key.to_string(), value.clone());
        let keeper = Keeper::spawn(ttl, sent_at, move || {
            let (node, k, v) = (node.clone(), k.clone(), v.clone());
            async move {
                match node.renew(&k, &v, kept).await {
                    Ok(true) => Ok(()),
                    Ok(false) => Err(RenewError::Lost("the lock expired in Redis".into())),
                    Err(e) => Err(RenewError::Transient(e.to_string())),
                }
            }
        });
        Ok(Attempt::Acquired(Acquired {
            fence: Some(fence),
            checkpoint,
            liveness: keeper.liveness().clone(),
            hold: Box::new(RedisHold {
                node: self.node.clone(),
                key: key.to_string(),
                value,
                fence,
                keeper,
            }),
        }))
    }
}

#[async_trait::async_trait]
impl Backend for Redis {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn guarantee(&self) -> Guarantee {
        Guarantee::Efficiency
    }

    fn efficiency_reason(&self) -> &'static str {
        "a single Redis loses locks and fencing counters on failover or on a restart without fsync"
    }

    fn supports_lock_delay(&self) -> bool {
        true
    }

    async fn acquire(
        &self,
        key: &str,
        holder: &str,
        opts: &LockOptions,
        wait: Option<Duration>,
    ) -> Result<Acquired> {
        let give_up = Instant::now() + wait.unwrap_or_default();
        let mut attempt = 0;
        let mut listener: Option<PubSub> = None;
        let mut subscribed = false;
        let outcome = loop {
            let tried = self.try_once(key, holder, opts.ttl, opts.lock_delay);
            let ttl_left = match tried.await {
                Ok(Attempt::Acquired(acquired)) => break Ok(acquired),
                Ok(Attempt::Held(held, _)) if wait.is_none() => break Err(held),
                Ok(Attempt::Held(_, ttl_left)) => ttl_left,
                Err(e) => break Err(e),
            };
            if !subscribed {
                // Subscribe, then try again at once: a release between the
                // try above and the subscription would go unheard.
                subscribed = true;
                listener = self.listen(key).await;
                if listener.is_some() {
                    continue;
                }
            }
            // Try again when a release is heard, when the holder's TTL runs
            // out, or after the backoff, whichever comes first.
            let at = Instant::now() + backoff_delay(&mut attempt).min(ttl_left);
            if at >= give_up {
                break Err(Error::Timeout {
                    key: key.to_string(),
                });
            }
            let gone = match listener.as_mut() {
                Some(l) => {
                    let mut releases = l.on_message();
                    tokio::select! {
                        heard = releases.next() => heard.is_none(),
                        _ = tokio::time::sleep_until(at) => false,
                    }
                }
                None => {
                    tokio::time::sleep_until(at).await;
                    false
                }
            };
            if gone {
                listener = None; // the connection went away: poll from now on
            }
        };
        if let Some(l) = listener {
            self.stop_listening(l, key).await;
        }
        outcome
    }

    async fn release_by_fence(&self, key: &str, fence: Fence) -> Result<()> {
        release_fence(&self.node, key, fence).await
    }
}

async fn release_fence(node: &Node, key: &str, fence: Fence) -> Result<()> {
    let n: i64 = Script::new(RELEASE)
        .key(format!("{PREFIX}{key}"))
        .key(format!("{RELEASED_PREFIX}{key}"))
        .arg(fence)
        .invoke_async(&mut node.conn.clone())
        .await
        .map_err(redis_error)?;
    match n {
        0 => Ok(()),
        -1 => Err(Error::StaleFence {
            presented: fence,
            current: None,
        }),
        current => Err(Error::StaleFence {
            presented: fence,
            current: u64::try_from(current).ok(),
        }),
    }
}

struct RedisHold {
    node: Node,
    key: String,
    value: String,
    fence: Fence,
    keeper: Keeper,
}

#[async_trait::async_trait]
impl Hold for RedisHold {
    async fn release(self: Box<Self>) -> Result<()> {
        self.keeper.stop().await;
        release_fence(&self.node, &self.key, self.fence).await
    }

    async fn save_checkpoint(&self, data: &[u8]) -> Result<()> {
        let n: i64 = Script::new(CHECKPOINT)
            .key(format!("{PREFIX}{}", self.key))
            .key(format!("{CHECKPOINT_PREFIX}{}", self.key))
            .arg(&self.value)
            .arg(data)
            .invoke_async(&mut self.node.conn.clone())
            .await
            .map_err(redis_error)?;
        if n == 1 {
            Ok(())
        } else {
            Err(Error::StaleFence {
                presented: self.fence,
                current: None,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::ErrorKind as Kind;

    fn map(kind: Kind, code: Option<&str>, detail: Option<&str>) -> Error {
        refusal(kind, code, detail, format!("{code:?} {detail:?}"))
    }

    #[test]
    fn refusals_a_caller_acts_on_are_typed() {
        let ext = Kind::ExtensionError;
        assert!(matches!(
            map(ext, Some("NOAUTH"), Some("Authentication required.")),
            Error::Unauthenticated(_)
        ));
        assert!(matches!(
            map(Kind::AuthenticationFailed, None, None),
            Error::Unauthenticated(_)
        ));
        assert!(matches!(
            map(ext, Some("NOPERM"), Some("this user has no permissions")),
            Error::PermissionDenied(_)
        ));
        assert!(matches!(
            map(
                ext,
                Some("OOM"),
                Some("command not allowed when used memory > 'maxmemory'")
            ),
            Error::ResourceExhausted {
                backend: "redis",
                ..
            }
        ));
        assert!(matches!(
            map(
                Kind::ResponseError,
                Some("ERR"),
                Some("max number of clients reached")
            ),
            Error::ResourceExhausted { .. }
        ));
        assert!(matches!(
            map(Kind::Moved, Some("MOVED"), Some("3999 127.0.0.1:6381")),
            Error::Unsupported {
                backend: "redis",
                ..
            }
        ));
        for (kind, code) in [
            (Kind::ReadOnly, Some("READONLY")),
            (Kind::BusyLoadingError, Some("LOADING")),
            (ext, Some("BUSY")),
            (Kind::IoError, None),
        ] {
            assert!(
                matches!(map(kind, code, None), Error::Unavailable(_)),
                "{kind:?} {code:?}"
            );
        }
        assert!(matches!(
            map(
                ext,
                Some("WRONGTYPE"),
                Some("Operation against a key holding the wrong kind of value")
            ),
            Error::Other(_)
        ));
    }
}
