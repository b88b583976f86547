//! In memory, for tests and for one process guarding its own work — `Correctness`
//! within that process (nothing outside it can see these locks).
//!
//! The locks are leaseholdd's own lock table ([`LockTable`]), driven here the
//! way the server drives it, so they keep the server's semantics rather than
//! a copy of them:
//! - **Time is an input.** Every command is stamped with the milliseconds
//!   since the backend was made, on this process's monotonic clock (tokio's,
//!   so a test may pause it), rounded up: the table never expires a lease
//!   before its holder's own deadline.
//! - **A hold is a lease of its own**, with the hold's TTL, granted together
//!   with the lock in one step (a refusal leaves no lease behind), renewed by
//!   the hold's keeper, and revoked when the hold is released.
//! - **Waiters queue in the table**, first come first served, and are woken
//!   by the table's own grant, in the step that freed the key. A waiter that
//!   gives up (its wait ran out, or its caller dropped the call) withdraws
//!   its wait and revokes its lease, as leaseholdd's wait protocol does, so a
//!   grant nobody hears of is released at once.
//! - **Expiry is a command.** A task sleeps until the table's next deadline
//!   (a lease, a wait, the end of a lock-delay) and then applies a tick, as
//!   leaseholdd's leader does. It holds the table only weakly and is aborted
//!   when the last handle on the table goes.
//!
//! Lock-delay and checkpoints are the table's; shared holds, semaphores and
//! lock sets are refused (leaseholdd's alone), as are `status` and `watch`.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use leasehold_core::{
    Command, Event, Grant, LeaseId, LockError, LockTable, Outcome, Response, Stamp, WaitEnd,
};
use tokio::sync::{oneshot, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{Acquired, Backend, Guarantee, Hold, LockOptions};
use crate::keeper::{Keeper, RenewError};
use crate::{Error, Fence, Result};

/// The one leadership this table ever has: no leader changes in a process.
const EPOCH: u64 = 1;

/// How long past its deadline a waiter waits for the table's own answer
/// before it withdraws by itself: covers an expiry task whose runtime shut
/// down under it.
const WAIT_SLACK: Duration = Duration::from_millis(100);

/// The in-memory backend. Clones share one table.
#[derive(Clone)]
pub struct Memory {
    shared: Arc<Shared>,
}

impl Default for Memory {
    fn default() -> Self {
        Memory::new()
    }
}

/// The table, its clock, and who waits on it.
struct Shared {
    /// Table time 0: every stamp counts milliseconds from here.
    origin: Instant,
    state: Mutex<State>,
    /// Told after every command: the next deadline may have moved. Outside
    /// `state` so the expiry task can wait on it holding the table weakly.
    changed: Arc<Notify>,
}

struct State {
    table: LockTable,
    /// Queued waits by lease (each lease waits for one key), and where to
    /// tell how the wait ended. An entry leaves when it is told.
    waits: HashMap<LeaseId, oneshot::Sender<Waited>>,
    /// The expiry task; spawned again when it is gone (the runtime it ran
    /// on shut down).
    expiry: Option<JoinHandle<()>>,
}

/// How a queued wait ended.
#[derive(Debug)]
enum Waited {
    /// The table granted the key to the waiting lease.
    Granted(Grant),
    /// The wait left the queue without a grant.
    Ended(WaitEnd),
}

impl Memory {
    /// An empty table. Its expiry task starts now if called within a tokio
    /// runtime, and otherwise with the first lock taken.
    pub fn new() -> Memory {
        let shared = Arc::new(Shared {
            origin: Instant::now(),
            state: Mutex::new(State {
                table: LockTable::new(),
                waits: HashMap::new(),
                expiry: None,
            }),
            changed: Arc::new(Notify::new()),
        });
        shared.ensure_expiry(&mut shared.state.lock());
        Memory { shared }
    }
}

impl Shared {
    /// Table time now: milliseconds since `origin`, rounded up.
    fn now_ms(&self) -> u64 {
        let elapsed = Instant::now().saturating_duration_since(self.origin);
        let ms = elapsed.as_nanos().div_ceil(1_000_000);
        u64::try_from(ms).unwrap_or(u64::MAX)
    }

    /// The moment table time reaches `ms`.
    fn instant(&self, ms: u64) -> Instant {
        self.origin + Duration::from_millis(ms)
    }

    /// Applies `command` now, tells each waiter the table granted or ended
    /// in the same step, and wakes the expiry task.
    fn run(self: &Arc<Self>, state: &mut State, command: Command) -> Outcome {
        let stamp = Stamp {
            now: self.now_ms(),
            epoch: EPOCH,
        };
        let mut events = Vec::new();
        let outcome = state.table.apply(stamp, command, &mut events);
        for event in events {
            let (lease, waited) = match event {
                Event::Acquired {
                    lease,
                    fence,
                    checkpoint,
                    ..
                } => (
                    lease,
                    Waited::Granted(Grant {
                        lease,
                        fence,
                        checkpoint,
                    }),
                ),
                Event::WaitEnded { lease, reason, .. } => (lease, Waited::Ended(reason)),
                _ => continue,
            };
            if let Some(waiter) = state.waits.remove(&lease) {
                // A waiter that is gone withdraws under this same lock
                // (`Withdraw`), which also takes back a grant it missed.
                let _ = waiter.send(waited);
            }
        }
        self.ensure_expiry(state);
        self.changed.notify_one();
        outcome
    }

    /// Locks the table and applies one command.
    fn apply(self: &Arc<Self>, command: Command) -> Outcome {
        self.run(&mut self.state.lock(), command)
    }

    /// Starts the expiry task on the current runtime unless it is running.
    fn ensure_expiry(self: &Arc<Self>, state: &mut State) {
        if state
            .expiry
            .as_ref()
            .is_some_and(|task| !task.is_finished())
        {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let task = expire(Arc::downgrade(self), self.changed.clone());
            state.expiry = Some(runtime.spawn(task));
        }
    }

    /// Applies a tick if something in the table is due; when the next thing
    /// will be.
    fn tick_if_due(self: &Arc<Self>) -> Option<Instant> {
        let mut state = self.state.lock();
        if state
            .table
            .next_deadline()
            .is_some_and(|due| due <= self.now_ms())
        {
            // A tick is never refused: it only carries the time.
            let _ = self.run(&mut state, Command::Tick);
        }
        state.table.next_deadline().map(|due| self.instant(due))
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(task) = self.state.get_mut().expiry.take() {
            task.abort();
        }
    }
}

/// The expiry task: sleeps until the table's next deadline, or until a
/// command may have moved it, and ticks. Holds the table only while it
/// looks at it, and ends once nobody else holds it.
async fn expire(shared: Weak<Shared>, changed: Arc<Notify>) {
    loop {
        let next = match shared.upgrade() {
            Some(shared) => shared.tick_if_due(),
            None => return,
        };
        match next {
            Some(at) => tokio::select! {
                _ = tokio::time::sleep_until(at) => {}
                _ = changed.notified() => {}
            },
            None => changed.notified().await,
        }
    }
}

/// Milliseconds of a duration, for a command.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The table's refusal of an operation on `key`, as ours.
fn refused(key: &str, e: LockError) -> Error {
    match e {
        LockError::Held {
            key, holder, fence, ..
        } => Error::Held {
            key,
            holder,
            // 0: nobody holds it yet, a lock set is first in line.
            fence: (fence != 0).then_some(fence),
        },
        LockError::LockDelayed { key, left_ms } => Error::lock_delayed(&key, left_ms),
        LockError::StaleFence {
            presented, current, ..
        } => Error::StaleFence { presented, current },
        LockError::WaitTimeout { key } => Error::Timeout { key },
        LockError::LeaseExpired { .. } | LockError::LeaseNotFound { .. } => Error::LeaseLost {
            key: key.to_string(),
            reason: e.to_string(),
        },
        LockError::Invalid { .. } => Error::InvalidArgument(e.to_string()),
        LockError::Unauthenticated { .. } => Error::Unauthenticated(e.to_string()),
        LockError::PermissionDenied { .. } | LockError::NotOwner { .. } => {
            Error::PermissionDenied(e.to_string())
        }
    }
}

/// An answer the table never gives to this command.
fn unexpected(command: &str, response: Response) -> Error {
    Error::Other(format!(
        "the lock table answered {command} with {response:?}; this is a bug in the in-memory backend"
    ))
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
        let sent_at = Instant::now();
        let give_up = sent_at + wait.unwrap_or_default();
        let command = Command::GrantAndAcquire {
            ttl_ms: millis(opts.ttl),
            holder: holder.to_string(),
            key: key.to_string(),
            wait_ms: wait.map_or(0, millis),
            lock_delay_ms: millis(opts.lock_delay),
            request_id: 0,
            mode: opts.mode,
        };
        let (answer, waited) = {
            let mut state = self.shared.state.lock();
            let answer = self.shared.run(&mut state, command);
            // Registered in the step that queued it: no grant comes first.
            let waited = match &answer {
                Ok(Response::Queued { lease, .. }) => {
                    let (tell, told) = oneshot::channel();
                    state.waits.insert(*lease, tell);
                    Some(told)
                }
                _ => None,
            };
            (answer, waited)
        };
        match (answer.map_err(|e| refused(key, e))?, waited) {
            (Response::Acquired(grant), _) => {
                let keeper = self.keeper(grant.lease, opts.ttl, sent_at);
                Ok(self.hold(key, grant, keeper))
            }
            (Response::Queued { lease, attempt, .. }, Some(told)) => {
                let withdraw = Withdraw {
                    shared: self.shared.clone(),
                    lease,
                    key: key.to_string(),
                    attempt,
                    granted: false,
                };
                self.wait(withdraw, told, opts.ttl, sent_at, give_up).await
            }
            (other, _) => Err(unexpected("an acquire", other)),
        }
    }

    async fn release_by_fence(&self, key: &str, fence: Fence) -> Result<()> {
        let mut state = self.shared.state.lock();
        let now = self.shared.now_ms();
        let lease = state
            .table
            .lock(key, now)
            .and_then(|l| l.holders.into_iter().find(|h| h.fence == fence))
            .map(|h| h.lease);
        let released = self.shared.run(
            &mut state,
            Command::Release {
                key: key.to_string(),
                fence,
                request_id: 0,
            },
        );
        released.map_err(|e| refused(key, e))?;
        // The lease was the hold's alone: ending it tells the holder at its
        // next renewal that the lock is gone.
        if let Some(lease) = lease {
            let _ = self.shared.run(&mut state, Command::Revoke { lease });
        }
        Ok(())
    }
}

