//! `leasehold acquire` and `leasehold release`.

use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
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
        Err(e @ (Error::Held { .. } | Error::LockDelayed { .. } | Error::Timeout { .. })) => {
            eprintln!("leasehold: {e}");
            return Ok(EXIT_NOT_ACQUIRED);
        }
        Err(e) => return Err(e).with_context(|| format!("acquire {key}")),
    };
    // Listening before the fence is printed: a script that reads it and
    // sends SIGINT at once gets a release, not a killed process.
    let mut term = signal(SignalKind::terminate()).context("listen for SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("listen for SIGINT")?;
    let fence = lease.fence().map_or_else(String::new, |f| f.to_string());
    if as_json {
        println!("{}", json!({ "key": key, "fence": lease.fence() }));
    } else {
        println!("{fence}");
    }
    let token = lease.fence().unwrap_or(0);
    tokio::select! {
        _ = lease.lost() => {
            eprintln!("leasehold: lease on {key} lost: {}", lease.lost_reason());
            client.close().await;
            return Ok(EXIT_LOST);
        }
        why = ended_elsewhere(client, key, token), if lease.fence().is_some() => {
            eprintln!("leasehold: {why}");
            drop(lease);
            client.close().await;
            return Ok(EXIT_LOST);
        }
        _ = interrupt.recv() => {}
        _ = term.recv() => {}
    }
    let released = lease
        .release()
        .await
        .with_context(|| format!("release {key}"));
    // The session lease the lock hung off ends too, not at its TTL.
    client.close().await;
    released?;
    Ok(0)
}

/// Resolves, with what happened, once `key` is no longer held with
/// `fence` although this process did not release it: someone released it
/// by its token (`leasehold release`), revoked its lease, or it expired.
/// Follows the key's events, and after every (re)connect of the watch
/// checks the key once, so an end just before the watch began is seen too.
/// On a store that cannot watch, never resolves: the lease's own renewals
/// are all there is.
pub async fn ended_elsewhere(client: &Client, key: &str, fence: u64) -> String {
    const AGAIN: Duration = Duration::from_secs(1);
    loop {
        let mut events = match client.watch(key).await {
            Ok(events) => events,
            Err(Error::Unsupported { .. }) => return std::future::pending().await,
            Err(_) => {
                tokio::time::sleep(AGAIN).await;
                continue;
            }
        };
        if let Ok(locks) = client.status(key).await {
            let held = locks
                .iter()
                .any(|l| l.key == key && l.holders.iter().any(|(_, f)| *f == fence));
            if !held {
                return format!(
                    "lock on {key} lost: no longer held with fence {fence} (released or revoked by someone else, or expired)"
                );
            }
        }
        while let Some(event) = events.next().await {
            match event {
                Ok(e) if e.key == key && e.fence == fence => match e.kind.as_str() {
                    "released" => {
                        return format!(
                            "lock on {key} lost: fence {fence} was released, or its lease revoked, by someone else"
                        )
                    }
                    "expired" => return format!("lock on {key} lost: fence {fence} expired"),
                    _ => {}
                },
                Ok(_) => {}
                // The stream broke (a node stopped, a failover): watch again.
                Err(_) => break,
            }
        }
        tokio::time::sleep(AGAIN).await;
    }
}

pub async fn release(client: &Client, key: &str, fence: u64) -> anyhow::Result<i32> {
    client
        .release_by_fence(key, fence)
        .await
        .with_context(|| format!("release {key} with fence {fence}"))?;
    Ok(0)
}
