//! `leasehold bench`: the same closed-loop workload against any backend.
//!
//! Workloads:
//! - `cycle`: each client acquires a random key and releases it, in a loop.
//!   One cycle is the latency measured. The headline.
//! - `contended`: every client wants one key; measures hand-over: from the
//!   moment a holder sends its release to the moment the next waiter is granted.
//!   A client that has released asks again only once another client has been
//!   granted, so every grant measured goes to a waiter, not back to the
//!   releaser (which a store whose waiters poll would mostly let it do).
//! - `renew`: leaseholdd only: gRPC keepalives in a closed loop on many leases;
//!   renewals/s, and server CPU per renewal with `--server-pid`.
//! - `sessions`: leaseholdd only: `--keys` leases each holding one lock,
//!   renewed at TTL/3 on schedule (open loop) over `--clients` connections;
//!   renewals due and done per second, latency from each renewal's due
//!   time, sessions lost, and the server's CPU and memory per session.
//!   Run it for at least a third of the TTL, so every session renews.
//!   A connection renews by the Rust client's rule: a call leaves when the
//!   first renewal waiting is due and takes every renewal due within the
//!   client's early window (`KeepAliveMany`). `sessions-each` sends a call per renewal, as
//!   the Go, TypeScript and Python clients do. A connection follows the
//!   leader when its node fails, as a client would. With
//!   `--stop-renewing`, every session stops renewing when the window ends
//!   and the run watches each expire: how late after its TTL each expiry
//!   came, and whether any came early.
//! - `hold`: leaseholdd only: grow to `--keys` held locks on one lease;
//!   reports the server's memory with `--server-pid`.
//! - `keep`: any backend: `--clients` clients hold `--keys` locks between them
//!   with `--ttl` for `--duration`, renewed the way each backend's client
//!   renews them; reports the server's CPU over that time (`--server-pid`,
//!   counting its child processes too) and how many locks were lost.
//!
//! Every client has its own connection (its own `Client`), as separate
//! processes would. Only what completes inside the measured window counts,
//! for every workload: a client that finishes its setup (its grants, say)
//! before the others waits uncounted until the clock starts, and an
//! operation that ends after it stops is not counted either. The report
//! says how long the setup took.
//!
//! # Layout
//!
//! - `mod.rs`: the arguments, what every client records, the clock, and
//!   `bench()`, which runs a workload and hands the figures to the report.
//! - `workloads.rs`: each workload's clients and their loops.
//! - `sessions.rs`: the `sessions` workloads and their renewal schedule.
//! - `expiries.rs`: `sessions --stop-renewing`'s watch on the expiries.
//! - `stats.rs`: the server's CPU and memory, read from `/proc`.
//! - `report.rs`: percentiles and totals, as text or JSON.

mod expiries;
mod report;
mod sessions;
mod stats;
mod workloads;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use leasehold::Error;
use serde_json::json;

use report::report;
use sessions::sessions;
use stats::{cpu_seconds, rss_bytes};
use workloads::{contended, cycle, hold, keep, renew, Shape};

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Workload {
    Cycle,
    /// `cycle` on a semaphore of 5 permits per key: take a permit, give it back.
    Semaphore,
    /// `cycle` on a lock set of 3 random keys: take all three, release them.
    Lockset,
    Contended,
    Renew,
    /// Sessions renewed on schedule, those due together in one call (as
    /// the Rust client renews): see the module doc.
    Sessions,
    /// `sessions` with one call per renewal (as the Go, TypeScript and
    /// Python clients renew).
    SessionsEach,
    Hold,
    Keep,
}

#[derive(Clone)]
pub struct Args {
    pub endpoint: String,
    pub tls: leasehold::TlsOptions,
    /// The access token, for a server with auth on.
    pub token: Option<String>,
    pub workload: Workload,
    pub clients: usize,
    pub duration: Duration,
    pub keys: u64,
    pub ttl: Duration,
    pub server_pid: Option<u32>,
    /// `sessions`: when the window ends, every session stops renewing at
    /// once, and the run watches each expire.
    pub stop_renewing: bool,
    pub json: bool,
}