impl Memory {
    /// Renews `lease` every TTL/3 from `sent_at`, until stopped or refused.
    fn keeper(&self, lease: LeaseId, ttl: Duration, sent_at: Instant) -> Keeper {
        let shared = self.shared.clone();
        Keeper::spawn(ttl, sent_at, move || {
            let renewed = shared.apply(Command::KeepAlive { lease });
            async move {
                match renewed {
                    Ok(_) => Ok(()),
                    Err(e) => Err(RenewError::Lost(e.to_string())),
                }
            }
        })
    }

    fn hold(&self, key: &str, grant: Grant, keeper: Keeper) -> Acquired {
        Acquired {
            fence: Some(grant.fence),
            checkpoint: grant.checkpoint.map(|c| c.data.to_vec()),
            liveness: keeper.liveness().clone(),
            hold: Box::new(MemoryHold {
                shared: self.shared.clone(),
                key: key.to_string(),
                fence: grant.fence,
                lease: grant.lease,
                keeper,
            }),
        }
    }

    /// Waits in the queue for the table's answer: the grant, or the end of
    /// the wait at its deadline. The lease is renewed meanwhile, as a held
    /// one would be.
    async fn wait(
        &self,
        mut withdraw: Withdraw,
        mut told: oneshot::Receiver<Waited>,
        ttl: Duration,
        sent_at: Instant,
        give_up: Instant,
    ) -> Result<Acquired> {
        let keeper = self.keeper(withdraw.lease, ttl, sent_at);
        let waited = match tokio::time::timeout_at(give_up + WAIT_SLACK, &mut told).await {
            Ok(waited) => waited.ok(),
            // No answer by then: one that came meanwhile counts; otherwise
            // `withdraw` ends the wait.
            Err(_) => told.try_recv().ok(),
        };
        let key = withdraw.key.clone();
        match waited {
            Some(Waited::Granted(grant)) => {
                withdraw.granted = true;
                Ok(self.hold(&key, grant, keeper))
            }
            Some(Waited::Ended(WaitEnd::LeaseGone)) => Err(Error::LeaseLost {
                key,
                reason: "the waiting lease expired before the lock was granted".into(),
            }),
            Some(Waited::Ended(_)) | None => Err(Error::Timeout { key }),
        }
    }
}

