//! Carries what the state machine did to whoever is waiting for it: queued
//! acquirers, watch streams and the expiry driver.

pub mod history;

use parking_lot::Mutex;
use std::collections::HashMap;

use leasehold_core::{Event, Grant, LeaseId, RequestId, WaitEnd};
use tokio::sync::{broadcast, oneshot, Notify};

use history::{Behind, History, LockEvent, Position};

/// How a queued wait ended.
#[derive(Debug, Clone)]
pub enum WaitResult {
    /// The key was granted to the waiting lease.
    Granted(Grant),
    /// The wait left the queue without a grant.
    Ended(WaitEnd),
}

type WaitKey = (LeaseId, String);

/// How many of the last lock events a dashboard that opens after they
/// happened is shown.
pub const RECENT_EVENTS: usize = 200;

/// What watch streams are sent, in the order it was applied.
#[derive(Debug, Clone)]
pub enum Published {
    /// A lock event.
    Lock(LockEvent),
    /// Auth changed: what a watcher may read may have too.
    AuthChanged,
    /// A snapshot replaced the table through this log index: the lock
    /// events up to it were never applied here one by one.
    Skipped {
        /// The snapshot's last index.
        through: u64,
    },
}

/// A subscription to what is published, from a known position on.
pub struct Subscription {
    /// Everything published after `since` took its events.
    pub rx: broadcast::Receiver<Published>,
    /// The lock events after the position asked for that were applied
    /// before the subscription began, oldest first; those in `rx` may
    /// repeat some of them.
    pub since: Vec<LockEvent>,
    /// After every event applied when it began.
    pub now: Position,
}

/// By lease, key and request id: the latest attempt's number, and how many
/// attempts are running.
type Attempts = HashMap<(LeaseId, String, RequestId), (u64, usize)>;

/// Shared between the state machine (which publishes) and the API (which waits).
pub struct Hub {
    waiters: Mutex<HashMap<WaitKey, Vec<oneshot::Sender<WaitResult>>>>,
    watch: broadcast::Sender<Published>,
    /// The recent lock events, to resume watches from. Sending to `watch`
    /// happens under this lock too, so a subscription taken under it sees
    /// each event once: in the history or in its channel.
    history: Mutex<History>,
    /// Signalled after every applied batch, so the expiry driver can look at
    /// the next deadline again.
    pub applied: Notify,
    /// Waits being listened for on this node, by lease, key and request id:
    /// the latest attempt's number and how many attempts are still running.
    attempts: Mutex<Attempts>,
}

impl Default for Hub {
    fn default() -> Self {
        Hub::after(0)
    }
}

impl Hub {
    /// The hub of a node whose table stands after the log entry `applied`.
    pub fn after(applied: u64) -> Hub {
        Hub {
            waiters: Mutex::new(HashMap::new()),
            watch: broadcast::channel(4096).0,
            history: Mutex::new(History::after(applied)),
            applied: Notify::new(),
            attempts: Mutex::new(HashMap::new()),
        }
    }

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

    /// What is published from now on, with the lock events after `after`
    /// that were applied already; [`Behind`] if this node no longer has
    /// them all (or never had: it started from a later snapshot).
    pub fn subscribe(&self, after: Option<Position>) -> Result<Subscription, Behind> {
        let history = self.history.lock();
        let since = match after {
            Some(after) => history.since(after)?,
            None => Vec::new(),
        };
        Ok(Subscription {
            rx: self.watch.subscribe(),
            since,
            now: history.now(),
        })
    }

    /// The lock events after `after` this node still has, oldest first
    /// (for a watcher that fell behind its channel).
    pub fn since(&self, after: Position) -> Result<Vec<LockEvent>, Behind> {
        self.history.lock().since(after)
    }

    /// The last [`RECENT_EVENTS`] lock events this node applied, oldest first.
    pub fn recent(&self) -> Vec<LockEvent> {
        self.history.lock().last(RECENT_EVENTS)
    }

    /// A snapshot replaced the table through log index `through`.
    pub fn restart_after(&self, through: u64) {
        let mut history = self.history.lock();
        history.restart_after(through);
        let _ = self.watch.send(Published::Skipped { through });
    }

    /// Called by the state machine with the events of the entries it
    /// applied; `entries` holds each entry's log index and where its
    /// events end in `events`.
    pub fn publish(&self, events: &[Event], entries: &[(u64, usize)]) {
        if !events.is_empty() {
            self.hand_to_waiters(events);
        }
        let at_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let mut history = self.history.lock();
        if let Some(&(last, _)) = entries.last() {
            history.applied_through(last);
        }
        let watched = self.watch.receiver_count() > 0;
        // A lease that ends with a million keys keeps only the tail that
        // fits, and sends the rest only if someone watches.
        let lock_events = events
            .iter()
            .filter(|e| LockEvent::is_lock_event(e))
            .count();
        let mut keep_from = lock_events.saturating_sub(history::MAX_EVENTS);
        let mut from = 0;
        for &(index, end) in entries {
            let mut seq = 0u32;
            for event in &events[from..end] {
                if let Event::AuthChanged { .. } = event {
                    if watched {
                        let _ = self.watch.send(Published::AuthChanged);
                    }
                    continue;
                }
                if !LockEvent::is_lock_event(event) {
                    continue;
                }
                let at = Position { index, seq };
                seq = seq.saturating_add(1);
                if keep_from > 0 && !watched {
                    keep_from -= 1;
                    history.skip_through(at);
                    continue;
                }
                let Some(lock) = LockEvent::of(event, at, at_unix_ms) else {
                    continue;
                };
                if keep_from > 0 {
                    keep_from -= 1;
                    history.skip_through(at);
                } else {
                    history.push(lock.clone());
                }
                if watched {
                    let _ = self.watch.send(Published::Lock(lock));
                }
            }
            from = end;
        }
    }

    /// Hands grants and ended waits to the calls waiting for them.
    fn hand_to_waiters(&self, events: &[Event]) {
        let mut waiters = self.waiters();
        if waiters.is_empty() {
            return;
        }
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
