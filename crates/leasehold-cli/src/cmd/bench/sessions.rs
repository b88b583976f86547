//! The `sessions` workloads: leases each holding a lock, renewed on
//! schedule, together (as the Rust client renews) or a call each. A
//! connection follows the leader when its node stops answering (a
//! failover); with `--stop-renewing`, every session stops renewing when the
//! window ends and the run watches each one expire.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use leasehold::MAX_RENEWALS_PER_CALL;
use leasehold_proto::v1 as pb;
use serde_json::json;

use super::expiries::{unix, unix_now, Expiries};
use super::stats::rss_bytes;
use super::workloads::{grpc, Grpc};
use super::{run_then_join, Args, Shared};

/// How soon a renewal whose call failed without an answer about its lease
/// (its node gone, or no longer leading) is sent again, to whichever node
/// leads by then.
pub(super) const RETRY: Duration = Duration::from_millis(50);

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

/// A renewal waiting in a [`Schedule`]: when it goes, its lease, and the
/// time its latency counts from (when it was first due: a renewal sent
/// again after a failed call counts the wait).
type Pending = (tokio::time::Instant, u64, tokio::time::Instant);

/// One connection's sessions by the time their next renewal is due, and
/// a wake-up for its sender when one goes back in.
#[derive(Default)]
struct Schedule {
    due: Mutex<BinaryHeap<Reverse<Pending>>>,
    changed: tokio::sync::Notify,
    /// With `--stop-renewing`: when each lease's last renewal that was
    /// answered (or its grant) was sent. The server ends it no sooner than
    /// a TTL after that.
    renewed: Option<Mutex<HashMap<u64, tokio::time::Instant>>>,
}

impl Schedule {
    fn new(track: bool) -> Self {
        Self {
            renewed: track.then(Mutex::default),
            ..Self::default()
        }
    }

    /// Puts `lease` back, due at `due`; a renewal that failed keeps the
    /// time it was first due in `since`.
    fn push(&self, due: tokio::time::Instant, lease: u64, since: tokio::time::Instant) {
        if let Ok(mut heap) = self.due.lock() {
            heap.push(Reverse((due, lease, since)));
        }
        self.changed.notify_one();
    }

    /// Notes that the renewals of `leases` sent at `sent` were answered.
    fn renewed(&self, sent: tokio::time::Instant, leases: impl IntoIterator<Item = u64>) {
        if let Some(Ok(mut renewed)) = self.renewed.as_ref().map(|r| r.lock()) {
            for lease in leases {
                renewed.insert(lease, sent);
            }
        }
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
    fn next(&self, now: tokio::time::Instant) -> Result<Pending, Option<tokio::time::Instant>> {
        let Ok(mut heap) = self.due.lock() else {
            return Err(None);
        };
        match heap.peek() {
            Some(Reverse((due, _, _))) if *due <= now => {
                heap.pop().map(|Reverse(next)| next).ok_or(None)
            }
            Some(Reverse((due, _, _))) => Err(Some(*due)),
            None => Err(None),
        }
    }
}

/// A connection to the node that leads, made again to whichever node leads
/// by then when a call on it fails without an answer (as a client follows
/// a failover).
struct Link {
    args: Args,
    /// The connection, and how many times it was made again.
    current: Mutex<(u64, Grpc)>,
    /// Held while the leader is looked for, so one failed call looks and the
    /// others wait for what it found.
    finding: tokio::sync::Mutex<()>,
}

impl Link {
    async fn new(a: &Args) -> anyhow::Result<Arc<Self>> {
        Ok(Arc::new(Self {
            args: a.clone(),
            current: Mutex::new((0, grpc(a).await?)),
            finding: tokio::sync::Mutex::new(()),
        }))
    }