/// Ends a wait that did not end in a grant, or whose caller went away:
/// withdraws it from the queue (taking back a grant made to it that nobody
/// heard of) and revokes the lease made for it, under one lock.
struct Withdraw {
    shared: Arc<Shared>,
    lease: LeaseId,
    key: String,
    /// The wait's attempt, as the table numbered it.
    attempt: u64,
    /// The grant was handed to the caller: nothing to withdraw.
    granted: bool,
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        if self.granted {
            return;
        }
        let mut state = self.shared.state.lock();
        state.waits.remove(&self.lease);
        let cancel = Command::CancelWait {
            lease: self.lease,
            key: std::mem::take(&mut self.key),
            request_id: 0,
            attempt: self.attempt,
        };
        // Refused only when the lease already ended, which ended the wait.
        let _ = self.shared.run(&mut state, cancel);
        let _ = self
            .shared
            .run(&mut state, Command::Revoke { lease: self.lease });
    }
}

struct MemoryHold {
    shared: Arc<Shared>,
    key: String,
    fence: Fence,
    /// The lease made for this hold alone.
    lease: LeaseId,
    keeper: Keeper,
}

#[async_trait::async_trait]
impl Hold for MemoryHold {
    async fn release(self: Box<Self>) -> Result<()> {
        let MemoryHold {
            shared,
            key,
            fence,
            lease,
            keeper,
        } = *self;
        keeper.stop().await;
        let mut state = shared.state.lock();
        let released = shared.run(
            &mut state,
            Command::Release {
                key: key.clone(),
                fence,
                request_id: 0,
            },
        );
        // Refused only when the lease already ended (it expired).
        let _ = shared.run(&mut state, Command::Revoke { lease });
        released.map(drop).map_err(|e| refused(&key, e))
    }

