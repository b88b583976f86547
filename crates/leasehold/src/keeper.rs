//! Keeps a lease alive and says the moment it is lost.
//!
//! Every backend renews through this one loop, so every backend gets the same
//! holder-side rules (DESIGN §1 "Time and expiry"):
//! - renew every TTL/3;
//! - the client's own deadline is `sent_at + ttl - margin`, from when the last
//!   successful acquire or renewal was *sent*, so the client always gives up
//!   before the store does;
//! - a transient failure is retried until that deadline; a definitive one (the
//!   store says expired, or not the owner) loses the lease at once;
//! - at the deadline the lease is lost even if a renewal is still hanging;
//! - stopping waits for a renewal in flight, so nothing is ever renewed after
//!   a release is sent (the ordering bug Redisson users hit, #7272).

use parking_lot::Mutex;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How a renewal failed.
#[derive(Debug, Clone)]
pub enum RenewError {
    /// The store says the lease is gone; retrying cannot help.
    Lost(String),
    /// The store could not be reached; retry until the deadline.
    Transient(String),
}

/// The client-side margin taken off the TTL: a tenth, at least 20 ms, at most 2 s.
pub fn margin(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(20), Duration::from_secs(2))
}

/// How long before its time a renewal may go, to go in one call with
/// others: a thirtieth of the TTL (a tenth of the time between renewals),
/// at most a second. A client's renewals whose times fall within it of
/// each other are sent together.
pub fn early(ttl: Duration) -> Duration {
    (ttl / 30).min(Duration::from_secs(1))
}

/// Shared view of a lease's liveness: cheap to clone.
#[derive(Clone)]
pub struct Liveness {
    lost: CancellationToken,
    inner: Arc<LivenessInner>,
}

struct LivenessInner {
    deadline: Mutex<Instant>,
    reason: Mutex<Option<String>>,
}

impl Liveness {
    /// A live lease whose deadline is `deadline`.
    pub fn new(deadline: Instant) -> Liveness {
        Liveness {
            lost: CancellationToken::new(),
            inner: Arc::new(LivenessInner {
                deadline: Mutex::new(deadline),
                reason: Mutex::new(None),
            }),
        }
    }

    /// A liveness that is lost when `self` is, and can also be lost on its own.
    pub fn child(&self) -> Liveness {
        Liveness {
            lost: self.lost.child_token(),
            inner: self.inner.clone(),
        }
    }

    /// Marks the lease lost, with why. The first reason wins.
    pub fn lose(&self, reason: impl Into<String>) {
        {
            let mut r = self.inner.reason.lock();
            if r.is_none() {
                *r = Some(reason.into());
            }
        }
        self.lost.cancel();
    }

    /// Why it was lost.
    pub fn reason(&self) -> String {
        self.inner
            .reason
            .lock()
            .clone()
            .unwrap_or_else(|| "lost".into())
    }

    /// The client-side deadline.
    pub fn deadline(&self) -> Instant {
        *self.inner.deadline.lock()
    }

    fn set_deadline(&self, deadline: Instant) {
        *self.inner.deadline.lock() = deadline;
    }

    /// Whether the lease is still good right now: not marked lost, and the
    /// deadline has not passed. Checked synchronously, so a process resumed
    /// after a long pause sees the truth before its renewal task has run.
    pub fn is_live(&self) -> bool {
        if self.lost.is_cancelled() {
            return false;
        }
        if Instant::now() >= self.deadline() {
            self.lose("the client-side deadline passed without a successful renewal");
            return false;
        }
        true
    }

    /// The token cancelled when the lease is lost.
    pub fn token(&self) -> &CancellationToken {
        &self.lost
    }
}

/// A running renewal loop.
pub struct Keeper {
    liveness: Liveness,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Keeper {
    /// Starts renewing a lease acquired by a request sent at `sent_at`.
    pub fn spawn<F, Fut>(ttl: Duration, sent_at: Instant, renew: F) -> Keeper
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), RenewError>> + Send,
    {
        Keeper::start(ttl, sent_at, renew, Duration::ZERO, false)
    }

