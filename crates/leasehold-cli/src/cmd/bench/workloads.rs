//! The workloads: each connects its clients and runs their loops until the
//! clock stops them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use leasehold::{Client, Error, LockOptions};
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
pub(super) struct Bearer(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Bearer {
    #[allow(clippy::result_large_err)]
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            r.metadata_mut().insert("authorization", value.clone());
        }
        Ok(r)
    }
}

pub(super) type Grpc = pb::leasehold_client::LeaseholdClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Bearer>,
>;

pub(super) async fn grpc(a: &Args) -> anyhow::Result<Grpc> {
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