    async fn save_checkpoint(&self, data: &[u8]) -> Result<()> {
        let save = Command::SaveCheckpoint {
            key: self.key.clone(),
            fence: self.fence,
            data: data.to_vec(),
        };
        self.shared
            .apply(save)
            .map(drop)
            .map_err(|e| refused(&self.key, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Client, LockOptions};

    fn opts() -> LockOptions {
        LockOptions::default()
            .ttl(Duration::from_secs(10))
            .wait(Duration::from_secs(60))
    }

    fn client(memory: &Memory, holder: &str) -> Client {
        let backend = Arc::new(memory.clone());
        Client::with_backend(backend, Guarantee::Correctness, Some(holder.into())).expect("client")
    }

    /// How many wait in `key`'s queue.
    fn queued(memory: &Memory, key: &str) -> usize {
        let state = memory.shared.state.lock();
        state.table.lock(key, 0).map_or(0, |l| l.waiters.len())
    }

    /// Lets other tasks run until `key`'s queue is `n` long.
    async fn until_queued(memory: &Memory, key: &str, n: usize) {
        while queued(memory, key) < n {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_are_granted_first_come_first_served() {
        let memory = Memory::new();
        let first = client(&memory, "first")
            .try_acquire("k", opts())
            .await
            .expect("acquire");
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..5 {
            let (c, order) = (client(&memory, &format!("w{i}")), order.clone());
            waiters.push(tokio::spawn(async move {
                let lease = c.acquire("k", opts()).await.expect("granted");
                order.lock().push((i, lease.fence().expect("fenced")));
                tokio::time::sleep(Duration::from_millis(10)).await;
                lease.release().await.expect("release");
            }));
            // Each stands in line before the next one comes.
            until_queued(&memory, "k", i + 1).await;
        }
        first.release().await.expect("release");
        for w in waiters {
            w.await.expect("waiter");
        }
        let order = order.lock().clone();
        let who: Vec<usize> = order.iter().map(|(i, _)| *i).collect();
        assert_eq!(who, [0, 1, 2, 3, 4], "granted out of turn");
        assert!(
            order.windows(2).all(|w| w[0].1 < w[1].1),
            "tokens must rise with each grant: {order:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_holder_hands_on_to_the_first_waiter_after_its_lock_delay() {
        let memory = Memory::new();
        let ttl = Duration::from_secs(3);
        let delay = Duration::from_secs(2);
        let start = Instant::now();
        // Taken, then never renewed nor released: its holder vanished.
        let gone = memory
            .acquire("k", "gone", &opts().ttl(ttl).lock_delay(delay), None)
            .await
            .expect("acquire");
        let first_fence = gone.fence;
        drop(gone);
        let c = client(&memory, "next");
        let next = tokio::spawn(async move { c.acquire("k", opts()).await });
        until_queued(&memory, "k", 1).await;
        let lease = next
            .await
            .expect("waiter")
            .expect("granted after the expiry");
        // The expiry task ticked at the lease's deadline, and again when
        // the lock-delay ended: the grant came then (to the timer's
        // millisecond), not before.
        let after = start.elapsed();
        assert!(
            after >= ttl + delay && after <= ttl + delay + Duration::from_millis(2),
            "granted after {after:?}"
        );
        assert!(lease.fence() > first_fence);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_gives_up_leaves_the_queue_and_its_lease() {
        let memory = Memory::new();
        let held = client(&memory, "a")
            .try_acquire("k", opts())
            .await
            .expect("acquire");
        // Dropped by its caller while it waits.
        let c = client(&memory, "b");
        let dropped = tokio::spawn(async move { c.acquire("k", opts()).await.map(drop) });
        until_queued(&memory, "k", 1).await;
        dropped.abort();
        assert!(dropped.await.is_err(), "the call was cancelled");
        assert_eq!(queued(&memory, "k"), 0);
        // Its wait runs out.
        let timed_out = client(&memory, "c")
            .acquire("k", opts().wait(Duration::from_secs(1)))
            .await;
        assert!(
            matches!(timed_out, Err(Error::Timeout { .. })),
            "{:?}",
            timed_out.map(drop)
        );
        assert_eq!(queued(&memory, "k"), 0);
        assert_eq!(
            memory.shared.state.lock().table.lease_count(),
            1,
            "only the holder's lease"
        );
        // Neither was granted the key on the way out.
        held.release().await.expect("the holder still held it");
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_keep_their_kind() {
        let memory = Memory::new();
        let c = client(&memory, "a");
        let lease = c.try_acquire("k", opts()).await.expect("acquire");
        match c.try_acquire("k", opts()).await {
            Err(Error::Held { holder, fence, .. }) => {
                assert_eq!(holder, "a");
                assert_eq!(fence, lease.fence());
            }
            other => panic!("{:?}", other.map(drop)),
        }
        let fence = lease.fence().expect("fenced");
        lease.release().await.expect("release");
        match c.release_by_fence("k", fence).await {
            Err(Error::StaleFence { presented, current }) => {
                assert_eq!((presented, current), (fence, None));
            }
            other => panic!("{other:?}"),
        }
        // A lease refused leaves no lease behind.
        assert_eq!(memory.shared.state.lock().table.lease_count(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_by_fence_ends_the_holders_lease() {
        let memory = Memory::new();
        let c = client(&memory, "a");
        let lease = c.try_acquire("k", opts()).await.expect("acquire");
        let fence = lease.fence().expect("fenced");
        c.release_by_fence("k", fence).await.expect("release");
        // Its next renewal is refused: the holder hears at once.
        tokio::time::timeout(Duration::from_secs(5), lease.lost())
            .await
            .expect("lost at the next renewal");
    }

    #[tokio::test(start_paused = true)]
    async fn the_expiry_task_ends_with_the_last_handle() {
        let memory = Memory::new();
        let c = client(&memory, "a");
        c.try_acquire("k", opts())
            .await
            .expect("acquire")
            .release()
            .await
            .expect("release");
        let metrics = tokio::runtime::Handle::current().metrics();
        assert_eq!(metrics.num_alive_tasks(), 1, "the expiry task alone");
        drop((c, memory));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(metrics.num_alive_tasks(), 0);
    }
}
