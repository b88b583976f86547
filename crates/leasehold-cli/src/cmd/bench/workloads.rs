//! The workloads: each connects its clients and runs their loops until the
//! clock stops them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use leasehold::{Client, Error, LockOptions, MAX_RENEWALS_PER_CALL};
use leasehold_proto::v1 as pb;
use serde_json::json;

use super::stats::rss_bytes;
use super::{run_for, run_then_join, Args, Shared};

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

/// What a `cycle` takes each time.
#[derive(Clone, Copy)]
pub(super) enum Shape {
    Lock,
    Permit,
    Set,
}

pub(super) async fn cycle(
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
                            shared.done(&mut local, t.elapsed().as_micros() as u64);
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

pub(super) async fn contended(
    a: &Args,
    shared: &Arc<Shared>,
    bar: &ProgressBar,
) -> anyhow::Result<()> {
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
                        shared.succeeded();
                        let granted = origin.elapsed().as_micros() as u64;
                        let from = released_at.swap(u64::MAX, Ordering::SeqCst);
                        if from != u64::MAX && granted >= from {
                            shared.done(&mut local, granted - from);
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
pub(super) async fn keep(
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
                    Ok(lease) => {
                        shared.succeeded();
                        leases.push(lease);
                    }
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
    let cluster = crate::cmd::cluster::Target {
        url: a.endpoint.clone(),
        tls: a.tls.clone(),
        token: a.token.clone(),
    };
    let target = match crate::cmd::cluster::addrs(&a.endpoint)?.as_slice() {
        [single] => single.clone(),
        _ => crate::cmd::cluster::leader(&cluster).await?,
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

pub(super) async fn renew(a: &Args, shared: &Arc<Shared>, bar: &ProgressBar) -> anyhow::Result<()> {
    let per_client = (a.keys as usize / a.clients.max(1)).max(1);
    let ttl_ms = a.ttl.as_millis() as u64;
    // Every client grants its leases at once; the window opens when all
    // have (renewals before it are not counted: see `Shared::done`).
    let granted = Arc::new(tokio::sync::Barrier::new(a.clients + 1));
    let mut tasks = Vec::new();
    for i in 0..a.clients {
        let mut c = grpc(a).await?;
        let (shared, granted) = (shared.clone(), granted.clone());
        tasks.push(tokio::spawn(async move {
            let mut leases = Vec::with_capacity(per_client);
            for _ in 0..per_client {
                let grant = pb::GrantRequest {
                    ttl_ms,
                    holder: format!("bench-{i}"),
                    request_id: 0,
                };
                match c.grant(grant).await {
                    Ok(answer) => {
                        shared.succeeded();
                        leases.push(answer.into_inner().lease_id);
                    }
                    Err(s) => shared.error(&Error::Other(s.message().to_string())),
                }
            }
            granted.wait().await;
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
                    Ok(_) => shared.done(&mut local, t.elapsed().as_micros() as u64),
                    Err(s) => shared.error(&Error::Other(s.message().to_string())),
                }
            }
            shared.record(&mut local);
        }));
    }
    granted.wait().await;
    run_then_join(a.duration, shared, bar, tasks).await
}

pub(super) async fn hold(
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
    let mut connections = Vec::with_capacity(a.clients);
    for _ in 0..a.clients {
        connections.push(grpc(a).await?);
    }
    // Growth is what is measured: every grant from here on counts.
    shared.begin();
    let mut tasks = Vec::new();
    for mut c in connections {
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
                        shared.done(&mut local, t.elapsed().as_micros() as u64);
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

/// Renewals sent and not yet answered, over all of a `sessions` run's
/// connections: past it a renewal is not sent (`renewals_not_sent`), so a
/// load generator that falls behind says so instead of piling up calls.
const MAX_IN_FLIGHT: usize = 50_000;

/// The longest a `sessions` connection sleeps between looks at its
/// schedule when nothing wakes it sooner.
const SESSION_NAP: Duration = Duration::from_millis(100);

/// What `sessions` counts beside the shared figures.
#[derive(Default)]
struct SessionCounts {
    /// Sessions granted (with their lock taken, or tried).
    granted: AtomicU64,
    /// Renewals whose due time fell inside the measured window.
    due: AtomicU64,
    /// Sessions the server had ended (`lease_expired`, `lease_not_found`)
    /// when they renewed on schedule.
    lost: AtomicU64,
    /// Renewals answered with a lease that no longer holds its lock.
    without_lock: AtomicU64,
    /// Renewals not sent: `MAX_IN_FLIGHT` were waiting for answers.
    skipped: AtomicU64,
    /// Renewal calls sent inside the measured window (one renews many
    /// when they go together).
    calls: AtomicU64,
}

impl SessionCounts {
    /// Counts a call renewing `renewals` leases, if inside the window.
    fn sent(&self, shared: &Shared, renewals: usize) {
        if shared.measuring.load(Ordering::Relaxed) {
            self.due.fetch_add(renewals as u64, Ordering::Relaxed);
            self.calls.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One connection's sessions by the time their next renewal is due, and
/// a wake-up for its sender when one goes back in.
#[derive(Default)]
struct Schedule {
    due: std::sync::Mutex<
        std::collections::BinaryHeap<std::cmp::Reverse<(tokio::time::Instant, u64)>>,
    >,
    changed: tokio::sync::Notify,
}

impl Schedule {
    fn push(&self, due: tokio::time::Instant, lease: u64) {
        if let Ok(mut heap) = self.due.lock() {
            heap.push(std::cmp::Reverse((due, lease)));
        }
        self.changed.notify_one();
    }

    /// Sleeps until `wake` (when the next renewal is due, if one is), at
    /// most [`SESSION_NAP`], or until a session goes back in.
    async fn nap(&self, now: tokio::time::Instant, wake: Option<tokio::time::Instant>) {
        let wake = wake.unwrap_or(now + SESSION_NAP).min(now + SESSION_NAP);
        tokio::select! {
            () = tokio::time::sleep_until(wake) => {}
            () = self.changed.notified() => {}
        }
    }

    /// The next renewal due by `now`, or when the next one is due.
    fn next(
        &self,
        now: tokio::time::Instant,
    ) -> Result<(tokio::time::Instant, u64), Option<tokio::time::Instant>> {
        let Ok(mut heap) = self.due.lock() else {
            return Err(None);
        };
        match heap.peek() {
            Some(std::cmp::Reverse((due, _))) if *due <= now => {
                heap.pop().map(|std::cmp::Reverse(next)| next).ok_or(None)
            }
            Some(std::cmp::Reverse((due, _))) => Err(Some(*due)),
            None => Err(None),
        }
    }
}

/// A `sessions` connection renewing by the Rust client's rule: a call
/// leaves when the first renewal waiting is due and takes every renewal
/// due within [`leasehold::keeper::early`] of now, as one `KeepAliveMany`;
/// each call goes on its own.
async fn renew_together(
    client: Grpc,
    schedule: Arc<Schedule>,
    period: Duration,
    ttl: Duration,
    shared: Arc<Shared>,
    counts: Arc<SessionCounts>,
    granter: tokio::task::JoinHandle<()>,
) {
    let local = Arc::new(std::sync::Mutex::new(
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram"),
    ));
    let early = leasehold::keeper::early(ttl);
    while !shared.stop.load(Ordering::Relaxed) {
        let now = tokio::time::Instant::now();
        let mut due = Vec::new();
        let mut wake = None;
        // Renewals due within the next `early` go now, with the one due:
        // a lease renews a little before its time rather than in a call
        // of its own a moment later.
        let by = now + early;
        while due.len() < MAX_RENEWALS_PER_CALL {
            match schedule.next(if due.is_empty() { now } else { by }) {
                Ok(next) => due.push(next),
                Err(next) => {
                    wake = next;
                    break;
                }
            }
        }
        if due.is_empty() {
            schedule.nap(now, wake).await;
            continue;
        }
        counts.sent(&shared, due.len());
        let (mut client, schedule, shared, counts, local) = (
            client.clone(),
            schedule.clone(),
            shared.clone(),
            counts.clone(),
            local.clone(),
        );
        tokio::spawn(async move {
            let request = pb::KeepAliveManyRequest {
                lease_ids: due.iter().map(|(_, lease)| *lease).collect(),
            };
            let answer = tokio::time::timeout(ttl, client.keep_alive_many(request)).await;
            let renewals = match answer {
                Ok(Ok(answer)) if answer.get_ref().renewals.len() == due.len() => {
                    answer.into_inner().renewals
                }
                Ok(Ok(_)) => {
                    shared.status(&tonic::Status::unknown(
                        "an answer with another number of renewals than asked",
                    ));
                    Vec::new()
                }
                Ok(Err(s)) => {
                    shared.status(&s);
                    Vec::new()
                }
                Err(_) => {
                    shared.status(&tonic::Status::deadline_exceeded(
                        "renewals: no answer within the TTL",
                    ));
                    Vec::new()
                }
            };
            if renewals.is_empty() {
                for (was_due, lease) in due {
                    schedule.push(was_due + period, lease);
                }
                return;
            }
            let Ok(mut local) = local.lock() else { return };
            for ((was_due, lease), renewal) in due.into_iter().zip(renewals) {
                match (renewal.renewed, renewal.error) {
                    (Some(renewed), _) => {
                        if renewed.key_count == Some(0) {
                            counts.without_lock.fetch_add(1, Ordering::Relaxed);
                        }
                        shared.done(&mut local, was_due.elapsed().as_micros() as u64);
                        schedule.push(was_due + period, lease);
                    }
                    (None, Some(e))
                        if matches!(e.code.as_str(), "lease_expired" | "lease_not_found") =>
                    {
                        counts.lost.fetch_add(1, Ordering::Relaxed);
                    }
                    (None, e) => {
                        shared.status(&tonic::Status::unknown(format!("renewal refused: {e:?}")));
                        schedule.push(was_due + period, lease);
                    }
                }
            }
        });
    }
    granter.abort();
    // Answers still on their way end after the window: they do not count.
    let mut local = match local.lock() {
        Ok(local) => local.clone(),
        Err(poisoned) => poisoned.into_inner().clone(),
    };
    shared.record(&mut local);
}

/// Whether a failed renewal says the session is gone.
fn session_ended(s: &tonic::Status) -> bool {
    let code = s
        .metadata()
        .get("leasehold-code")
        .and_then(|v| v.to_str().ok());
    matches!(code, Some("lease_expired" | "lease_not_found")) || s.code() == tonic::Code::NotFound
}

/// `--keys` sessions (leases), each holding one lock, renewed every third
/// of the TTL on schedule, as real holders renew: open loop, whether or not
/// earlier renewals have been answered. A session renews first a third of
/// the TTL after its grant, so the due times spread as the grants did. They
/// are multiplexed over `--clients` connections (as one process's leases
/// share its client's connection); with `--clients` equal to `--keys`, each
/// session has a connection of its own. A renewal's latency runs from when
/// it was due to its answer, so a server that falls behind shows it, not
/// only the time on the wire. The window opens once every session is
/// granted; a call waits at most a TTL for its answer.
pub(super) async fn sessions(
    a: &Args,
    shared: &Arc<Shared>,
    bar: &ProgressBar,
    extra: &mut serde_json::Map<String, serde_json::Value>,
    together: bool,
) -> anyhow::Result<()> {
    let total = a.keys.max(1);
    let connections = (a.clients.max(1) as u64).min(total);
    let (ttl, ttl_ms) = (a.ttl, a.ttl.as_millis() as u64);
    let period = a.ttl / 3;
    let rss_before = a.server_pid.and_then(rss_bytes);
    let prefix = format!("bench/sessions/{:x}", rand::random::<u32>());
    // Connections still granting their sessions.
    let granting = Arc::new(AtomicU64::new(connections));
    let counts = Arc::new(SessionCounts::default());
    let in_flight = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    bar.set_message("granting");
    let mut tasks = Vec::new();
    for c in 0..connections {
        let client = grpc(a).await?;
        let schedule = Arc::new(Schedule::default());
        // Grants this connection's share (session g when g % connections
        // == c), each with its lock, while the sender below keeps the ones
        // granted so far alive.
        let granter = {
            let (mut client, shared, schedule, prefix, granting, counts) = (
                client.clone(),
                shared.clone(),
                schedule.clone(),
                prefix.clone(),
                granting.clone(),
                counts.clone(),
            );
            tokio::spawn(async move {
                for g in (c..total).step_by(connections as usize) {
                    let grant = pb::GrantRequest {
                        ttl_ms,
                        holder: format!("bench-session-{g}"),
                        request_id: 0,
                    };
                    let sent = tokio::time::Instant::now();
                    let lease = match tokio::time::timeout(ttl, client.grant(grant)).await {
                        Ok(Ok(answer)) => {
                            shared.succeeded();
                            answer.into_inner().lease_id
                        }
                        Ok(Err(s)) => {
                            shared.status(&s);
                            continue;
                        }
                        Err(_) => {
                            shared.status(&tonic::Status::deadline_exceeded(
                                "grant: no answer within the TTL",
                            ));
                            continue;
                        }
                    };
                    counts.granted.fetch_add(1, Ordering::Relaxed);
                    schedule.push(sent + period, lease);
                    let lock = pb::AcquireRequest {
                        lease_id: lease,
                        key: format!("{prefix}/{g}"),
                        ..Default::default()
                    };
                    match tokio::time::timeout(ttl, client.acquire(lock)).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(s)) => shared.status(&s),
                        Err(_) => shared.status(&tonic::Status::deadline_exceeded(
                            "acquire: no answer within the TTL",
                        )),
                    }
                }
                granting.fetch_sub(1, Ordering::SeqCst);
            })
        };
        if together {
            tasks.push(tokio::spawn(renew_together(
                client,
                schedule,
                period,
                ttl,
                shared.clone(),
                counts.clone(),
                granter,
            )));
            continue;
        }
        let (shared, counts, in_flight) = (shared.clone(), counts.clone(), in_flight.clone());
        tasks.push(tokio::spawn(async move {
            let local = Arc::new(std::sync::Mutex::new(
                Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram"),
            ));
            while !shared.stop.load(Ordering::Relaxed) {
                let now = tokio::time::Instant::now();
                // Every renewal due by now, in due order; each goes back in,
                // due a period after it was due.
                let (due, lease) = match schedule.next(now) {
                    Ok(next) => next,
                    Err(wake) => {
                        schedule.nap(now, wake).await;
                        continue;
                    }
                };
                counts.sent(&shared, 1);
                let Ok(permit) = in_flight.clone().try_acquire_owned() else {
                    counts.skipped.fetch_add(1, Ordering::Relaxed);
                    schedule.push(due + period, lease);
                    continue;
                };
                let (mut client, shared, counts, local, schedule) = (
                    client.clone(),
                    shared.clone(),
                    counts.clone(),
                    local.clone(),
                    schedule.clone(),
                );
                tokio::spawn(async move {
                    let call = client.keep_alive(pb::KeepAliveRequest { lease_id: lease });
                    let answer = tokio::time::timeout(ttl, call).await;
                    drop(permit);
                    match answer {
                        Ok(Ok(answer)) => {
                            if answer.into_inner().key_count == Some(0) {
                                counts.without_lock.fetch_add(1, Ordering::Relaxed);
                            }
                            if let Ok(mut local) = local.lock() {
                                shared.done(&mut local, due.elapsed().as_micros() as u64);
                            }
                        }
                        Ok(Err(s)) if session_ended(&s) => {
                            counts.lost.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                        Ok(Err(s)) => shared.status(&s),
                        Err(_) => shared.status(&tonic::Status::deadline_exceeded(
                            "renewal: no answer within the TTL",
                        )),
                    }
                    schedule.push(due + period, lease);
                });
            }
            granter.abort();
            // Answers still on their way end after the window: they do not
            // count (see `Shared::done`), so nothing waits for them.
            let mut local = match local.lock() {
                Ok(local) => local.clone(),
                Err(poisoned) => poisoned.into_inner().clone(),
            };
            shared.record(&mut local);
        }));
    }
    let setup = Instant::now();
    while granting.load(Ordering::SeqCst) > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let grant_seconds = setup.elapsed().as_secs_f64();
    let rss_after = a.server_pid.and_then(rss_bytes);
    bar.set_message("renewing");
    run_then_join(a.duration, shared, bar, tasks).await?;
    // The window as it was, for rates and for a caller that samples the
    // server's CPU itself (bench/sessions.py): in seconds since the epoch.
    let since = shared.measuring_since.lock().ok().and_then(|s| *s);
    let until = shared
        .measured_until
        .lock()
        .ok()
        .and_then(|u| *u)
        .map(|(t, _)| t);
    let (now, wall) = (Instant::now(), std::time::SystemTime::now());
    let unix = |t: Instant| {
        wall.checked_sub(now.duration_since(t))
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0.0, |d| d.as_secs_f64())
    };
    let seconds = match (since, until) {
        (Some(since), Some(until)) => {
            extra.insert("window_unix".into(), json!([unix(since), unix(until)]));
            until.duration_since(since).as_secs_f64()
        }
        _ => a.duration.as_secs_f64(),
    };
    let granted = counts.granted.load(Ordering::Relaxed);
    let done = shared.ops.load(Ordering::Relaxed);
    let due = counts.due.load(Ordering::Relaxed);
    extra.insert("sessions".into(), json!(total));
    extra.insert("sessions_granted".into(), json!(granted));
    extra.insert("connections".into(), json!(connections));
    extra.insert("grant_seconds".into(), json!(grant_seconds));
    extra.insert("renewals_due_per_sec".into(), json!(due as f64 / seconds));
    extra.insert("renewals_done_per_sec".into(), json!(done as f64 / seconds));
    let calls = counts.calls.load(Ordering::Relaxed);
    extra.insert(
        "renewal_calls_per_sec".into(),
        json!(calls as f64 / seconds),
    );
    extra.insert(
        "renewals_per_call".into(),
        json!(due as f64 / calls.max(1) as f64),
    );
    extra.insert(
        "sessions_lost".into(),
        json!(counts.lost.load(Ordering::Relaxed)),
    );
    extra.insert(
        "renewals_without_their_lock".into(),
        json!(counts.without_lock.load(Ordering::Relaxed)),
    );
    extra.insert(
        "renewals_not_sent".into(),
        json!(counts.skipped.load(Ordering::Relaxed)),
    );
    if let (Some(before), Some(after)) = (rss_before, rss_after) {
        extra.insert(
            "server_rss_bytes_per_session".into(),
            json!(after.saturating_sub(before) as f64 / granted.max(1) as f64),
        );
    }
    Ok(())
}
