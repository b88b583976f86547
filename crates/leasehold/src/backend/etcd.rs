//! etcd — `Correctness`.
//!
//! The recipe of etcd's own `concurrency` package: each contender writes a key
//! `leasehold/lock/KEY\0LEASE` under its own lease, in a transaction that only
//! creates it. The key with the lowest create revision holds the lock, and its
//! create revision is the fencing token (etcd revisions only grow). A waiter
//! watches only the key just before its own for deletion, so a release wakes
//! one waiter, not all (no herd). Release is a delete guarded by the create
//! revision, then a revoke of the lease.
//!
//! etcd leases have a granularity of whole seconds (and etcd may raise a short
//! TTL to its minimum): the client renews by the TTL etcd granted.
//! Lock-delay is not supported.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client as EtcdClient, Compare, CompareOp, ConnectOptions, EventType, GetOptions,
    LeaseKeepAliveStream, LeaseKeeper, PutOptions, SortOrder, SortTarget, Txn, TxnOp, WatchOptions,
};
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::{Acquired, Backend, Guarantee, Hold, LockOptions};
use crate::keeper::{Keeper, RenewError};
use crate::{Error, Fence, Result};

/// The etcd backend.
pub struct Etcd {
    client: EtcdClient,
}

/// An etcd error by what it asks of the caller: a refusal for want of
/// credentials, rights or room, or bad input, is typed; anything else (a
/// connection that failed, no leader, a stream that broke) is
/// [`Error::Unavailable`].
fn etcd_error(e: etcd_client::Error) -> Error {
    use tonic::Code;
    match &e {
        etcd_client::Error::GRpcStatus(status) => match status.code() {
            Code::Unauthenticated => Error::Unauthenticated(format!(
                "etcd: {}: give etcd's user and password",
                status.message()
            )),
            Code::PermissionDenied => Error::PermissionDenied(format!(
                "etcd: {}: the user's role must allow the leasehold/ keys",
                status.message()
            )),
            // E.g. `mvcc: database space exceeded`: an operator must compact,
            // defragment and disarm the alarm before etcd takes writes again.
            Code::ResourceExhausted => Error::ResourceExhausted {
                backend: "etcd",
                reason: status.message().to_string(),
            },
            Code::InvalidArgument => Error::InvalidArgument(format!("etcd: {}", status.message())),
            _ => Error::Unavailable(format!("etcd: {e}")),
        },
        etcd_client::Error::InvalidArgs(_)
        | etcd_client::Error::InvalidUri(_)
        | etcd_client::Error::InvalidHeaderValue(_) => Error::InvalidArgument(format!("etcd: {e}")),
        _ => Error::Unavailable(format!("etcd: {e}")),
    }
}

fn lock_prefix(key: &str) -> String {
    // Keys cannot contain control characters, so NUL cannot be part of one:
    // "a" and "a/b" never share a prefix.
    format!("leasehold/lock/{key}\0")
}

fn checkpoint_key(key: &str) -> String {
    format!("leasehold/checkpoint/{key}")
}

impl Etcd {
    /// Connects to `etcd://host:port[,host:port...]`.
    pub async fn connect(url: &str) -> Result<Etcd> {
        let endpoints: Vec<String> = url
            .trim_start_matches("etcd://")
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("http://{h}"))
            .collect();
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(3))
            .with_timeout(Duration::from_secs(5));
        let client = EtcdClient::connect(endpoints, Some(options))
            .await
            .map_err(etcd_error)?;
        Ok(Etcd { client })
    }

    /// The key that holds the lock now: the lowest create revision under the prefix.
    async fn owner(&self, prefix: &str) -> Result<Option<(i64, String)>> {
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let r = self
            .client
            .clone()
            .get(prefix, Some(options))
            .await
            .map_err(etcd_error)?;
        Ok(r.kvs().first().map(|kv| {
            (
                kv.create_revision(),
                String::from_utf8_lossy(kv.value()).into_owned(),
            )
        }))
    }

    /// Waits until the key just before `my_rev` under `prefix` is deleted.
    async fn wait_for_predecessor(
        &self,
        prefix: &str,
        my_rev: i64,
        give_up: Instant,
    ) -> Result<bool> {
        let options = GetOptions::new()
            .with_prefix()
            .with_max_create_revision(my_rev - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1);
        let r = self
            .client
            .clone()
            .get(prefix, Some(options))
            .await
            .map_err(etcd_error)?;
        let Some(before) = r.kvs().first() else {
            return Ok(true);
        };
        let since = r.header().map_or(0, |h| h.revision()) + 1;
        let (_watcher, mut stream) = self
            .client
            .clone()
            .watch(
                before.key().to_vec(),
                Some(WatchOptions::new().with_start_revision(since)),
            )
            .await
            .map_err(etcd_error)?;
        loop {
            let message = tokio::time::timeout_at(give_up, stream.message()).await;
            match message {
                Err(_) => return Ok(false),
                Ok(Err(e)) => return Err(etcd_error(e)),
                Ok(Ok(None)) => return Ok(true),
                Ok(Ok(Some(r))) => {
                    if r.events()
                        .iter()
                        .any(|e| e.event_type() == EventType::Delete)
                    {
                        return Ok(true);
                    }
                }
            }
        }
    }

    async fn give_up_key(&self, keeper: Keeper, my_key: &str, lease: i64) {
        keeper.stop().await;
        let mut c = self.client.clone();
        let _ = c.delete(my_key, None).await;
        let _ = c.lease_revoke(lease).await;
    }
}

