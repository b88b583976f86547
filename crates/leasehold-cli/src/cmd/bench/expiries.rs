//! `sessions --stop-renewing`: a watch on the sessions' keys, and how each
//! expiry came against its lease's last renewal.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use hdrhistogram::Histogram;
use leasehold_proto::v1 as pb;
use serde_json::json;
use tokio::time::Instant;

use super::sessions::{leasehold_code, RETRY};
use super::workloads::Grpc;

/// The table's clock counts whole milliseconds: a renewal is stamped with
/// the millisecond it arrived in, so its lease may end up to this much
/// before a TTL after the renewal was sent (inside every client's margin).
const TABLE_RESOLUTION: Duration = Duration::from_millis(1);

/// How long past the last renewal's TTL `--stop-renewing` waits for the
/// expiries it has not seen.
const EXPIRY_GRACE: Duration = Duration::from_secs(5);

/// How the expiries seen came against a TTL after each lease's last
/// renewal was sent.
#[derive(Debug)]
struct Judged {
    /// How long after it each came, in microseconds.
    late: Histogram<u64>,
    /// Before it by more than [`TABLE_RESOLUTION`]: a broken promise.
    early: u64,
    /// Before it, inside [`TABLE_RESOLUTION`].
    within: u64,
    /// The most any came before it.
    earliest: Duration,
    /// Expiries of leases with no renewal on record.
    unknown: u64,
}

fn judge(seen: &[(u64, Instant)], renewed: &HashMap<u64, Instant>, ttl: Duration) -> Judged {
    let mut judged = Judged {
        late: Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("histogram"),
        early: 0,
        within: 0,
        earliest: Duration::ZERO,
        unknown: 0,
    };
    for (lease, at) in seen {
        let Some(sent) = renewed.get(lease) else {
            judged.unknown += 1;
            continue;
        };
        let due = *sent + ttl;
        if *at < due {
            judged.earliest = judged.earliest.max(due - *at);
            if due - *at > TABLE_RESOLUTION {
                judged.early += 1;
            } else {
                judged.within += 1;
            }
        } else {
            let _ = judged.late.record((*at - due).as_micros().max(1) as u64);
        }
    }
    judged
}

/// With `--stop-renewing`: each session's expiry, as a watch on the
/// sessions' keys saw it.
pub(super) struct Expiries {
    /// (lease, when its key's `EXPIRED` event arrived).
    seen: Arc<Mutex<Vec<(u64, Instant)>>>,
    /// How often the watch broke (a watcher that falls behind a burst of
    /// events is cut off) and was made again.
    broken: Arc<AtomicU64>,
    watcher: tokio::task::JoinHandle<()>,
    client: Grpc,
    prefix: String,
}

impl Expiries {
    pub(super) async fn watch(mut client: Grpc, prefix: &str) -> anyhow::Result<Self> {
        let prefix = format!("{prefix}/");
        let request = pb::WatchRequest {
            prefix: prefix.clone(),
            ..Default::default()
        };
        let mut stream = client
            .watch(request)
            .await
            .context("watch the sessions' keys")?
            .into_inner();
        let (seen, broken) = (
            Arc::new(Mutex::new(Vec::new())),
            Arc::new(AtomicU64::new(0)),
        );
        let (into, breaks, mut again, key) =
            (seen.clone(), broken.clone(), client.clone(), prefix.clone());
        let watcher = tokio::spawn(async move {
            // Where to resume: after the last event seen, while the node
            // still has what followed it, else from now (what is missed
            // is found by a listing at the end).
            let mut last: Option<(u64, u32)> = None;
            loop {
                match stream.message().await {
                    Ok(Some(event)) => {
                        last = Some((event.index, event.seq));
                        if event.kind == pb::lock_event::Kind::Expired as i32 {
                            if let Ok(mut seen) = into.lock() {
                                seen.push((event.lease_id, Instant::now()));
                            }
                        }
                        continue;
                    }
                    Ok(None) | Err(_) => breaks.fetch_add(1, Ordering::Relaxed),
                };
                loop {
                    let resume = pb::WatchRequest {
                        prefix: key.clone(),
                        after_index: last.map(|(index, _)| index),
                        after_seq: last.map(|(_, seq)| seq),
                    };
                    match again.watch(resume).await {
                        Ok(s) => {
                            stream = s.into_inner();
                            break;
                        }
                        Err(s) if leasehold_code(&s) == Some("watch_behind") => last = None,
                        Err(_) => tokio::time::sleep(RETRY).await,
                    }
                }
            }
        });
        Ok(Self {
            seen,
            broken,
            watcher,
            client,
            prefix,
        })
    }