/// What every client task records.
struct Shared {
    histogram: Mutex<Histogram<u64>>,
    errors: Mutex<BTreeMap<String, u64>>,
    /// The first error's message, for a run in which nothing succeeded.
    first_error: Mutex<Option<String>>,
    /// Whether any call succeeded, setup included, in or out of the window.
    succeeded: AtomicBool,
    ops: AtomicU64,
    /// Set when the measured window opens: nothing before it counts.
    measuring: AtomicBool,
    stop: AtomicBool,
    /// When the measured phase began (after setup such as granting leases).
    measuring_since: Mutex<Option<Instant>>,
    /// The server whose CPU is measured, and its CPU seconds when measuring began.
    server_pid: Option<u32>,
    cpu_since: Mutex<Option<f64>>,
    /// When the measured phase ended, and the server's CPU seconds then.
    measured_until: Mutex<Option<(Instant, Option<f64>)>>,
}

impl Shared {
    fn new(server_pid: Option<u32>) -> anyhow::Result<Arc<Shared>> {
        Ok(Arc::new(Shared {
            server_pid,
            cpu_since: Mutex::new(server_pid.and_then(cpu_seconds)),
            measured_until: Mutex::new(None),
            histogram: Mutex::new(
                Histogram::new_with_bounds(1, 60_000_000, 3).context("histogram")?,
            ),
            errors: Mutex::new(BTreeMap::new()),
            first_error: Mutex::new(None),
            succeeded: AtomicBool::new(false),
            ops: AtomicU64::new(0),
            measuring: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            measuring_since: Mutex::new(None),
        }))
    }

    /// Opens the measured window: from now on operations count.
    fn begin(&self) {
        if let Ok(mut since) = self.measuring_since.lock() {
            *since = Some(Instant::now());
        }
        if let Ok(mut cpu) = self.cpu_since.lock() {
            *cpu = self.server_pid.and_then(cpu_seconds);
        }
        self.measuring.store(true, Ordering::SeqCst);
    }

