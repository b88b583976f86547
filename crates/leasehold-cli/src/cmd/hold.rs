//! `leasehold acquire` and `leasehold release`.

use std::time::Duration;

use anyhow::Context;
use leasehold::{Client, Error, LockOptions};
use serde_json::json;
use tokio::signal::unix::{signal, SignalKind};

use crate::{EXIT_LOST, EXIT_NOT_ACQUIRED};

pub async fn acquire(
    client: &Client,
    key: &str,
    ttl: Duration,
    wait: Option<Duration>,
    as_json: bool,
) -> anyhow::Result<i32> {
    let opts = LockOptions::default().ttl(ttl);
    let result = match wait {
        Some(w) if !w.is_zero() => client.acquire(key, opts.wait(w)).await,
        _ => client.try_acquire(key, opts).await,
    };
    let lease = match result {
        Ok(lease) => lease,
        Err(e @ (Error::Held { .. } | Error::Timeout { .. })) => {
            eprintln!("leasehold: {e}");
            return Ok(EXIT_NOT_ACQUIRED);
        }
        Err(e) => return Err(e).with_context(|| format!("acquire {key}")),
    };
    let fence = lease.fence().map_or_else(String::new, |f| f.to_string());
    if as_json {
        println!("{}", json!({ "key": key, "fence": lease.fence() }));
    } else {
        println!("{fence}");
    }
    let mut term = signal(SignalKind::terminate()).context("listen for SIGTERM")?;
    tokio::select! {
        _ = lease.lost() => {
            eprintln!("leasehold: lease on {key} lost: {}", lease.lost_reason());
            return Ok(EXIT_LOST);
        }
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    lease
        .release()
        .await
        .with_context(|| format!("release {key}"))?;
    Ok(0)
}

pub async fn release(client: &Client, key: &str, fence: u64) -> anyhow::Result<i32> {
    client
        .release_by_fence(key, fence)
        .await
        .with_context(|| format!("release {key} with fence {fence}"))?;
    Ok(0)
}