    /// How many of the sessions' keys are still held.
    async fn still_held(&mut self) -> anyhow::Result<u64> {
        let (mut held, mut after) = (0, String::new());
        loop {
            let page = pb::ListLocksRequest {
                prefix: self.prefix.clone(),
                limit: 10_000,
                start_after: after,
                held_only: true,
            };
            let page = self.client.list_locks(page).await?.into_inner();
            held += page.locks.len() as u64;
            match page.next_start_after {
                Some(next) => after = next,
                None => return Ok(held),
            }
        }
    }

    fn count(&self) -> u64 {
        self.seen.lock().map_or(0, |s| s.len() as u64)
    }

    /// Waits until every granted session's expiry was seen (or a TTL and
    /// [`EXPIRY_GRACE`] have passed), then says how each came against its
    /// lease's last renewal answered: the server may end a lease no sooner
    /// than a TTL after that renewal was sent, less [`TABLE_RESOLUTION`]
    /// (an expiry seen before is `early`: a broken promise; one inside the
    /// resolution is counted apart), and `late_ms` is how long after that
    /// its expiry arrived (an upper bound on how late the server ended it).
    pub(super) async fn finish(
        mut self,
        renewed: impl FnOnce() -> HashMap<u64, Instant>,
        granted: u64,
        ttl: Duration,
    ) -> serde_json::Value {
        let stopped = Instant::now();
        let until = stopped + ttl + EXPIRY_GRACE;
        while Instant::now() < until && self.count() < granted {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.watcher.abort();
        let held = self.still_held().await.ok();
        let renewed = renewed();
        let seen = match self.seen.lock() {
            Ok(seen) => seen.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        let Judged {
            late,
            early,
            within,
            earliest,
            unknown,
        } = judge(&seen, &renewed, ttl);
        let ms = |q: f64| late.value_at_quantile(q) as f64 / 1000.0;
        let first = seen.iter().map(|(_, t)| *t).min();
        let last = seen.iter().map(|(_, t)| *t).max();
        json!({
            "stopped_unix": unix(stopped.into_std()),
            "expired": seen.len(),
            "not_expired": granted.saturating_sub(seen.len() as u64),
            "still_held": held,
            "watch_broken": self.broken.load(Ordering::Relaxed),
            "early": early,
            "early_within_resolution": within,
            "earliest_ms": earliest.as_secs_f64() * 1000.0,
            "without_a_renewal_seen": unknown,
            "late_ms": { "p50": ms(0.5), "p99": ms(0.99), "max": late.max() as f64 / 1000.0 },
            "first_unix": first.map(|t| unix(t.into_std())),
            "last_unix": last.map(|t| unix(t.into_std())),
        })
    }
}

/// `t` in seconds since the epoch.
pub(super) fn unix(t: std::time::Instant) -> f64 {
    let (now, wall) = (std::time::Instant::now(), std::time::SystemTime::now());
    let then = match now.checked_duration_since(t) {
        Some(ago) => wall.checked_sub(ago),
        None => wall.checked_add(t.duration_since(now)),
    };
    then.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0.0, |d| d.as_secs_f64())
}

pub(super) fn unix_now() -> f64 {
    unix(std::time::Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expiry_before_a_ttl_after_the_renewal_was_sent_is_early() {
        let (t0, ttl) = (Instant::now(), Duration::from_secs(30));
        let renewed = HashMap::from([(1, t0), (2, t0), (3, t0), (4, t0)]);
        let ms = Duration::from_millis;
        let seen = [
            (1, t0 + ttl + ms(20)),
            (2, t0 + ttl - ms(5)),
            (3, t0 + ttl - Duration::from_micros(300)),
            (4, t0 + ttl + ms(40)),
            (9, t0 + ttl),
        ];
        let judged = judge(&seen, &renewed, ttl);
        assert_eq!((judged.early, judged.within, judged.unknown), (1, 1, 1));
        assert_eq!(judged.earliest, ms(5));
        assert_eq!(judged.late.len(), 2);
        assert!(judged.late.max() >= 39_900 && judged.late.max() <= 40_100);
    }
}
