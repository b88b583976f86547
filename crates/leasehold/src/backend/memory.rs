//! In memory, for tests and for one process guarding its own work — `Correctness`
//! within that process (nothing outside it can see these locks).
//!
//! Expiry uses this process's monotonic clock; waiters are woken on release
//! and at the holder's deadline (not strictly FIFO). A lock-delay keeps an
//! expired holder's key closed for the delay past its deadline.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::{Acquired, Backend, Guarantee, Hold, LockOptions};
use crate::keeper::{Keeper, RenewError};
use crate::{Error, Fence, Result};

/// The in-memory backend. Clones share one table.
#[derive(Clone, Default)]
pub struct Memory {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    released: Notify,
}

#[derive(Default)]
struct State {
    next_fence: Fence,
    locks: HashMap<String, Held>,
    checkpoints: HashMap<String, Vec<u8>>,
}

struct Held {
    fence: Fence,
    holder: String,
    ttl: Duration,
    deadline: Instant,
    /// After the deadline passes, the key stays closed this long.
    lock_delay: Duration,
}

impl Held {
    /// When others may take the key, unless it is released first.
    fn closed_until(&self) -> Instant {
        self.deadline + self.lock_delay
    }
}

impl Shared {
    fn state(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }
}

impl State {
    /// Who keeps `key` closed: its holder, or one whose lease ran out and
    /// whose lock-delay has not; one past both is forgotten.
    fn holder(&mut self, key: &str, now: Instant) -> Option<&Held> {
        if self.locks.get(key).is_some_and(|h| h.closed_until() <= now) {
            self.locks.remove(key);
        }
        self.locks.get(key)
    }
}

#[async_trait::async_trait]
impl Backend for Memory {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn guarantee(&self) -> Guarantee {
        Guarantee::Correctness
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
        loop {
            let sent_at = Instant::now();
            let released = self.shared.released.notified();
            let busy_until = {
                let mut state = self.shared.state();
                match state.holder(key, sent_at) {
                    Some(h) if wait.is_none() && h.deadline <= sent_at => {
                        let left = (h.closed_until() - sent_at).as_millis();
                        return Err(Error::lock_delayed(
                            key,
                            u64::try_from(left).unwrap_or(u64::MAX),
                        ));
                    }
                    Some(h) if wait.is_none() => {
                        return Err(Error::Held {
                            key: key.to_string(),
                            holder: h.holder.clone(),
                            fence: Some(h.fence),
                        })
                    }
                    Some(h) => h.closed_until(),
                    None => {
                        state.next_fence += 1;
                        let fence = state.next_fence;
                        state.locks.insert(
                            key.to_string(),
                            Held {
                                fence,
                                holder: holder.to_string(),
                                ttl: opts.ttl,
                                deadline: sent_at + opts.ttl,
                                lock_delay: opts.lock_delay,
                            },
                        );
                        let checkpoint = state.checkpoints.get(key).cloned();
                        drop(state);
                        return Ok(self.granted(key, fence, opts.ttl, sent_at, checkpoint));
                    }
                }
            };
            if Instant::now() >= give_up {
                return Err(Error::Timeout {
                    key: key.to_string(),
                });
            }
            tokio::select! {
                _ = released => {}
                _ = tokio::time::sleep_until(busy_until.min(give_up)) => {}
            }
        }
    }

    async fn release_by_fence(&self, key: &str, fence: Fence) -> Result<()> {
        release(&self.shared, key, fence)
    }
}

impl Memory {
    fn granted(
        &self,
        key: &str,
        fence: Fence,
        ttl: Duration,
        sent_at: Instant,
        checkpoint: Option<Vec<u8>>,
    ) -> Acquired {
        let shared = self.shared.clone();
        let k = key.to_string();
        let keeper = Keeper::spawn(ttl, sent_at, move || {
            let (shared, key) = (shared.clone(), k.clone());
            async move {
                let now = Instant::now();
                let mut state = shared.state();
                match state.locks.get_mut(&key) {
                    Some(h) if h.fence == fence && h.deadline > now => {
                        h.deadline = now + h.ttl;
                        Ok(())
                    }
                    _ => Err(RenewError::Lost("the lock expired".into())),
                }
            }
        });
        Acquired {
            fence: Some(fence),
            checkpoint,
            liveness: keeper.liveness().clone(),
            hold: Box::new(MemoryHold {
                shared: self.shared.clone(),
                key: key.to_string(),
                fence,
                keeper,
            }),
        }
    }
}

fn release(shared: &Shared, key: &str, fence: Fence) -> Result<()> {
    let mut state = shared.state();
    let current = state.holder(key, Instant::now()).map(|h| h.fence);
    if current != Some(fence) {
        return Err(Error::StaleFence {
            presented: fence,
            current,
        });
    }
    state.locks.remove(key);
    drop(state);
    shared.released.notify_waiters();
    Ok(())
}

struct MemoryHold {
    shared: Arc<Shared>,
    key: String,
    fence: Fence,
    keeper: Keeper,
}

#[async_trait::async_trait]
impl Hold for MemoryHold {
    async fn release(self: Box<Self>) -> Result<()> {
        self.keeper.stop().await;
        release(&self.shared, &self.key, self.fence)
    }

    async fn save_checkpoint(&self, data: &[u8]) -> Result<()> {
        let mut state = self.shared.state();
        let now = Instant::now();
        let current = state
            .holder(&self.key, now)
            .filter(|h| h.deadline > now)
            .map(|h| h.fence);
        if current != Some(self.fence) {
            return Err(Error::StaleFence {
                presented: self.fence,
                current,
            });
        }
        state.checkpoints.insert(self.key.clone(), data.to_vec());
        Ok(())
    }
}
