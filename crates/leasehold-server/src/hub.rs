//! Carries what the state machine did to whoever is waiting for it: queued
//! acquirers, watch streams and the expiry driver.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};

use leasehold_core::{Event, Grant, LeaseId, RequestId, WaitEnd};
use tokio::sync::{broadcast, oneshot, Notify};

/// How a queued wait ended.
#[derive(Debug, Clone)]
pub enum WaitResult {
    /// The key was granted to the waiting lease.
    Granted(Grant),
    /// The wait left the queue without a grant.
    Ended(WaitEnd),
}

type WaitKey = (LeaseId, String);

/// How many of the last lock events a node keeps, for a dashboard that
/// opens after they happened.
pub const RECENT_EVENTS: usize = 200;

/// An event and when this node applied it, in Unix milliseconds on its
/// own wall clock (for people reading it; nothing decides by it).
#[derive(Debug, Clone)]
pub struct Stamped {
    /// Unix milliseconds.
    pub at_unix_ms: u64,
    /// The event.
    pub event: Event,
}

/// By lease, key and request id: the latest attempt's number, and how many
/// attempts are running.
type Attempts = HashMap<(LeaseId, String, RequestId), (u64, usize)>;

/// Shared between the state machine (which publishes) and the API (which waits).
pub struct Hub {
    waiters: Mutex<HashMap<WaitKey, Vec<oneshot::Sender<WaitResult>>>>,
    watch: broadcast::Sender<Stamped>,
    /// The last [`RECENT_EVENTS`] lock events, oldest first.
    recent: Mutex<VecDeque<Stamped>>,
    /// Signalled after every applied batch, so the expiry driver can look at
    /// the next deadline again.
    pub applied: Notify,
    /// Waits being listened for on this node, by lease, key and request id:
    /// the latest attempt's number and how many attempts are still running.
    attempts: Mutex<Attempts>,
}

impl Default for Hub {
    fn default() -> Self {
        Hub {
            waiters: Mutex::new(HashMap::new()),
            watch: broadcast::channel(4096).0,
            recent: Mutex::new(VecDeque::with_capacity(RECENT_EVENTS)),
            applied: Notify::new(),
            attempts: Mutex::new(HashMap::new()),
        }
    }
}

impl Hub {
    fn waiters(
        &self,
    ) -> parking_lot::MutexGuard<'_, HashMap<WaitKey, Vec<oneshot::Sender<WaitResult>>>> {
        self.waiters.lock()
    }

    /// Registers interest in how `lease`'s wait for `key` ends. Register before
    /// proposing the acquire, so a grant in the same step is not missed.
    pub fn wait_for(&self, lease: LeaseId, key: &str) -> oneshot::Receiver<WaitResult> {
        let (tx, rx) = oneshot::channel();
        self.waiters()
            .entry((lease, key.to_string()))
            .or_default()
            .push(tx);
        rx
    }

    /// A call begins listening for a wait (a first attempt, or a retry that
    /// re-attaches to it); its attempt number.
    pub fn attempt_begin(&self, lease: LeaseId, key: &str, request_id: RequestId) -> u64 {
        let mut attempts = self.attempts.lock();
        let entry = attempts
            .entry((lease, key.to_string(), request_id))
            .or_insert((0, 0));
        entry.0 += 1;
        entry.1 += 1;
        entry.0
    }

    /// Attempt `attempt` ended; whether it was the latest (no retry of the
    /// same wait began on this node after it).
    pub fn attempt_end(
        &self,
        lease: LeaseId,
        key: &str,
        request_id: RequestId,
        attempt: u64,
    ) -> bool {
        let mut attempts = self.attempts.lock();
        let k = (lease, key.to_string(), request_id);
        let Some(entry) = attempts.get_mut(&k) else {
            return true;
        };
        let latest = entry.0 == attempt;
        entry.1 = entry.1.saturating_sub(1);
        if entry.1 == 0 {
            attempts.remove(&k);
        }
        latest
    }

    /// Drops registrations whose receivers are gone.
    pub fn forget(&self, lease: LeaseId, key: &str) {
        let mut waiters = self.waiters();
        let k = (lease, key.to_string());
        if let Some(list) = waiters.get_mut(&k) {
            list.retain(|tx| !tx.is_closed());
            if list.is_empty() {
                waiters.remove(&k);
            }
        }
    }

    /// A stream of every event from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Stamped> {
        self.watch.subscribe()
    }

    /// The last [`RECENT_EVENTS`] lock events this node applied, oldest first.
    pub fn recent(&self) -> Vec<Stamped> {
        let recent = self.recent.lock();
        recent.iter().cloned().collect()
    }

    /// Keeps the last lock events of a batch (a lease that ends with a
    /// million keys costs [`RECENT_EVENTS`] clones, not a million).
    fn remember(&self, at_unix_ms: u64, events: &[Event]) {
        let lock_event = |e: &&Event| {
            matches!(
                e,
                Event::Acquired { .. }
                    | Event::Released { .. }
                    | Event::Expired { .. }
                    | Event::CheckpointSaved { .. }
            )
        };
        let last: Vec<&Event> = events
            .iter()
            .rev()
            .filter(lock_event)
            .take(RECENT_EVENTS)
            .collect();
        if last.is_empty() {
            return;
        }
        let mut recent = self.recent.lock();
        for event in last.into_iter().rev() {
            if recent.len() == RECENT_EVENTS {
                recent.pop_front();
            }
            recent.push_back(Stamped {
                at_unix_ms,
                event: event.clone(),
            });
        }
    }

    /// Called by the state machine with the events of one applied entry.
    pub fn publish(&self, events: &[Event]) {
        if events.is_empty() {
            return;
        }
        {
            let mut waiters = self.waiters();
            if !waiters.is_empty() {
                for event in events {
                    let (lease, key, result) = match event {
                        Event::Acquired {
                            key,
                            lease,
                            fence,
                            checkpoint,
                            ..
                        } => (
                            *lease,
                            key,
                            WaitResult::Granted(Grant {
                                lease: *lease,
                                fence: *fence,
                                checkpoint: checkpoint.clone(),
                            }),
                        ),
                        Event::WaitEnded { key, lease, reason } => {
                            (*lease, key, WaitResult::Ended(*reason))
                        }
                        _ => continue,
                    };
                    if let Some(list) = waiters.remove(&(lease, key.to_string())) {
                        for tx in list {
                            let _ = tx.send(result.clone());
                        }
                    }
                }
            }
        }
        let at_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.remember(at_unix_ms, events);
        if self.watch.receiver_count() > 0 {
            for event in events {
                let _ = self.watch.send(Stamped {
                    at_unix_ms,
                    event: event.clone(),
                });
            }
        }
    }
}
