//! The `sessions` workloads: leases each holding a lock, renewed on
//! schedule, together (as the Rust client renews) or a call each.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use leasehold::MAX_RENEWALS_PER_CALL;
use leasehold_proto::v1 as pb;
use serde_json::json;

use super::stats::rss_bytes;
use super::workloads::{grpc, Grpc};
use super::{run_then_join, Args, Shared};

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
