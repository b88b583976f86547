//! The world: hosts stepped in turn on one thread, each on its own tokio
//! runtime with a paused clock.
//!
//! Every step moves the world's clock one tick and lets each live host run
//! until its own clock has moved one tick times its rate (its drift). Nothing
//! runs on another thread (a host whose runtime starts a blocking thread
//! fails the run) and nothing reads the machine's clock, so a seed fixes the
//! whole run. A crash drops the host's runtime, and every task on
//! it, between two steps; a frozen host is not stepped at all, and when it
//! thaws its clock jumps by the time it missed, as a process's monotonic
//! clock does after SIGSTOP and SIGCONT.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Once;
use std::time::Duration;

use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

use crate::history::{Event, History, Micros};

type Software = Box<dyn Fn() -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>>;

thread_local! {
    /// Panics of tasks on this thread, for the world to record.
    static PANICS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

fn catch_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.with(|p| p.borrow_mut().push(info.to_string()));
            default(info);
        }));
    });
}

struct Host {
    name: String,
    rate: f64,
    software: Software,
    runtime: Option<Runtime>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
    /// When it was frozen, if it is.
    frozen_since: Option<Micros>,
    /// Its clock's start, and how far it should have run since, in µs.
    origin: tokio::time::Instant,
    local: f64,
    /// Started again when its software exits with an error.
    supervised: bool,
    incarnation: u64,
}

/// Hosts, their runtimes and the world's clock.
pub struct World {
    seed: u64,
    tick: Duration,
    hosts: Vec<Host>,
    history: History,
}

/// A host's number in its world.
pub type HostId = usize;

impl World {
    /// An empty world whose ticks are `tick` long.
    pub fn new(seed: u64, tick: Duration, history: History) -> World {
        catch_panics();
        World {
            seed,
            tick,
            hosts: Vec::new(),
            history,
        }
    }

    fn runtime(&self, host: usize, incarnation: u64) -> Runtime {
        let mut builder = tokio::runtime::Builder::new_current_thread();
        builder.enable_time().start_paused(true);
        // `select!` picks among ready branches at random: from the seed.
        let seed = self.seed ^ ((host as u64) << 48) ^ (incarnation << 32);
        builder.rng_seed(tokio::runtime::RngSeed::from_bytes(&seed.to_le_bytes()));
        builder
            .build()
            .unwrap_or_else(|e| panic!("a current-thread runtime: {e}"))
    }