    fn get(&self) -> (u64, Grpc) {
        match self.current.lock() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// A call on connection `seen` failed: connects to the node that leads
    /// now, unless another failed call has already, trying for at most
    /// `give_up`.
    async fn follow(&self, seen: u64, give_up: Duration) {
        let _one = self.finding.lock().await;
        if self.get().0 != seen {
            return;
        }
        let until = tokio::time::Instant::now() + give_up;
        while tokio::time::Instant::now() < until {
            // A peer that drops packets rather than refusing holds a
            // connect up: bounded by what is left.
            if let Ok(Ok(client)) = tokio::time::timeout_at(until, grpc(&self.args)).await {
                if let Ok(mut current) = self.current.lock() {
                    *current = (seen + 1, client);
                }
                return;
            }
            tokio::time::sleep(RETRY).await;
        }
    }
}

/// What a `sessions` connection renews with.
struct Connection {
    link: Arc<Link>,
    schedule: Arc<Schedule>,
    /// How often each lease renews: a third of its TTL.
    period: Duration,
    ttl: Duration,
    shared: Arc<Shared>,
    counts: Arc<SessionCounts>,
}

impl Connection {
    /// Its parts, each to be cloned into the calls it spawns.
    fn parts(
        self,
    ) -> (
        Arc<Link>,
        Arc<Schedule>,
        Duration,
        Duration,
        Arc<Shared>,
        Arc<SessionCounts>,
    ) {
        (
            self.link,
            self.schedule,
            self.period,
            self.ttl,
            self.shared,
            self.counts,
        )
    }
}

/// A connection's renewal latencies, in microseconds.
fn latencies() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram")
}

/// Adds a connection's latencies to the run's. Answers still on their way
/// end after the window: they do not count (see `Shared::done`), so
/// nothing waits for them.
fn record(shared: &Shared, local: &Mutex<Histogram<u64>>) {
    let mut local = match local.lock() {
        Ok(local) => local.clone(),
        Err(poisoned) => poisoned.into_inner().clone(),
    };
    shared.record(&mut local);
}

/// A `sessions` connection renewing by the Rust client's rule: a call
/// leaves when the first renewal waiting is due and takes every renewal
/// due within [`leasehold::keeper::early`] of now, as one `KeepAliveMany`;
/// each call goes on its own.
async fn renew_together(connection: Connection, granter: tokio::task::JoinHandle<()>) {
    let (link, schedule, period, ttl, shared, counts) = connection.parts();
    let local = Arc::new(Mutex::new(latencies()));
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
        // A renewal sent again after a failed call was counted as due the
        // first time.
        let first = due.iter().filter(|(at, _, since)| at == since).count();
        counts.sent(&shared, first);
        let (link, schedule, shared, counts, local) = (
            link.clone(),
            schedule.clone(),
            shared.clone(),
            counts.clone(),
            local.clone(),
        );
        tokio::spawn(async move {
            let request = pb::KeepAliveManyRequest {
                lease_ids: due.iter().map(|(_, lease, _)| *lease).collect(),
            };
            let (connection, mut client) = link.get();
            let sent = tokio::time::Instant::now();
            let answer = tokio::time::timeout(ttl, client.keep_alive_many(request)).await;
            let failed = match answer {
                Ok(Ok(answer)) if answer.get_ref().renewals.len() == due.len() => {
                    let renewals = answer.into_inner().renewals;
                    let Ok(mut local) = local.lock() else { return };
                    let mut renewed = Vec::with_capacity(due.len());
                    for ((_, lease, since), renewal) in due.into_iter().zip(renewals) {
                        // The next is due a period after this one was first.
                        let next = since + period;
                        match (renewal.renewed, renewal.error) {
                            (Some(answer), _) => {
                                if answer.key_count == Some(0) {
                                    counts.without_lock.fetch_add(1, Ordering::Relaxed);
                                }
                                shared.done(&mut local, since.elapsed().as_micros() as u64);
                                renewed.push(lease);
                                schedule.push(next, lease, next);
                            }
                            (None, Some(e))
                                if matches!(
                                    e.code.as_str(),
                                    "lease_expired" | "lease_not_found"
                                ) =>
                            {
                                counts.lost.fetch_add(1, Ordering::Relaxed);
                            }
                            (None, e) => {
                                shared.status(&tonic::Status::unknown(format!(
                                    "renewal refused: {e:?}"
                                )));
                                schedule.push(next, lease, next);
                            }
                        }
                    }
                    schedule.renewed(sent, renewed);
                    return;
                }
                Ok(Ok(_)) => {
                    tonic::Status::unknown("an answer with another number of renewals than asked")
                }
                Ok(Err(s)) => s,
                Err(_) => tonic::Status::deadline_exceeded("renewals: no answer within the TTL"),
            };
            // No answer about any of them: to the leader, and again.
            shared.status(&failed);
            if worth_following(&failed) {
                link.follow(connection, ttl).await;
            }
            let again = tokio::time::Instant::now() + RETRY;
            for (_, lease, since) in due {
                schedule.push(again, lease, since);
            }
        });
    }
    granter.abort();
    record(&shared, &local);
}

