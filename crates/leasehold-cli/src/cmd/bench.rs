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
//! - `hold`: leaseholdd only: grow to `--keys` held locks on one lease;
//!   reports the server's memory with `--server-pid`.
//! - `keep`: any backend: `--clients` clients hold `--keys` locks between them
//!   with `--ttl` for `--duration`, renewed the way each backend's client
//!   renews them; reports the server's CPU over that time (`--server-pid`,
//!   counting its child processes too) and how many locks were lost.
//!
//! Every client has its own connection (its own `Client`), as separate
//! processes would.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use leasehold::{Client, Error, LockOptions};
use leasehold_proto::v1 as pb;
use serde_json::json;

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Workload {
    Cycle,
    /// `cycle` on a semaphore of 5 permits per key: take a permit, give it back.
    Semaphore,
    /// `cycle` on a lock set of 3 random keys: take all three, release them.
    Lockset,
    Contended,
    Renew,
    Hold,
    Keep,
}

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
    pub json: bool,
}

/// What every client task records.
struct Shared {
    histogram: Mutex<Histogram<u64>>,
    errors: Mutex<BTreeMap<String, u64>>,
    ops: AtomicU64,
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
            ops: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            measuring_since: Mutex::new(None),
        }))
    }

    fn record(&self, local: &mut Histogram<u64>) {
        if let Ok(mut h) = self.histogram.lock() {
            let _ = h.add(&*local);
        }
        local.reset();
    }

    fn error(&self, e: &Error) {
        let kind = match e {
            Error::Held { .. } => "held",
            Error::Timeout { .. } => "timeout",
            Error::LeaseLost { .. } => "lease_lost",
            Error::StaleFence { .. } => "stale_fence",
            Error::InvalidArgument(_) => "invalid_argument",
            Error::Unavailable(_) => "unavailable",
            Error::OutcomeUnknown(_) => "outcome_unknown",
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
    if let Ok(mut since) = shared.measuring_since.lock() {
        *since = Some(start);
    }
    if let Ok(mut cpu) = shared.cpu_since.lock() {
        *cpu = shared.server_pid.and_then(cpu_seconds);
    }
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

async fn connect(a: &Args) -> anyhow::Result<Vec<Client>> {
    let (endpoint, clients) = (a.endpoint.as_str(), a.clients);
    let mut out = Vec::with_capacity(clients);
    for i in 0..clients {
        // One connection per client; PostgreSQL clients open one each too.
        let url = if endpoint.starts_with("postgres") && !endpoint.contains("pool=") {
            format!(
                "{endpoint}{}pool=1",
                if endpoint.contains('?') { '&' } else { '?' }
            )
        } else {
            endpoint.to_string()
        };
        let mut builder = Client::builder(&url)
            .holder(format!("bench-{i}"))
            .tls(a.tls.clone());
        if let Some(token) = &a.token {
            builder = builder.token(token);
        }
        out.push(
            builder
                .connect()
                .await
                .with_context(|| format!("connect client {i}"))?,
        );
    }
    Ok(out)
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
        Workload::Hold => hold(&a, &shared, &bar, &mut extra).await?,
        Workload::Keep => keep(&a, &shared, &bar, &mut extra).await?,
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

/// What a `cycle` takes each time.
#[derive(Clone, Copy)]
enum Shape {
    Lock,
    Permit,
    Set,
}

async fn cycle(
    a: &Args,
    shared: &Arc<Shared>,
    bar: &ProgressBar,
    shape: Shape,
) -> anyhow::Result<()> {
    let clients = connect(a).await?;
    let mut tasks = Vec::new();
    for client in clients {
        let (shared, keys, ttl) = (shared.clone(), a.keys.max(1), a.ttl);
        tasks.push(tokio::spawn(async move {
            let mut local = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram");
            let opts = LockOptions::default().ttl(ttl);
            let wait = opts.clone().wait(Duration::from_secs(30));
            while !shared.stop.load(Ordering::Relaxed) {
                let key = || format!("bench/{}", rand::random::<u64>() % keys);
                let t = Instant::now();
                let taken = match shape {
                    Shape::Lock => client.try_acquire(&key(), opts.clone()).await,
                    // Waits when 5 already hold the key, as a semaphore's user would.
                    Shape::Permit => {
                        let key = format!("bench/sem/{}", rand::random::<u64>() % keys);
                        client.acquire(&key, wait.clone().permits(5)).await
                    }
                    Shape::Set => {
                        let set = [key(), key(), key()];
                        let set: Vec<&str> = set.iter().map(String::as_str).collect();
                        client.acquire_set(&set, wait.clone()).await
                    }
                };
                match taken {
                    Ok(lease) => match lease.release().await {
                        Ok(()) => {
                            let _ = local.record(t.elapsed().as_micros() as u64);
                            shared.ops.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => shared.error(&e),
                    },
                    Err(e) => shared.error(&e),
                }
                if local.len() >= 1024 {
                    shared.record(&mut local);
                }
            }
            shared.record(&mut local);
            client.close().await;
        }));
    }
    run_then_join(a.duration, shared, bar, tasks).await
}

async fn contended(a: &Args, shared: &Arc<Shared>, bar: &ProgressBar) -> anyhow::Result<()> {
    let clients = connect(a).await?;
    // When the last holder began its release, in µs since `origin`.
    let origin = Instant::now();
    let released_at = Arc::new(AtomicU64::new(u64::MAX));
    let key = format!("bench/contended/{:x}", rand::random::<u32>());
    // Grants so far: a client that has released waits for this to move on.
    let (grants, _) = tokio::sync::watch::channel(0u64);
    let others = clients.len() > 1;
    let mut tasks = Vec::new();
    for client in clients {
        let (shared, released_at, key, ttl) =
            (shared.clone(), released_at.clone(), key.clone(), a.ttl);
        let (grants, mut grants_seen) = (grants.clone(), grants.subscribe());
        tasks.push(tokio::spawn(async move {
            let mut local = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram");
            let opts = LockOptions::default()
                .ttl(ttl)
                .wait(Duration::from_secs(30));
            while !shared.stop.load(Ordering::Relaxed) {
                match client.acquire(&key, opts.clone()).await {
                    Ok(lease) => {
                        let granted = origin.elapsed().as_micros() as u64;
                        let from = released_at.swap(u64::MAX, Ordering::SeqCst);
                        if from != u64::MAX && granted >= from {
                            let _ = local.record((granted - from).max(1));
                            shared.ops.fetch_add(1, Ordering::Relaxed);
                        }
                        let mut mine = 0;
                        grants.send_modify(|n| {
                            *n += 1;
                            mine = *n;
                        });
                        released_at.store(origin.elapsed().as_micros() as u64, Ordering::SeqCst);
                        if let Err(e) = lease.release().await {
                            shared.error(&e);
                        }
                        while others && !shared.stop.load(Ordering::Relaxed) {
                            tokio::select! {
                                _ = grants_seen.wait_for(|n| *n > mine) => break,
                                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                            }
                        }
                    }
                    Err(e) => shared.error(&e),
                }
            }
            shared.record(&mut local);
            client.close().await;
        }));
    }
    run_then_join(a.duration, shared, bar, tasks).await
}

/// Holds `--keys` locks across the clients for `--duration`. ops = locks
/// still held at the end; the figure that matters is the server's CPU.
async fn keep(
    a: &Args,
    shared: &Arc<Shared>,
    bar: &ProgressBar,
    extra: &mut serde_json::Map<String, serde_json::Value>,
) -> anyhow::Result<()> {
    let clients = connect(a).await?;
    let per_client = (a.keys as usize).div_ceil(a.clients.max(1));
    let run = rand::random::<u32>();
    let opts = LockOptions::default().ttl(a.ttl);
    let mut taking = Vec::new();
    for (i, client) in clients.into_iter().enumerate() {
        let (shared, opts) = (shared.clone(), opts.clone());
        taking.push(tokio::spawn(async move {
            let mut leases = Vec::with_capacity(per_client);
            for j in 0..per_client {
                match client
                    .try_acquire(&format!("bench/keep/{run:x}/{i}/{j}"), opts.clone())
                    .await
                {
                    Ok(lease) => leases.push(lease),
                    Err(e) => shared.error(&e),
                }
            }
            (client, leases)
        }));
    }
    let mut held = Vec::new();
    for t in taking {
        held.push(t.await?);
    }
    let taken: usize = held.iter().map(|(_, l)| l.len()).sum();
    run_for(a.duration, shared, bar).await;
    let live = held
        .iter()
        .flat_map(|(_, leases)| leases)
        .filter(|l| l.is_live())
        .count();
    shared.ops.store(live as u64, Ordering::Relaxed);
    extra.insert("locks_held".into(), json!(taken));
    extra.insert("locks_lost".into(), json!(taken - live));
    let mut releasing = Vec::new();
    for (client, leases) in held {
        releasing.push(tokio::spawn(async move {
            for lease in leases {
                let _ = lease.release().await;
            }
            client.close().await;
        }));
    }
    for t in releasing {
        t.await?;
    }
    Ok(())
}

/// Puts `authorization: Bearer <token>` on every gRPC call, if there is a token.
#[derive(Clone)]
struct Bearer(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Bearer {
    #[allow(clippy::result_large_err)]
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            r.metadata_mut().insert("authorization", value.clone());
        }
        Ok(r)
    }
}

type Grpc = pb::leasehold_client::LeaseholdClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Bearer>,
>;

async fn grpc(a: &Args) -> anyhow::Result<Grpc> {
    if !a.endpoint.starts_with("http") {
        bail!("this workload needs leaseholdd (an http:// endpoint)");
    }
    // These workloads call gRPC directly, so they go straight to the node
    // that leads (of a cluster's endpoints, `http://a,b,c`).
    let cluster = super::cluster::Target {
        url: a.endpoint.clone(),
        tls: a.tls.clone(),
        token: a.token.clone(),
    };
    let target = match super::cluster::addrs(&a.endpoint)?.as_slice() {
        [single] => single.clone(),
        _ => super::cluster::leader(&cluster).await?,
    };
    let scheme = cluster.scheme();
    let mut channel = tonic::transport::Channel::from_shared(format!("{scheme}://{target}"))
        .with_context(|| format!("endpoint {target}"))?;
    if scheme == "https" {
        let host = target.rsplit_once(':').map_or(target.as_str(), |(h, _)| h);
        channel = channel.tls_config(a.tls.grpc(host)?)?;
    }
    let bearer = match &a.token {
        Some(t) => Some(
            format!("Bearer {t}")
                .parse()
                .context("the token has characters a header cannot carry")?,
        ),
        None => None,
    };
    let channel = channel
        .connect()
        .await
        .with_context(|| format!("connect to {target}"))?;
    Ok(pb::leasehold_client::LeaseholdClient::with_interceptor(
        channel,
        Bearer(bearer),
    ))
}

async fn renew(a: &Args, shared: &Arc<Shared>, bar: &ProgressBar) -> anyhow::Result<()> {
    let per_client = (a.keys as usize / a.clients.max(1)).max(1);
    let mut tasks = Vec::new();
    for i in 0..a.clients {
        let mut c = grpc(a).await?;
        let mut leases = Vec::with_capacity(per_client);
        for _ in 0..per_client {
            let ttl_ms = a.ttl.as_millis() as u64;
            leases.push(
                c.grant(pb::GrantRequest {
                    ttl_ms,
                    holder: format!("bench-{i}"),
                    request_id: 0,
                })
                .await?
                .into_inner()
                .lease_id,
            );
        }
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move {
            let mut local = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram");
            for lease in leases.iter().cycle() {
                if shared.stop.load(Ordering::Relaxed) {
                    break;
                }
                let t = Instant::now();
                match c
                    .keep_alive(pb::KeepAliveRequest { lease_id: *lease })
                    .await
                {
                    Ok(_) => {
                        let _ = local.record(t.elapsed().as_micros() as u64);
                        shared.ops.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(s) => shared.error(&Error::Other(s.message().to_string())),
                }
            }
            shared.record(&mut local);
        }));
    }
    run_then_join(a.duration, shared, bar, tasks).await
}

async fn hold(
    a: &Args,
    shared: &Arc<Shared>,
    bar: &ProgressBar,
    extra: &mut serde_json::Map<String, serde_json::Value>,
) -> anyhow::Result<()> {
    let mut c = grpc(a).await?;
    let ttl_ms = a.ttl.as_millis() as u64;
    let lease = c
        .grant(pb::GrantRequest {
            ttl_ms,
            holder: "bench-hold".into(),
            request_id: 0,
        })
        .await?
        .into_inner()
        .lease_id;
    let rss_before = a.server_pid.and_then(rss_bytes);
    let next = Arc::new(AtomicU64::new(0));
    let prefix = format!("bench/hold/{:x}", rand::random::<u32>());
    bar.set_length(a.keys);
    let mut tasks = Vec::new();
    for _ in 0..a.clients {
        let mut c = grpc(a).await?;
        let (shared, next, prefix, total) = (shared.clone(), next.clone(), prefix.clone(), a.keys);
        tasks.push(tokio::spawn(async move {
            let mut local = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram");
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                let t = Instant::now();
                let req = pb::AcquireRequest {
                    lease_id: lease,
                    key: format!("{prefix}/{i}"),
                    ..Default::default()
                };
                match c.acquire(req).await {
                    Ok(_) => {
                        let _ = local.record(t.elapsed().as_micros() as u64);
                        shared.ops.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(s) => shared.error(&Error::Other(s.message().to_string())),
                }
            }
            shared.record(&mut local);
        }));
    }
    // Keep the one lease alive while growing.
    let keepalive = {
        let mut c = c.clone();
        let period = a.ttl / 3;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                let _ = c.keep_alive(pb::KeepAliveRequest { lease_id: lease }).await;
            }
        })
    };
    let start = Instant::now();
    while next.load(Ordering::Relaxed) < a.keys {
        tokio::time::sleep(Duration::from_millis(200)).await;
        bar.set_position(shared.ops.load(Ordering::Relaxed));
        bar.set_message(format!(
            "{:.0} locks/s",
            shared.ops.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
        ));
    }
    for t in tasks {
        t.await?;
    }
    if let (Some(pid), Some(before)) = (a.server_pid, rss_before) {
        if let Some(after) = rss_bytes(pid) {
            let held = shared.ops.load(Ordering::Relaxed).max(1);
            extra.insert("server_rss_before_bytes".into(), json!(before));
            extra.insert(
                "bytes_per_held_lock".into(),
                json!((after.saturating_sub(before)) as f64 / held as f64),
            );
        }
    }
    extra.insert("lease".into(), json!(lease));
    keepalive.abort();
    Ok(())
}

