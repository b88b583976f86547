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
    // Listening before the wait, and before the fence is printed: ctrl-c
    // while waiting ends the wait, and a script that reads the fence and
    // sends SIGINT at once gets a release, not a killed process. The
    // caller ends the session lease on every path (see `cmd::using`).
    let mut term = signal(SignalKind::terminate()).context("listen for SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("listen for SIGINT")?;
    let opts = LockOptions::default().ttl(ttl);
    let taking = async {
        match wait {
            Some(w) if !w.is_zero() => client.acquire(key, opts.wait(w)).await,
            _ => client.try_acquire(key, opts).await,
        }
    };
    let result = tokio::select! {
        result = taking => result,
        _ = interrupt.recv() => return Ok(super::exit_by_signal(libc::SIGINT)),
        _ = term.recv() => return Ok(super::exit_by_signal(libc::SIGTERM)),
    };
    let lease = match result {
        Ok(lease) => lease,
        Err(e @ (Error::Held { .. } | Error::LockDelayed { .. } | Error::Timeout { .. })) => {
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
    let token = lease.fence().unwrap_or(0);
    tokio::select! {
        _ = lease.lost() => {
            eprintln!("leasehold: lease on {key} lost: {}", lease.lost_reason());
            return Ok(EXIT_LOST);
        }
        why = ended_elsewhere(client, key, token), if lease.fence().is_some() => {
            eprintln!("leasehold: {why}");
            drop(lease);
            return Ok(EXIT_LOST);
        }
        _ = interrupt.recv() => {}
        _ = term.recv() => {}
    }
    lease
        .release()
        .await
        .with_context(|| format!("release {key}"))?;
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