    /// Counts one operation that took `micros`, if it ended inside the
    /// measured window.
    fn done(&self, local: &mut Histogram<u64>, micros: u64) {
        self.succeeded();
        if self.measuring.load(Ordering::Relaxed) && !self.stop.load(Ordering::Relaxed) {
            let _ = local.record(micros.max(1));
            self.ops.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn record(&self, local: &mut Histogram<u64>) {
        if let Ok(mut h) = self.histogram.lock() {
            let _ = h.add(&*local);
        }
        local.reset();
    }

    /// Counts a failed gRPC call by its status code, and logs the first
    /// message of each code.
    fn status(&self, s: &tonic::Status) {
        self.note_first(|| s.message().to_string());
        let kind = format!("{:?}", s.code()).to_lowercase();
        if let Ok(mut m) = self.errors.lock() {
            let n = m.entry(kind).or_default();
            if *n == 0 {
                tracing::warn!(code = ?s.code(), "{}", s.message());
            }
            *n += 1;
        }
    }

    /// Notes that a call succeeded (a grant or an acquire in a setup, say).
    fn succeeded(&self) {
        self.succeeded.store(true, Ordering::Relaxed);
    }

    fn note_first(&self, message: impl FnOnce() -> String) {
        if let Ok(mut first) = self.first_error.lock() {
            first.get_or_insert_with(message);
        }
    }

    fn error(&self, e: &Error) {
        self.note_first(|| e.to_string());
        let kind = match e {
            Error::Held { .. } => "held",
            Error::LockDelayed { .. } => "lock_delayed",
            Error::Timeout { .. } => "timeout",
            Error::LeaseLost { .. } => "lease_lost",
            Error::StaleFence { .. } => "stale_fence",
            Error::InvalidArgument(_) => "invalid_argument",
            Error::Unavailable(_) => "unavailable",
            Error::OutcomeUnknown(_) => "outcome_unknown",
            Error::ResourceExhausted { .. } => "resource_exhausted",
            _ => "other",
        };
        if let Ok(mut m) = self.errors.lock() {
            *m.entry(kind.to_string()).or_default() += 1;
        }
    }
}

fn progress(duration: Duration, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(duration.as_millis() as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {elapsed_precise} [{bar:30}] {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// Runs the clock for `duration`, updating the bar with ops/s.
async fn run_for(duration: Duration, shared: &Shared, bar: &ProgressBar) {
    let start = Instant::now();
    shared.begin();
    while start.elapsed() < duration {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let ops = shared.ops.load(Ordering::Relaxed);
        bar.set_position(start.elapsed().as_millis() as u64);
        bar.set_message(format!(
            "{:.0} ops/s",
            ops as f64 / start.elapsed().as_secs_f64()
        ));
    }
    shared.stop.store(true, Ordering::Relaxed);
    if let Ok(mut until) = shared.measured_until.lock() {
        *until = Some((Instant::now(), shared.server_pid.and_then(cpu_seconds)));
    }
}

/// Runs the clock for `duration`, then waits for the client tasks to stop.
async fn run_then_join(
    duration: Duration,
    shared: &Shared,
    bar: &ProgressBar,
    tasks: Vec<tokio::task::JoinHandle<()>>,
) -> anyhow::Result<()> {
    run_for(duration, shared, bar).await;
    for t in tasks {
        t.await?;
    }
    Ok(())
}

pub async fn bench(a: Args) -> anyhow::Result<i32> {
    let shared = Shared::new(a.server_pid)?;
    let bar = progress(a.duration, a.json);
    let started = Instant::now();
    let mut extra = serde_json::Map::new();
    match a.workload {
        Workload::Cycle => cycle(&a, &shared, &bar, Shape::Lock).await?,
        Workload::Semaphore => cycle(&a, &shared, &bar, Shape::Permit).await?,
        Workload::Lockset => cycle(&a, &shared, &bar, Shape::Set).await?,
        Workload::Contended => contended(&a, &shared, &bar).await?,
        Workload::Renew => renew(&a, &shared, &bar).await?,
        Workload::Sessions => sessions(&a, &shared, &bar, &mut extra, true).await?,
        Workload::SessionsEach => sessions(&a, &shared, &bar, &mut extra, false).await?,
        Workload::Hold => hold(&a, &shared, &bar, &mut extra).await?,
        Workload::Keep => keep(&a, &shared, &bar, &mut extra).await?,
    }
    // A run in which every call failed (a TLS mistake, a wrong endpoint)
    // measured nothing: say why.
    if !shared.succeeded.load(Ordering::Relaxed) {
        if let Some(first) = shared.first_error.lock().ok().and_then(|f| f.clone()) {
            bar.finish_and_clear();
            anyhow::bail!("no call succeeded: {first}");
        }
    }
    let cpu_before = shared.cpu_since.lock().ok().and_then(|c| *c);
    let measured_from = shared
        .measuring_since
        .lock()
        .ok()
        .and_then(|s| *s)
        .unwrap_or(started);
    let (until, cpu_after) = shared
        .measured_until
        .lock()
        .ok()
        .and_then(|u| *u)
        .unwrap_or_else(|| (Instant::now(), a.server_pid.and_then(cpu_seconds)));
    let elapsed = until.duration_since(measured_from);
    extra.insert(
        "setup_seconds".into(),
        json!(measured_from.duration_since(started).as_secs_f64()),
    );
    // The window in seconds since the epoch, for a script that samples the
    // servers' CPU itself (bench/sessions.py).
    extra
        .entry("window_unix")
        .or_insert_with(|| json!([expiries::unix(measured_from), expiries::unix(until)]));
    bar.finish_and_clear();
    if let (Some(pid), Some(before)) = (a.server_pid, cpu_before) {
        if let Some(after) = cpu_after {
            let ops = shared.ops.load(Ordering::Relaxed).max(1);
            extra.insert("server_cpu_seconds".into(), json!(after - before));
            extra.insert(
                "server_cpu_share".into(),
                json!((after - before) / elapsed.as_secs_f64()),
            );
            extra.insert(
                "server_cpu_us_per_op".into(),
                json!((after - before) * 1e6 / ops as f64),
            );
        }
        if let Some(rss) = rss_bytes(pid) {
            extra.insert("server_rss_bytes".into(), json!(rss));
        }
    }
    report(&a, &shared, elapsed, extra);
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client done with its setup before the others counts nothing until
    /// the window opens, and nothing after it closes.
    #[test]
    fn only_operations_inside_the_measured_window_count() {
        let shared = Shared::new(None).expect("shared");
        let mut local = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram");
        shared.done(&mut local, 100);
        shared.done(&mut local, 100);
        assert_eq!(shared.ops.load(Ordering::Relaxed), 0, "before the window");
        shared.begin();
        shared.done(&mut local, 100);
        assert_eq!(shared.ops.load(Ordering::Relaxed), 1);
        shared.stop.store(true, Ordering::Relaxed);
        shared.done(&mut local, 100);
        assert_eq!(shared.ops.load(Ordering::Relaxed), 1, "after the window");
        assert_eq!(local.len(), 1, "the latencies likewise");
    }
}
