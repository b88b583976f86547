//! leaseholdd over gRPC — `Correctness`.
//!
//! One session lease per TTL per client, renewed by one keepalive however many
//! locks hang off it. Acquire and release carry a request id, so a retry after
//! a lost reply never acts twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use leasehold_proto::v1 as pb;
use pb::leasehold_client::LeaseholdClient;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::{Acquired, Backend, Guarantee, Hold, LockEvent, LockOptions, LockStatus};
use crate::keeper::{Keeper, Liveness, RenewError};
use crate::{Error, Fence, Result};

/// Attempts for an idempotent request when the server cannot be reached.
const ATTEMPTS: usize = 3;

/// The leaseholdd backend.
pub struct Leaseholdd {
    rpc: LeaseholdClient<Channel>,
    /// Session leases by TTL in milliseconds.
    sessions: Mutex<HashMap<u64, Arc<Session>>>,
}

struct Session {
    lease: u64,
    keeper: Mutex<Option<Keeper>>,
    liveness: Liveness,
}

fn metadata(status: &Status, name: &str) -> Option<String> {
    status
        .metadata()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

fn is_transient(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled
    ) && metadata(status, "leasehold-code").is_none()
        || metadata(status, "leasehold-code").as_deref() == Some("unavailable")
}

/// Maps a server error for an operation on `key`.
fn error(key: &str, status: Status) -> Error {
    let fence = |name| metadata(&status, name).and_then(|v| v.parse().ok());
    match metadata(&status, "leasehold-code").as_deref() {
        Some("held") => Error::Held {
            key: key.to_string(),
            holder: metadata(&status, "leasehold-holder").unwrap_or_default(),
            fence: fence("leasehold-fence"),
        },
        Some("lock_delayed") => Error::Held {
            key: key.to_string(),
            holder: format!(
                "nobody (lock-delay after an expiry, {} ms left)",
                metadata(&status, "leasehold-delay-left-ms").unwrap_or_default()
            ),
            fence: None,
        },
        Some("stale_fence") => Error::StaleFence {
            presented: fence("leasehold-presented-fence").unwrap_or(0),
            current: fence("leasehold-current-fence"),
        },
        Some("wait_timeout") => Error::Timeout {
            key: key.to_string(),
        },
        Some("lease_expired") | Some("lease_not_found") => Error::LeaseLost {
            key: key.to_string(),
            reason: status.message().to_string(),
        },
        Some("invalid_argument") => Error::InvalidArgument(status.message().to_string()),
        Some("not_leader") | Some("unavailable") => {
            Error::Unavailable(status.message().to_string())
        }
        _ if is_transient(&status) => Error::Unavailable(status.message().to_string()),
        _ => Error::Other(status.message().to_string()),
    }
}

impl Leaseholdd {
    /// Connects to `http://host:port`.
    pub async fn connect(url: &str) -> Result<Leaseholdd> {
        let url = url.replacen("leasehold://", "http://", 1);
        let endpoint = Channel::from_shared(url.clone())
            .map_err(|e| Error::InvalidArgument(format!("endpoint {url:?}: {e}")))?
            .connect_timeout(Duration::from_secs(3))
            .tcp_nodelay(true);
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| Error::Unavailable(format!("connect to leaseholdd at {url}: {e}")))?;
        Ok(Leaseholdd {
            rpc: LeaseholdClient::new(channel),
            sessions: Mutex::new(HashMap::new()),
        })
    }

    /// The live session for this TTL, made if needed.
    async fn session(&self, ttl: Duration, holder: &str) -> Result<Arc<Session>> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        if let Some(s) = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&ttl_ms)
        {
            if s.liveness.is_live() {
                return Ok(s.clone());
            }
        }
        let sent_at = Instant::now();
        let lease = self
            .rpc
            .clone()
            .grant(pb::GrantRequest {
                ttl_ms,
                holder: holder.to_string(),
            })
            .await
            .map_err(|s| error("", s))?
            .into_inner()
            .lease_id;
        let rpc = self.rpc.clone();
        let keeper = Keeper::spawn(ttl, sent_at, move || {
            let mut rpc = rpc.clone();
            async move {
                match rpc
                    .keep_alive(pb::KeepAliveRequest { lease_id: lease })
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(s) if is_transient(&s) => {
                        Err(RenewError::Transient(s.message().to_string()))
                    }
                    Err(s) => Err(RenewError::Lost(s.message().to_string())),
                }
            }
        });
        let session = Arc::new(Session {
            lease,
            liveness: keeper.liveness().clone(),
            keeper: Mutex::new(Some(keeper)),
        });
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ttl_ms, session.clone());
        Ok(session)
    }
}