    /// Adds a host running `software`, with a clock running at `rate` times
    /// the world's, and starts it.
    pub fn add<F, Fut>(&mut self, name: &str, rate: f64, software: F) -> HostId
    where
        F: Fn() -> Fut + 'static,
        Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let id = self.hosts.len();
        self.hosts.push(Host {
            name: name.to_string(),
            rate,
            software: Box::new(move || Box::pin(software())),
            runtime: None,
            task: None,
            frozen_since: None,
            origin: tokio::time::Instant::now(),
            local: 0.0,
            supervised: false,
            incarnation: 0,
        });
        self.start(id);
        id
    }

    fn start(&mut self, id: HostId) {
        let incarnation = self.hosts[id].incarnation + 1;
        let runtime = self.runtime(id, incarnation);
        let host = &mut self.hosts[id];
        host.incarnation = incarnation;
        // The timer wheel counts whole milliseconds from the runtime's start:
        // begin on one, and move the clock only to whole milliseconds.
        host.origin = runtime.block_on(async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            tokio::time::Instant::now()
        });
        host.local = 0.0;
        let future = (host.software)();
        host.task = Some(runtime.spawn(future));
        host.runtime = Some(runtime);
        host.frozen_since = None;
    }

    /// Starts the host again whenever its software fails (a supervisor's
    /// restart; what was written stays, as after a process exit).
    pub fn supervise(&mut self, id: HostId) {
        self.hosts[id].supervised = true;
    }

    /// The host's name.
    pub fn name(&self, id: HostId) -> &str {
        &self.hosts[id].name
    }

    /// Whether the host's process runs (frozen or not).
    pub fn is_up(&self, id: HostId) -> bool {
        self.hosts[id].runtime.is_some()
    }

    /// Whether its software has finished.
    pub fn is_done(&self, id: HostId) -> bool {
        self.hosts[id].task.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Runs `future` on the host (an operator's call made there); dropped
    /// if the host is down or dies.
    pub fn spawn_on<F>(&mut self, id: HostId, future: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if let Some(runtime) = &self.hosts[id].runtime {
            runtime.spawn(future);
        }
    }

    /// Kills the host's process: every task on it is dropped now.
    pub fn crash(&mut self, id: HostId) {
        let host = &mut self.hosts[id];
        host.task = None;
        host.frozen_since = None;
        if let Some(runtime) = host.runtime.take() {
            drop(runtime);
        }
        self.record_panics();
    }

    /// Starts a crashed host's software again.
    pub fn restart(&mut self, id: HostId) {
        if self.hosts[id].runtime.is_none() {
            self.start(id);
        }
    }

    /// Stops stepping the host (SIGSTOP).
    pub fn freeze(&mut self, id: HostId) {
        let now = self.history.now();
        let host = &mut self.hosts[id];
        if host.runtime.is_some() && host.frozen_since.is_none() {
            host.frozen_since = Some(now);
        }
    }

    /// Steps the host again (SIGCONT): its clock jumps by the time it was
    /// frozen, so every timer that came due fires at once.
    pub fn thaw(&mut self, id: HostId) {
        let now = self.history.now();
        let host = &mut self.hosts[id];
        let Some(since) = host.frozen_since.take() else {
            return;
        };
        host.local += (now - since) as f64 * host.rate;
        let target = host.origin + Duration::from_millis((host.local / 1000.0) as u64);
        if let Some(runtime) = &host.runtime {
            runtime.block_on(async move {
                let missed = target.saturating_duration_since(tokio::time::Instant::now());
                tokio::time::advance(missed).await;
            });
        }
        self.record_panics();
    }

    /// Moves the world one tick.
    pub fn step(&mut self) -> anyhow::Result<()> {
        let now = self.history.now() + self.tick.as_micros() as Micros;
        self.history.set_now(now);
        let mut exited = Vec::new();
        for (id, host) in self.hosts.iter_mut().enumerate() {
            let (Some(runtime), None) = (&host.runtime, host.frozen_since) else {
                continue;
            };
            host.local += self.tick.as_micros() as f64 * host.rate;
            let target = host.origin + Duration::from_millis((host.local / 1000.0) as u64);
            runtime.block_on(async move { tokio::time::sleep_until(target).await });
            // Work on a blocking thread finishes in real time, so where its
            // answer lands among the host's tasks would depend on the
            // machine's load: a run would no longer replay.
            if runtime.metrics().num_blocking_threads() > 0 {
                anyhow::bail!(
                    "{} started a blocking thread: its timing would leak into the run",
                    host.name
                );
            }
            if let Some(task) = host.task.as_mut().filter(|t| t.is_finished()) {
                match runtime.block_on(task) {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) if host.supervised => exited.push((id, format!("{e:#}"))),
                    Ok(Err(e)) => anyhow::bail!("{} failed: {e:#}", host.name),
                    Err(e) => anyhow::bail!("{} panicked: {e}", host.name),
                }
                host.task = None;
            }
        }
        for (id, why) in exited {
            self.history.record(Event::Exited {
                host: self.hosts[id].name.clone(),
                why,
            });
            self.crash(id);
            self.start(id);
        }
        self.record_panics();
        Ok(())
    }

    fn record_panics(&self) {
        let panics = PANICS.with(|p| std::mem::take(&mut *p.borrow_mut()));
        for message in panics {
            self.history.record(Event::Panic { message });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use super::*;

    /// A host whose software writes its clock's elapsed milliseconds.
    fn clock_host(world: &mut World, rate: f64) -> Arc<AtomicU64> {
        let seen = Arc::new(AtomicU64::new(0));
        let out = seen.clone();
        world.add("clock", rate, move || {
            let out = out.clone();
            async move {
                let start = tokio::time::Instant::now();
                loop {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    out.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
                }
            }
        });
        seen
    }

    #[test]
    fn clocks_drift_at_their_rates_and_jump_after_a_freeze() {
        let mut world = World::new(1, Duration::from_millis(1), History::default());
        let slow = clock_host(&mut world, 0.98);
        let fast = clock_host(&mut world, 1.02);
        for _ in 0..10_000 {
            world.step().expect("step");
        }
        let (s, f) = (slow.load(Ordering::Relaxed), fast.load(Ordering::Relaxed));
        assert!((9_790..=9_810).contains(&s), "slow clock: {s} ms");
        assert!((10_190..=10_210).contains(&f), "fast clock: {f} ms");

        world.freeze(0);
        for _ in 0..2_000 {
            world.step().expect("step");
        }
        assert_eq!(
            slow.load(Ordering::Relaxed),
            s,
            "a frozen host does nothing"
        );
        world.thaw(0);
        world.step().expect("step");
        let jumped = slow.load(Ordering::Relaxed);
        assert!(
            jumped >= s + 1_950,
            "the clock jumps by the time frozen: {s} -> {jumped}"
        );
    }

    #[test]
    fn a_host_that_starts_a_blocking_thread_stops_the_run() {
        let mut world = World::new(1, Duration::from_millis(1), History::default());
        world.add("blocking", 1.0, || async {
            tokio::task::spawn_blocking(|| ()).await?;
            Ok(())
        });
        let err = (0..10)
            .find_map(|_| world.step().err())
            .expect("a blocking thread is refused");
        assert!(err.to_string().contains("blocking thread"), "{err}");
    }

    #[test]
    fn a_crash_drops_every_task_and_a_restart_runs_the_software_again() {
        let mut world = World::new(1, Duration::from_millis(1), History::default());
        let seen = clock_host(&mut world, 1.0);
        for _ in 0..100 {
            world.step().expect("step");
        }
        world.crash(0);
        let at_crash = seen.load(Ordering::Relaxed);
        for _ in 0..100 {
            world.step().expect("step");
        }
        assert_eq!(seen.load(Ordering::Relaxed), at_crash);
        world.restart(0);
        for _ in 0..10 {
            world.step().expect("step");
        }
        assert!(
            seen.load(Ordering::Relaxed) < at_crash,
            "a new process, a new clock"
        );
    }
}
