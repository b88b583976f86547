//! Session leases: one per TTL, shared by the locks taken with it, or one
//! made for a single lock; renewed by a keeper until ended.

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold_proto::frame::Op;
use leasehold_proto::v1 as pb;
use tokio::time::Instant;

use super::retry::call_again;
use super::Leaseholdd;
use crate::backend::endpoints::{Endpoints, Rpc};
use crate::keeper::{Keeper, Liveness, RenewError};
use crate::{Error, Result};

pub(super) struct Session {
    pub(super) lease: u64,
    keeper: Mutex<Option<Keeper>>,
    pub(super) liveness: Liveness,
    /// Keys held, or being acquired, under this lease.
    keys: Mutex<HashSet<String>>,
    /// The holds granted under this lease, each said lost should the
    /// lease stop holding its keys while it lives.
    holds: Arc<Holds>,
    /// Made for one lock only: revoked when that lock is released.
    pub(super) private: bool,
}

/// The holds granted under a session lease, by their first key: a renewal
/// that finds the lease holding fewer keys than these learns that one was
/// released by its token elsewhere, and looks up which.
#[derive(Default)]
struct Holds {
    by_key: Mutex<HashMap<String, Granted>>,
    /// A look-up is under way: a second would learn nothing more.
    checking: AtomicBool,
}

struct Granted {
    /// Every key of the hold (one, or a lock set's).
    keys: Vec<String>,
    liveness: Liveness,
}

impl Holds {
    fn key_count(&self) -> u64 {
        self.by_key
            .lock()
            .values()
            .map(|g| g.keys.len() as u64)
            .sum()
    }

    /// After a renewal answered that the lease holds `key_count` keys:
    /// fewer than granted here, the lease is described (a linearizable
    /// read, after every grant counted here) and each hold missing a key is
    /// lost. Off the renewal's path: the keeper never waits on it.
    fn check(self: &Arc<Self>, endpoints: &Arc<Endpoints>, lease: u64, key_count: Option<u64>) {
        // An older server does not count: nothing to go by.
        let Some(key_count) = key_count else { return };
        if key_count >= self.key_count() || self.checking.swap(true, Ordering::AcqRel) {
            return;
        }
        let (holds, endpoints) = (self.clone(), endpoints.clone());
        tokio::spawn(async move {
            let request = pb::DescribeLeaseRequest { lease_id: lease };
            let call = |mut rpc: Rpc| async move { rpc.describe_lease(request).await };
            if let Ok(info) = endpoints.grpc(call).await {
                let held: HashSet<String> = info.keys.into_iter().collect();
                for (key, granted) in holds.by_key.lock().iter() {
                    if let Some(gone) = granted.keys.iter().find(|k| !held.contains(*k)) {
                        granted.liveness.lose(format!(
                            "{gone:?} was released by its token elsewhere while the lease \
                             lived (the hold of {key:?} is over)"
                        ));
                    }
                }
            }
            holds.checking.store(false, Ordering::Release);
        });
    }
}

/// A key claimed on a session; unclaimed when dropped.
pub(super) struct Claim {
    pub(super) session: Arc<Session>,
    key: String,
}

impl Claim {
    /// The acquire under this claim was granted `keys` (this claim's key
    /// first): the hold is said lost, through `liveness`, should the lease
    /// stop holding one of them.
    pub(super) fn granted(&self, keys: Vec<String>, liveness: Liveness) {
        let granted = Granted { keys, liveness };
        self.session
            .holds
            .by_key
            .lock()
            .insert(self.key.clone(), granted);
    }

    /// The hold is being released: a renewal that counts it gone is no
    /// news.
    pub(super) fn releasing(&self) {
        self.session.holds.by_key.lock().remove(&self.key);
    }

    /// `None` if the session already has the key.
    pub(super) fn take(session: &Arc<Session>, key: &str) -> Option<Claim> {
        let mut keys = session.keys.lock();
        keys.insert(key.to_string()).then(|| Claim {
            session: session.clone(),
            key: key.to_string(),
        })
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.releasing();
        self.session.keys.lock().remove(&self.key);
    }
}

impl Leaseholdd {
    fn live_session(&self, ttl_ms: u64) -> Option<Arc<Session>> {
        let sessions = self.sessions.lock();
        sessions
            .get(&ttl_ms)
            .filter(|s| s.liveness.is_live())
            .cloned()
    }