/// CPU seconds (user + system) of a process and every process below it, so
/// that a server made of several processes (PostgreSQL's backends) counts
/// whole. Children that already exited count through the parent's
/// cutime/cstime.
fn cpu_seconds(pid: u32) -> Option<f64> {
    // (pid, parent pid, own ticks, waited-for children's ticks) of every process.
    let mut table = Vec::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(p) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let f: Vec<u64> = rest
            .split_whitespace()
            .skip(1)
            .map(|v| v.parse().unwrap_or(0))
            .collect();
        // After the state: ppid is field 0; utime, stime, cutime, cstime are 10..=13.
        if f.len() > 13 {
            table.push((p, f[0] as u32, f[10] + f[11], f[12] + f[13]));
        }
    }
    let mut ticks = 0;
    let mut found = false;
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for &(child, parent, own, reaped) in &table {
            if child == p {
                found = true;
                ticks += own + reaped;
            }
            if parent == p {
                frontier.push(child);
            }
        }
    }
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    found.then(|| ticks as f64 / hz)
}

/// Resident memory of a process, in bytes.
fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

fn report(
    a: &Args,
    shared: &Shared,
    elapsed: Duration,
    extra: serde_json::Map<String, serde_json::Value>,
) {
    let h = shared
        .histogram
        .lock()
        .map(|h| h.clone())
        .unwrap_or_else(|e| e.into_inner().clone());
    let ops = shared.ops.load(Ordering::Relaxed);
    let errors = shared.errors.lock().map(|e| e.clone()).unwrap_or_default();
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let rate = ops as f64 / elapsed.as_secs_f64();
    let mut out = json!({
        "backend": a.endpoint.split("://").next().unwrap_or(""),
        "endpoint": a.endpoint,
        "workload": format!("{:?}", a.workload).to_lowercase(),
        "clients": a.clients,
        "seconds": elapsed.as_secs_f64(),
        "ops": ops,
        "ops_per_sec": rate,
        "latency_ms": { "p50": ms(0.5), "p90": ms(0.9), "p99": ms(0.99), "p999": ms(0.999), "max": h.max() as f64 / 1000.0 },
        "errors": errors,
    });
    if let Some(o) = out.as_object_mut() {
        o.extend(extra);
    }
    if a.json {
        println!("{out}");
        return;
    }
    println!(
        "{} {:?}, {} clients, {:.1}s",
        a.endpoint,
        a.workload,
        a.clients,
        elapsed.as_secs_f64()
    );
    println!("  {ops} ops, {rate:.0} ops/s");
    println!(
        "  latency ms: p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}",
        ms(0.5),
        ms(0.9),
        ms(0.99),
        ms(0.999),
        h.max() as f64 / 1000.0
    );
    if !errors.is_empty() {
        println!("  errors: {errors:?}");
    }
    for (k, v) in out.as_object().into_iter().flatten() {
        if k.starts_with("server_") || k == "bytes_per_held_lock" {
            println!("  {k}: {v}");
        }
    }
}