    /// As [`Keeper::spawn`], waking `early` before each renewal is due: a
    /// renewal that may wait up to `early` to go with others (a client's
    /// renewals sent together) still goes by its time. The deadline counts
    /// from the wake, before the wait, so the wait comes off the lease's
    /// budget; the renewals stay a third of the TTL apart.
    pub fn spawn_early<F, Fut>(ttl: Duration, sent_at: Instant, early: Duration, renew: F) -> Keeper
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), RenewError>> + Send,
    {
        Keeper::start(ttl, sent_at, renew, early.min(ttl / 6), false)
    }

    /// A keeper with a bug planted on purpose (feature `planted-bugs`), for
    /// a simulation to show its checker catches it: each renewal's deadline
    /// counts from when its answer came back, not from when it was sent.
    /// Pass the grant's answer time as `sent_at` to plant it there too.
    #[cfg(feature = "planted-bugs")]
    pub fn spawn_counting_from_reply<F, Fut>(ttl: Duration, sent_at: Instant, renew: F) -> Keeper
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), RenewError>> + Send,
    {
        Keeper::start(ttl, sent_at, renew, Duration::ZERO, true)
    }

    fn start<F, Fut>(
        ttl: Duration,
        sent_at: Instant,
        mut renew: F,
        early: Duration,
        from_reply: bool,
    ) -> Keeper
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), RenewError>> + Send,
    {
        let margin = margin(ttl);
        let liveness = Liveness::new(sent_at + ttl - margin);
        let stop = CancellationToken::new();
        let (live, stopped) = (liveness.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut next = sent_at + ttl / 3;
            loop {
                let deadline = live.deadline();
                tokio::select! {
                    _ = stopped.cancelled() => return,
                    _ = live.lost.cancelled() => return,
                    _ = tokio::time::sleep_until(next.checked_sub(early).unwrap_or(next).min(deadline)) => {}
                }
                if Instant::now() >= live.deadline() {
                    live.lose("the client-side deadline passed without a successful renewal");
                    return;
                }
                let sent = Instant::now();
                // Not cancelled by `stop`: a release waits for this to finish.
                match tokio::time::timeout_at(live.deadline(), renew()).await {
                    Ok(Ok(())) => {
                        let sent = if from_reply { Instant::now() } else { sent };
                        live.set_deadline(sent + ttl - margin);
                        next = sent + early + ttl / 3;
                    }
                    Ok(Err(RenewError::Lost(why))) => {
                        live.lose(why);
                        return;
                    }
                    Ok(Err(RenewError::Transient(why))) => {
                        tracing::debug!(%why, "renewal failed; retrying until the deadline");
                        // Soon again: a failover leaves ~TTL/2 of budget.
                        next = Instant::now()
                            + (ttl / 20)
                                .clamp(Duration::from_millis(10), Duration::from_millis(500));
                    }
                    Err(_) => {
                        live.lose("renewal did not complete before the client-side deadline");
                        return;
                    }
                }
                if stopped.is_cancelled() {
                    return;
                }
            }
        });
        Keeper {
            liveness,
            stop,
            task: Some(task),
        }
    }

    /// The lease's liveness.
    pub fn liveness(&self) -> &Liveness {
        &self.liveness
    }

    /// Stops renewing and waits until no renewal is in flight.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(start_paused = true)]
    async fn an_early_keeper_asks_early_and_keeps_a_third_of_the_ttl_between_renewals() {
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        let early = Duration::from_millis(100);
        let keeper =
            Keeper::spawn_early(Duration::from_secs(3), Instant::now(), early, move || {
                let c = c.clone();
                async move {
                    c.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            });
        // Asked at 0.9 s, 1.9 s, ...: ten by 9.95 s, not eleven.
        tokio::time::sleep(Duration::from_millis(950)).await;
        assert_eq!(count.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_millis(9_000)).await;
        assert_eq!(count.load(Ordering::SeqCst), 10);
        assert!(keeper.liveness().is_live());
    }

    #[tokio::test(start_paused = true)]
    async fn renews_every_third_of_the_ttl() {
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        let keeper = Keeper::spawn(Duration::from_secs(3), Instant::now(), move || {
            let c = c.clone();
            async move {
                c.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        });
        tokio::time::sleep(Duration::from_millis(10_050)).await;
        assert_eq!(count.load(Ordering::SeqCst), 10);
        assert!(keeper.liveness().is_live());
    }

    #[tokio::test(start_paused = true)]
    async fn transient_failures_lose_the_lease_at_the_client_deadline() {
        let start = Instant::now();
        let keeper = Keeper::spawn(Duration::from_secs(3), start, || async {
            Err(RenewError::Transient("connection refused".into()))
        });
        keeper.liveness().token().cancelled().await;
        let lost_after = start.elapsed();
        // ttl - margin = 3 s - 300 ms: before the store's 3 s.
        assert!(lost_after <= Duration::from_millis(2_700), "{lost_after:?}");
        assert!(lost_after >= Duration::from_millis(2_690), "{lost_after:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_definitive_failure_loses_it_at_once() {
        let keeper = Keeper::spawn(Duration::from_secs(3), Instant::now(), || async {
            Err(RenewError::Lost("lease expired".into()))
        });
        keeper.liveness().token().cancelled().await;
        assert_eq!(keeper.liveness().reason(), "lease expired");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_renewal_still_loses_at_the_deadline() {
        let start = Instant::now();
        let keeper = Keeper::spawn(Duration::from_secs(3), start, std::future::pending);
        keeper.liveness().token().cancelled().await;
        assert!(start.elapsed() <= Duration::from_millis(2_700));
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_renewed_after_stop_returns() {
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        let keeper = Keeper::spawn(Duration::from_millis(300), Instant::now(), move || {
            let c = c.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                c.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        });
        tokio::time::sleep(Duration::from_millis(120)).await; // a renewal is in flight
        keeper.stop().await;
        let after_stop = count.load(Ordering::SeqCst);
        assert_eq!(after_stop, 1, "stop waits for the renewal in flight");
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(count.load(Ordering::SeqCst), after_stop);
    }
}
