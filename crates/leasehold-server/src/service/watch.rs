//! Lock events as they happen (a watch), and the node's recent ones, each
//! filtered to the keys the caller may read.

use std::collections::VecDeque;
use std::sync::Arc;

use leasehold_core::auth::{AuthState, Permission, Role};
use leasehold_core::{Fence, LeaseId, LockError};
use tokio::sync::broadcast;

use super::reads::validate_prefix;
use super::{ApiError, LockService};
use crate::hub::history::{Behind, LockEvent, Position};
use crate::hub::{Hub, Published};
use crate::raft::ConsensusError;

impl LockService {
    /// Lock events for keys under `prefix` that the caller may read: from
    /// now on, or every one after the position `after` (a watch that broke,
    /// started again here or on another node). `watch_behind` if this node
    /// no longer has every event after `after`: list again, then watch from
    /// now. With auth on, the watch ends (`unauthenticated`) when its token
    /// is revoked, and follows changes to its role.
    pub async fn watch(&self, prefix: String, after: Option<Position>) -> Result<Watch, ApiError> {
        validate_prefix(&prefix)?;
        // Subscribe first: an auth change from here on is seen as an event.
        let hub = self.consensus.hub().clone();
        let subscription = hub.subscribe(after).map_err(behind)?;
        let access = self.consensus.read_local(|t| self.access(t.auth())).await?;
        Ok(Watch {
            rx: subscription.rx,
            pending: subscription.since.into(),
            last: after.unwrap_or(subscription.now),
            hub,
            prefix,
            access,
            service: self.clone(),
        })
    }

    /// The last lock events this node applied (at most
    /// [`RECENT_EVENTS`](crate::hub::RECENT_EVENTS)), oldest first, for keys
    /// under `prefix` that the caller may read: what happened just before
    /// a watch began (which can start after the last of them).
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
    rx: broadcast::Receiver<Published>,
    /// Events applied before the subscription, still to be sent.
    pending: VecDeque<LockEvent>,
    /// The position of the last event sent or passed over: nothing at or
    /// before it is sent again.
    last: Position,
    hub: Arc<Hub>,
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
    /// The log index of the entry that made it: the same on every node.
    pub index: u64,
    /// Its ordinal among that entry's lock events. A watch resumes after
    /// (`index`, `seq`).
    pub seq: u32,
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

impl WatchEvent {
    /// Where it stands: a watch started after it sends what came next.
    pub fn position(&self) -> Position {
        Position {
            index: self.index,
            seq: self.seq,
        }
    }
}

/// Where a watch resumes, from the `after_index` and `after_seq` a caller
/// sent (gRPC fields or HTTP query parameters): after that event, after
/// every event of the entry at `after_index` when no `after_seq` came, or
/// from now when neither did.
pub fn resume_point(
    after_index: Option<u64>,
    after_seq: Option<u32>,
) -> Result<Option<Position>, ApiError> {
    match (after_index, after_seq) {
        (Some(index), Some(seq)) => Ok(Some(Position { index, seq })),
        (Some(index), None) => Ok(Some(Position::end_of(index))),
        (None, Some(_)) => Err(ApiError::invalid(
            "after_seq",
            "needs after_index: pass both from the last event received",
        )),
        (None, None) => Ok(None),
    }
}

/// The refusal of a watch whose events this node no longer has.
fn behind(b: Behind) -> ApiError {
    ApiError::WatchBehind(format!(
        "this node has every event only after {}: list the locks again, then watch from now",
        b.complete_after
    ))
}

impl Watch {
    /// The next event, or an error if this watcher fell too far behind (its
    /// events were dropped) or the server is stopping.
    pub async fn next(&mut self) -> Result<WatchEvent, ApiError> {
        loop {
            let event = match self.pending.pop_front() {
                Some(event) => event,
                None => match self.rx.recv().await {
                    Ok(Published::Lock(event)) => event,
                    Ok(Published::AuthChanged) => {
                        // The token may be gone, or its role changed.
                        let service = &self.service;
                        self.access = service
                            .consensus
                            .read_local(|t| service.access(t.auth()))
                            .await?;
                        continue;
                    }
                    Ok(Published::Skipped { through }) => {
                        if self.last < Position::end_of(through) {
                            return Err(behind(Behind {
                                complete_after: Position::end_of(through),
                            }));
                        }
                        continue;
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        // What the channel dropped, the history may still have.
                        self.pending = self.hub.since(self.last).map_err(behind)?.into();
                        continue;
                    }
                    Err(broadcast::error::RecvError::Closed) => {
                        return Err(ConsensusError::Stopped("server stopping".into()).into())
                    }
                },
            };
            if event.at <= self.last {
                continue;
            }
            self.last = event.at;
            if let Some(event) = watch_event(event, &self.prefix, &self.access) {
                return Ok(event);
            }
        }
    }
}

/// What a watcher with `access` to keys under `prefix` sees of an event:
/// nothing unless it is on such a key.
fn watch_event(event: LockEvent, prefix: &str, access: &Access) -> Option<WatchEvent> {
    let visible = match access {
        Access::All => true,
        Access::Role(role) => role.permission(&event.key) >= Permission::Read,
    };
    if !visible || !event.key.starts_with(prefix) {
        return None;
    }
    use base64::Engine;
    let data = event.data.map(|d| d.to_vec());
    let data_base64 = data
        .as_ref()
        .map(|d| base64::engine::general_purpose::STANDARD.encode(d));
    Some(WatchEvent {
        kind: event.kind.name(),
        key: event.key.to_string(),
        fence: event.fence,
        lease: event.lease,
        holder: event.holder.to_string(),
        index: event.at.index,
        seq: event.at.seq,
        at_unix_ms: event.at_unix_ms,
        data,
        data_base64,
    })
}
