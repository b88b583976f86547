//! Lock events as they happen (a watch), and the node's recent ones, each
//! filtered to the keys the caller may read.

use leasehold_core::auth::{AuthState, Permission, Role};
use leasehold_core::{Event, Fence, LeaseId, LockError};
use tokio::sync::broadcast;

use super::reads::validate_prefix;
use super::{ApiError, LockService};
use crate::hub::Stamped;
use crate::raft::ConsensusError;

impl LockService {
    /// Lock events from now on, for keys under `prefix` that the caller
    /// may read. With auth on, the watch ends (`unauthenticated`) when its
    /// token is revoked, and follows changes to its role.
    pub async fn watch(&self, prefix: String) -> Result<Watch, ApiError> {
        validate_prefix(&prefix)?;
        // Subscribe first: an auth change from here on is seen as an event.
        let rx = self.consensus.hub().subscribe();
        let access = self.consensus.read_local(|t| self.access(t.auth())).await?;
        Ok(Watch {
            rx,
            prefix,
            access,
            service: self.clone(),
        })
    }

    /// The last lock events this node applied (at most
    /// [`RECENT_EVENTS`](crate::hub::RECENT_EVENTS)), oldest first, for keys
    /// under `prefix` that the caller may read: what happened just before
    /// a watch began.
    pub async fn recent_events(&self, prefix: &str) -> Result<Vec<WatchEvent>, ApiError> {
        validate_prefix(prefix)?;
        let access = self.consensus.read_local(|t| self.access(t.auth())).await?;
        Ok(self
            .consensus
            .hub()
            .recent()
            .into_iter()
            .filter_map(|e| watch_event(e, prefix, &access))
            .collect())
    }

    /// What the caller may read, to filter a watch.
    fn access(&self, auth: &AuthState) -> Result<Access, LockError> {
        let Some(token) = self.caller(auth)? else {
            return Ok(Access::All);
        };
        if auth.highest(Some(token))? < Permission::Read {
            return Err(LockError::PermissionDenied {
                key: String::new(),
                needed: Permission::Read,
            });
        }
        let role = auth.token_role(token).cloned().unwrap_or_default();
        Ok(Access::Role(role))
    }
}

/// What a watcher may see.
enum Access {
    /// Everything: auth is off.
    All,
    /// What this role may read.
    Role(Role),
}

/// A subscription to lock events under a prefix.
pub struct Watch {
    rx: broadcast::Receiver<Stamped>,
    prefix: String,
    access: Access,
    service: LockService,
}

/// What a watcher sees.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WatchEvent {
    /// `acquired`, `released`, `expired`, or `checkpoint` (a holder saved
    /// one: an election's leader proclaiming its value, for one).
    pub kind: &'static str,
    /// The key.
    pub key: String,
    /// The token of the hold that began, ended or saved.
    pub fence: Fence,
    /// The lease of that hold.
    pub lease: LeaseId,
    /// Its holder's name.
    pub holder: String,
    /// When the node answering applied it, in Unix milliseconds on its
    /// wall clock.
    pub at_unix_ms: u64,
    /// With `checkpoint`: the bytes saved.
    #[serde(skip)]
    pub data: Option<Vec<u8>>,
    /// With `checkpoint`: the bytes saved, in base64 (HTTP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_base64: Option<String>,
}

impl Watch {
    /// The next event, or an error if this watcher fell too far behind (its
    /// events were dropped) or the server is stopping.
    pub async fn next(&mut self) -> Result<WatchEvent, ApiError> {
        loop {
            let stamped = match self.rx.recv().await {
                Ok(e) => e,
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    return Err(ApiError::WatchBehind(format!(
                        "watch fell behind by {n} events, which were dropped: list the locks again, then watch again"
                    )))
                }
                Err(broadcast::error::RecvError::Closed) => {
                    return Err(ConsensusError::Stopped("server stopping".into()).into())
                }
            };
            if let Event::AuthChanged { .. } = stamped.event {
                // The token may be gone, or its role changed.
                let service = &self.service;
                self.access = service
                    .consensus
                    .read_local(|t| service.access(t.auth()))
                    .await?;
                continue;
            }
            if let Some(event) = watch_event(stamped, &self.prefix, &self.access) {
                return Ok(event);
            }
        }
    }
}

/// What a watcher with `access` to keys under `prefix` sees of an event:
/// nothing unless it is a lock event on such a key.
fn watch_event(stamped: Stamped, prefix: &str, access: &Access) -> Option<WatchEvent> {
    let mut data = None;
    let (kind, key, fence, lease, holder) = match stamped.event {
        Event::CheckpointSaved {
            key,
            fence,
            lease,
            holder,
            data: saved,
        } => {
            data = Some(saved.to_vec());
            ("checkpoint", key, fence, lease, holder)
        }
        Event::Acquired {
            key,
            fence,
            lease,
            holder,
            ..
        } => ("acquired", key, fence, lease, holder),
        Event::Released {
            key,
            fence,
            lease,
            holder,
        } => ("released", key, fence, lease, holder),
        Event::Expired {
            key,
            fence,
            lease,
            holder,
        } => ("expired", key, fence, lease, holder),
        _ => return None,
    };
    let visible = match access {
        Access::All => true,
        Access::Role(role) => role.permission(&key) >= Permission::Read,
    };
    if !visible || !key.starts_with(prefix) {
        return None;
    }
    use base64::Engine;
    let data_base64 = data
        .as_ref()
        .map(|d| base64::engine::general_purpose::STANDARD.encode(d));
    Some(WatchEvent {
        kind,
        key: key.to_string(),
        fence,
        lease,
        holder: holder.to_string(),
        at_unix_ms: stamped.at_unix_ms,
        data,
        data_base64,
    })
}