#[async_trait::async_trait]
impl Backend for Leaseholdd {
    fn name(&self) -> &'static str {
        "leaseholdd"
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
        let request_id = rand::random::<u64>() | 1;
        let wait_ms = wait.map_or(0, |w| {
            u64::try_from(w.as_millis()).unwrap_or(u64::MAX).max(1)
        });
        let mut renewed_session = false;
        let mut attempt = 0;
        loop {
            let session = self.session(opts.ttl, holder).await?;
            let request = pb::AcquireRequest {
                lease_id: session.lease,
                key: key.to_string(),
                wait_ms,
                lock_delay_ms: u64::try_from(opts.lock_delay.as_millis()).unwrap_or(u64::MAX),
                request_id,
            };
            match self.rpc.clone().acquire(request).await {
                Ok(r) => {
                    let r = r.into_inner();
                    return Ok(Acquired {
                        fence: Some(r.fence),
                        checkpoint: r.checkpoint,
                        liveness: session.liveness.child(),
                        hold: Box::new(LeaseholddHold {
                            rpc: self.rpc.clone(),
                            key: key.to_string(),
                            fence: r.fence,
                        }),
                    });
                }
                Err(s) => match error(key, s) {
                    // The session expired under us (e.g. the server was down
                    // longer than its TTL): start a new one, once.
                    Error::LeaseLost { .. } if !renewed_session => {
                        session
                            .liveness
                            .lose("the server no longer knows this session");
                        renewed_session = true;
                    }
                    Error::Unavailable(_) if attempt + 1 < ATTEMPTS => {
                        attempt += 1;
                        tokio::time::sleep(Duration::from_millis(50 * attempt as u64)).await;
                    }
                    e => return Err(e),
                },
            }
        }
    }

    async fn status(&self, prefix: &str) -> Result<Vec<LockStatus>> {
        let locks = self
            .rpc
            .clone()
            .list_locks(pb::ListLocksRequest {
                prefix: prefix.to_string(),
                limit: 0,
            })
            .await
            .map_err(|s| error(prefix, s))?
            .into_inner()
            .locks;
        Ok(locks
            .into_iter()
            .map(|l| LockStatus {
                key: l.key,
                holder: l
                    .holder
                    .as_ref()
                    .map(|h| h.holder.clone())
                    .unwrap_or_default(),
                fence: l.holder.as_ref().map(|h| h.fence),
                ttl_left_ms: l.holder.as_ref().map_or(0, |h| h.ttl_left_ms),
                waiters: l.waiters.len(),
            })
            .collect())
    }

    async fn watch(&self, prefix: &str) -> Result<BoxStream<'static, Result<LockEvent>>> {
        let stream = self
            .rpc
            .clone()
            .watch(pb::WatchRequest {
                prefix: prefix.to_string(),
            })
            .await
            .map_err(|s| error(prefix, s))?
            .into_inner();
        Ok(stream
            .map(|item| {
                item.map(|e| LockEvent {
                    kind: match pb::lock_event::Kind::try_from(e.kind) {
                        Ok(pb::lock_event::Kind::Acquired) => "acquired",
                        Ok(pb::lock_event::Kind::Released) => "released",
                        Ok(pb::lock_event::Kind::Expired) => "expired",
                        _ => "unknown",
                    }
                    .to_string(),
                    key: e.key,
                    fence: e.fence,
                    holder: e.holder,
                })
                .map_err(|s| error("", s))
            })
            .boxed())
    }

    async fn release_by_fence(&self, key: &str, fence: Fence) -> Result<()> {
        release(&self.rpc, key, fence).await
    }

    async fn close(&self) {
        let sessions: Vec<Arc<Session>> = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .map(|(_, s)| s)
            .collect();
        for s in sessions {
            let keeper = s.keeper.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(k) = keeper {
                k.stop().await;
            }
            let _ = self
                .rpc
                .clone()
                .revoke(pb::RevokeRequest { lease_id: s.lease })
                .await;
        }
    }
}

async fn release(rpc: &LeaseholdClient<Channel>, key: &str, fence: Fence) -> Result<()> {
    let request_id = rand::random::<u64>() | 1;
    let mut attempt = 0;
    loop {
        let request = pb::ReleaseRequest {
            key: key.to_string(),
            fence,
            request_id,
        };
        match rpc.clone().release(request).await {
            Ok(_) => return Ok(()),
            Err(s) => match error(key, s) {
                Error::Unavailable(_) if attempt + 1 < ATTEMPTS => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(50 * attempt as u64)).await;
                }
                e => return Err(e),
            },
        }
    }
}

struct LeaseholddHold {
    rpc: LeaseholdClient<Channel>,
    key: String,
    fence: Fence,
}

#[async_trait::async_trait]
impl Hold for LeaseholddHold {
    async fn release(self: Box<Self>) -> Result<()> {
        // The session's renewal covers other locks too and goes on; the
        // release is ownership-checked by this hold's token.
        release(&self.rpc, &self.key, self.fence).await
    }

    async fn save_checkpoint(&self, data: &[u8]) -> Result<()> {
        self.rpc
            .clone()
            .save_checkpoint(pb::SaveCheckpointRequest {
                key: self.key.clone(),
                fence: self.fence,
                data: data.to_vec(),
            })
            .await
            .map(drop)
            .map_err(|s| error(&self.key, s))
    }
}