#[async_trait::async_trait]
impl Backend for Etcd {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn guarantee(&self) -> Guarantee {
        Guarantee::Correctness
    }

    async fn acquire(
        &self,
        key: &str,
        holder: &str,
        opts: &LockOptions,
        wait: Option<Duration>,
    ) -> Result<Acquired> {
        let give_up = Instant::now() + wait.unwrap_or_default();
        let ttl_secs = (opts.ttl.as_millis() as i64 + 999) / 1000;
        let sent_at = Instant::now();
        let mut c = self.client.clone();
        let grant = c
            .lease_grant(ttl_secs.max(1), None)
            .await
            .map_err(etcd_error)?;
        let (lease, ttl) = (grant.id(), Duration::from_secs(grant.ttl().max(1) as u64));
        // Keep the lease alive from now on: a waiter that lost its lease would
        // lose its place in line.
        let stream: Arc<Mutex<Option<(LeaseKeeper, LeaseKeepAliveStream)>>> = Arc::default();
        let client = self.client.clone();
        let keeper = Keeper::spawn(ttl, sent_at, move || {
            let (stream, mut client) = (stream.clone(), client.clone());
            async move {
                let mut guard = stream.lock().await;
                if guard.is_none() {
                    *guard = Some(
                        client
                            .lease_keep_alive(lease)
                            .await
                            .map_err(|e| RenewError::Transient(e.to_string()))?,
                    );
                }
                let Some((keeper, responses)) = guard.as_mut() else {
                    return Err(RenewError::Transient("no keepalive stream".into()));
                };
                let answer = match keeper.keep_alive().await {
                    Ok(()) => responses.message().await,
                    Err(e) => Err(e),
                };
                match answer {
                    Ok(Some(r)) if r.ttl() > 0 => Ok(()),
                    Ok(Some(_)) => Err(RenewError::Lost("the etcd lease expired".into())),
                    Ok(None) | Err(_) => {
                        *guard = None;
                        Err(RenewError::Transient("etcd keepalive stream broke".into()))
                    }
                }
            }
        });
        let prefix = lock_prefix(key);
        let my_key = format!("{prefix}{lease:016x}");
        let txn = Txn::new()
            .when([Compare::create_revision(
                my_key.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then([TxnOp::put(
                my_key.clone(),
                holder,
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let r = c.txn(txn).await.map_err(etcd_error)?;
        let my_rev = r.header().map_or(0, |h| h.revision());

        loop {
            let owner = match self.owner(&prefix).await {
                Ok(o) => o,
                Err(e) => {
                    self.give_up_key(keeper, &my_key, lease).await;
                    return Err(e);
                }
            };
            match owner {
                Some((rev, _)) if rev == my_rev => break,
                Some((rev, holder)) if wait.is_none() => {
                    self.give_up_key(keeper, &my_key, lease).await;
                    return Err(Error::Held {
                        key: key.to_string(),
                        holder,
                        fence: Some(rev as Fence),
                    });
                }
                None => {
                    // Our key is gone: the lease expired while we waited.
                    self.give_up_key(keeper, &my_key, lease).await;
                    return Err(Error::LeaseLost {
                        key: key.to_string(),
                        reason: "the etcd lease expired while waiting".into(),
                    });
                }
                Some(_) => match self.wait_for_predecessor(&prefix, my_rev, give_up).await {
                    Ok(true) => continue,
                    Ok(false) => {
                        self.give_up_key(keeper, &my_key, lease).await;
                        return Err(Error::Timeout {
                            key: key.to_string(),
                        });
                    }
                    Err(e) => {
                        self.give_up_key(keeper, &my_key, lease).await;
                        return Err(e);
                    }
                },
            }
        }

        let checkpoint = c
            .get(checkpoint_key(key), None)
            .await
            .map_err(etcd_error)?
            .kvs()
            .first()
            .map(|kv| kv.value().to_vec());
        Ok(Acquired {
            fence: Some(my_rev as Fence),
            checkpoint,
            liveness: keeper.liveness().clone(),
            hold: Box::new(EtcdHold {
                client: self.client.clone(),
                key: key.to_string(),
                my_key,
                lease,
                fence: my_rev,
                keeper,
            }),
        })
    }

    async fn release_by_fence(&self, key: &str, fence: Fence) -> Result<()> {
        let prefix = lock_prefix(key);
        let rev = fence as i64;
        let options = GetOptions::new()
            .with_prefix()
            .with_min_create_revision(rev)
            .with_max_create_revision(rev);
        let r = self
            .client
            .clone()
            .get(prefix.clone(), Some(options))
            .await
            .map_err(etcd_error)?;
        let owner = self.owner(&prefix).await?;
        match r.kvs().first() {
            Some(kv) if owner.as_ref().is_some_and(|o| o.0 == rev) => {
                let key = kv.key().to_vec();
                delete_if_created_at(&self.client, key, rev).await?;
                Ok(())
            }
            _ => Err(Error::StaleFence {
                presented: fence,
                current: owner.map(|o| o.0 as Fence),
            }),
        }
    }
}

async fn delete_if_created_at(client: &EtcdClient, key: Vec<u8>, rev: i64) -> Result<bool> {
    let txn = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, rev)])
        .and_then([TxnOp::delete(key, None)]);
    Ok(client
        .clone()
        .txn(txn)
        .await
        .map_err(etcd_error)?
        .succeeded())
}

struct EtcdHold {
    client: EtcdClient,
    key: String,
    my_key: String,
    lease: i64,
    fence: i64,
    keeper: Keeper,
}

#[async_trait::async_trait]
impl Hold for EtcdHold {
    async fn release(self: Box<Self>) -> Result<()> {
        self.keeper.stop().await;
        let deleted =
            delete_if_created_at(&self.client, self.my_key.clone().into_bytes(), self.fence).await;
        let _ = self.client.clone().lease_revoke(self.lease).await;
        match deleted? {
            true => Ok(()),
            false => Err(Error::StaleFence {
                presented: self.fence as Fence,
                current: None,
            }),
        }
    }

    async fn save_checkpoint(&self, data: &[u8]) -> Result<()> {
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.my_key.clone(),
                CompareOp::Equal,
                self.fence,
            )])
            .and_then([TxnOp::put(checkpoint_key(&self.key), data, None)]);
        let r = self.client.clone().txn(txn).await.map_err(etcd_error)?;
        if r.succeeded() {
            Ok(())
        } else {
            Err(Error::StaleFence {
                presented: self.fence as Fence,
                current: None,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::{Code, Status};

    #[test]
    fn refusals_a_caller_acts_on_are_typed() {
        let status =
            |code, message: &str| etcd_client::Error::GRpcStatus(Status::new(code, message));
        assert!(matches!(
            etcd_error(status(
                Code::ResourceExhausted,
                "etcdserver: mvcc: database space exceeded"
            )),
            Error::ResourceExhausted {
                backend: "etcd",
                ..
            }
        ));
        assert!(matches!(
            etcd_error(status(
                Code::PermissionDenied,
                "etcdserver: permission denied"
            )),
            Error::PermissionDenied(_)
        ));
        assert!(matches!(
            etcd_error(status(
                Code::Unauthenticated,
                "etcdserver: invalid auth token"
            )),
            Error::Unauthenticated(_)
        ));
        assert!(matches!(
            etcd_error(status(Code::Unavailable, "etcdserver: no leader")),
            Error::Unavailable(_)
        ));
        assert!(matches!(
            etcd_error(etcd_client::Error::InvalidArgs("no endpoint".into())),
            Error::InvalidArgument(_)
        ));
    }
}