    /// The live session for this TTL, made if needed.
    async fn session(&self, ttl: Duration, holder: &str) -> Result<Arc<Session>> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        if let Some(s) = self.live_session(ttl_ms) {
            return Ok(s);
        }
        // One grant at a time: concurrent first calls share the session the
        // first of them makes instead of each granting a lease of its own.
        let _granting = self.granting.lock().await;
        if let Some(s) = self.live_session(ttl_ms) {
            return Ok(s);
        }
        let session = self.open_session(ttl, holder, false).await?;
        self.sessions.lock().insert(ttl_ms, session.clone());
        Ok(session)
    }

    pub(super) async fn claim(&self, key: &str, ttl: Duration, holder: &str) -> Result<Claim> {
        if let Some(claim) = Claim::take(&self.session(ttl, holder).await?, key) {
            return Ok(claim);
        }
        let private = self.open_session(ttl, holder, true).await?;
        Claim::take(&private, key)
            .ok_or_else(|| Error::Other("a new lease already holds the key".into()))
    }

    /// Grants a lease and starts renewing it.
    pub(super) async fn open_session(
        &self,
        ttl: Duration,
        holder: &str,
        private: bool,
    ) -> Result<Arc<Session>> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        // The deadline counts from the first send: a retry may be answered
        // with the lease that send made.
        let sent_at = Instant::now();
        // A retry with the same id gets the lease the first grant made, so a
        // reply lost on the way leaves no lease behind.
        let grant = pb::GrantRequest {
            ttl_ms,
            holder: holder.to_string(),
            request_id: rand::random::<u64>() | 1,
        };
        let lease = call_again::<pb::GrantResponse>(&self.endpoints, Op::Grant, &grant, "")
            .await?
            .lease_id;
        let (endpoints, renewals) = (self.endpoints.clone(), self.renewals.clone());
        let holds = Arc::new(Holds::default());
        let counted = holds.clone();
        // A node cut off from its majority may take the call and not answer
        // for a while: with other nodes to try, give up on it after a sixth
        // of the TTL (at least 200 ms), with time left before the deadline.
        // With one node there is nowhere else.
        let attempt = if endpoints.len() > 1 {
            (ttl / 6).max(Duration::from_millis(200))
        } else {
            Duration::MAX
        };
        let early = crate::keeper::early(ttl);
        let renew = move || {
            let (endpoints, renewals, holds) =
                (endpoints.clone(), renewals.clone(), counted.clone());
            async move {
                // Sent with the client's other renewals that fall due
                // meanwhile (`renewals`); answered on its own.
                let by = Instant::now() + early;
                match renewals.renew(lease, by, attempt).await {
                    Ok(renewed) => {
                        holds.check(&endpoints, lease, renewed.key_count);
                        Ok(())
                    }
                    Err(e) => match e.into_error("") {
                        Error::Unavailable(m) | Error::OutcomeUnknown(m) => {
                            Err(RenewError::Transient(m))
                        }
                        // The session's lease, not a key: its own reason.
                        Error::LeaseLost { reason, .. } => Err(RenewError::Lost(reason)),
                        e => Err(RenewError::Lost(e.to_string())),
                    },
                }
            }
        };
        #[cfg(feature = "planted-bugs")]
        let keeper = if crate::planted::planted(crate::planted::ClientBug::DeadlineFromReply) {
            Keeper::spawn_counting_from_reply(ttl, sent_at, renew)
        } else {
            Keeper::spawn_early(ttl, sent_at, early, renew)
        };
        #[cfg(not(feature = "planted-bugs"))]
        let keeper = Keeper::spawn_early(ttl, sent_at, early, renew);
        Ok(Arc::new(Session {
            lease,
            liveness: keeper.liveness().clone(),
            keeper: Mutex::new(Some(keeper)),
            keys: Mutex::new(HashSet::new()),
            holds,
            private,
        }))
    }

    /// Stops renewing a session and ends it on the server.
    pub(super) async fn end_session(endpoints: &Endpoints, session: &Session) {
        let keeper = session.keeper.lock().take();
        if let Some(k) = keeper {
            k.stop().await;
        }
        let revoke = pb::RevokeRequest {
            lease_id: session.lease,
        };
        let _ = endpoints
            .call::<pb::RevokeResponse>(Op::Revoke, &revoke)
            .await;
    }
}