/// A `sessions-each` connection: a `KeepAlive` call per renewal due.
async fn renew_each(
    connection: Connection,
    in_flight: Arc<tokio::sync::Semaphore>,
    granter: tokio::task::JoinHandle<()>,
) {
    let (link, schedule, period, ttl, shared, counts) = connection.parts();
    let local = Arc::new(Mutex::new(latencies()));
    while !shared.stop.load(Ordering::Relaxed) {
        let now = tokio::time::Instant::now();
        // Every renewal due by now, in due order; each goes back in,
        // due a period after it was due.
        let (due, lease, since) = match schedule.next(now) {
            Ok(next) => next,
            Err(wake) => {
                schedule.nap(now, wake).await;
                continue;
            }
        };
        counts.sent(&shared, usize::from(due == since));
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            counts.skipped.fetch_add(1, Ordering::Relaxed);
            schedule.push(since + period, lease, since + period);
            continue;
        };
        let (link, shared, counts, local, schedule) = (
            link.clone(),
            shared.clone(),
            counts.clone(),
            local.clone(),
            schedule.clone(),
        );
        tokio::spawn(async move {
            let (connection, mut client) = link.get();
            let sent = tokio::time::Instant::now();
            let call = client.keep_alive(pb::KeepAliveRequest { lease_id: lease });
            let answer = tokio::time::timeout(ttl, call).await;
            drop(permit);
            let failed = match answer {
                Ok(Ok(answer)) => {
                    if answer.into_inner().key_count == Some(0) {
                        counts.without_lock.fetch_add(1, Ordering::Relaxed);
                    }
                    if let Ok(mut local) = local.lock() {
                        shared.done(&mut local, since.elapsed().as_micros() as u64);
                    }
                    schedule.renewed(sent, [lease]);
                    schedule.push(since + period, lease, since + period);
                    return;
                }
                Ok(Err(s)) if session_ended(&s) => {
                    counts.lost.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Ok(Err(s)) => s,
                Err(_) => tonic::Status::deadline_exceeded("renewal: no answer within the TTL"),
            };
            shared.status(&failed);
            if worth_following(&failed) {
                link.follow(connection, ttl).await;
            }
            schedule.push(tokio::time::Instant::now() + RETRY, lease, since);
        });
    }
    granter.abort();
    record(&shared, &local);
}

/// Whether a failed call may be the node's failing or no longer leading
/// (so another node may answer), rather than about the call itself.
fn worth_following(s: &tonic::Status) -> bool {
    use tonic::Code;
    leasehold_code(s) == Some("not_leader")
        || !matches!(
            s.code(),
            Code::InvalidArgument
                | Code::PermissionDenied
                | Code::Unauthenticated
                | Code::ResourceExhausted
                | Code::NotFound
                | Code::AlreadyExists
                | Code::OutOfRange
        )
}

/// The `leasehold-code` a failed call carries, if any.
pub(super) fn leasehold_code(s: &tonic::Status) -> Option<&str> {
    s.metadata()
        .get("leasehold-code")
        .and_then(|v| v.to_str().ok())
}

/// Whether a failed renewal says the session is gone.
fn session_ended(s: &tonic::Status) -> bool {
    matches!(leasehold_code(s), Some("lease_expired" | "lease_not_found"))
        || s.code() == tonic::Code::NotFound
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
    let mut schedules = Vec::new();
    let mut links = Vec::new();
    for c in 0..connections {
        let link = Link::new(a).await?;
        let schedule = Arc::new(Schedule::new(a.stop_renewing));
        schedules.push(schedule.clone());
        links.push(link.clone());
        // Grants this connection's share (session g when g % connections
        // == c), each with its lock, while the sender below keeps the ones
        // granted so far alive.
        let granter = {
            let (mut client, shared, schedule, prefix, granting, counts) = (
                link.get().1,
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
                    schedule.renewed(sent, [lease]);
                    schedule.push(sent + period, lease, sent + period);
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
        let connection = Connection {
            link,
            schedule,
            period,
            ttl,
            shared: shared.clone(),
            counts: counts.clone(),
        };
        tasks.push(if together {
            tokio::spawn(renew_together(connection, granter))
        } else {
            tokio::spawn(renew_each(connection, in_flight.clone(), granter))
        });
    }
    let setup = Instant::now();
    while granting.load(Ordering::SeqCst) > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let grant_seconds = setup.elapsed().as_secs_f64();
    let rss_after = a.server_pid.and_then(rss_bytes);
    // Expiries are watched from before the last renewal goes.
    let expiries = match (a.stop_renewing, links.first()) {
        (true, Some(link)) => Some(Expiries::watch(link.get().1, &prefix).await?),
        _ => None,
    };
    bar.set_message("renewing");
    // A caller that acts during the window (bench/sessions.py stops the
    // leader) goes by these lines.
    eprintln!("sessions: renewing from {:.3}", unix_now());
    run_then_join(a.duration, shared, bar, tasks).await?;
    if let Some(expiries) = expiries {
        eprintln!("sessions: stopped renewing at {:.3}", unix_now());
        bar.set_message("expiring");
        let granted = counts.granted.load(Ordering::Relaxed);
        // Read only once the expiries are in: a renewal answered after the
        // window counts.
        let renewed = || {
            let mut renewed = HashMap::new();
            for schedule in &schedules {
                if let Some(Ok(r)) = schedule.renewed.as_ref().map(|r| r.lock()) {
                    renewed.extend(r.iter().map(|(l, t)| (*l, *t)));
                }
            }
            renewed
        };
        extra.insert(
            "sessions_expiry".into(),
            expiries.finish(renewed, granted, ttl).await,
        );
    }
    // The window as it was, for rates and for a caller that samples the
    // server's CPU itself (bench/sessions.py): in seconds since the epoch.
    let since = shared.measuring_since.lock().ok().and_then(|s| *s);
    let until = shared
        .measured_until
        .lock()
        .ok()
        .and_then(|u| *u)
        .map(|(t, _)| t);
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
