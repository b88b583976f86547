//! Prometheus metrics (`GET /metrics`, OpenMetrics text), named by the
//! Prometheus conventions: counters end in `_total`, durations are in
//! `_seconds`.
//!
//! | metric | type | what |
//! |---|---|---|
//! | `leasehold_requests_total{op, code}` | counter | calls by operation and outcome (`ok` or the error code) |
//! | `leasehold_request_duration_seconds{op}` | histogram | time to answer a call (an acquire's wait included) |
//! | `leasehold_lock_events_total{kind}` | counter | `acquired`, `released`, `expired` as applied here |
//! | `leasehold_connections` | gauge | open client connections |
//! | `leasehold_connections_refused_total` | counter | connections closed at once because the cap was reached |
//! | `leasehold_leases` | gauge | live leases |
//! | `leasehold_locks_held` | gauge | held locks |
//! | `leasehold_waiters` | gauge | acquires waiting in a key's queue |
//! | `leasehold_wait_seconds` | histogram | on the node that served it: how long an acquire that waited in the queue waited for its grant |
//! | `leasehold_log_fsync_seconds` | histogram | time of each fsync of the Raft log (one per append: an entry carries a batch of commands) |
//! | `leasehold_fence_next` | gauge | the token the next grant gets |
//! | `leasehold_raft_applied_index` | gauge | last applied log index |
//! | `leasehold_table_time_seconds` | gauge | the lock table's clock |
//! | `leasehold_is_leader` | gauge | 1 if this node leads |
//! | `leasehold_table_hash_mismatch` | gauge | 1 once this leader found members whose tables differ from its own |
//! | `leasehold_raft_term` | gauge | the current term |
//! | `leasehold_raft_last_log_index` | gauge | last log index on this node |
//! | `leasehold_raft_snapshot_index` | gauge | last index in this node's snapshot |
//! | `leasehold_leader_changes_total` | counter | times this node saw a new leader |
//! | `leasehold_raft_replication_lag{peer}` | gauge | on the leader: entries each member is behind |
//! | `leasehold_raft_snapshot_chunks_sent_total` | counter | snapshot chunks sent to peers (a member catching up from a snapshot) |
//! | `leasehold_raft_append_streams_total{transport}` | counter | on a leader: streams of appends opened to peers, `framed` or `grpc` (with peer certificates, or to a member of an earlier build) |
//!
//! Beside them, the process's own (`process_*`) and the build's
//! (`leasehold_build_info`): see [`process`].

mod process;

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use leasehold_core::Event;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    op: &'static str,
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

fn duration_histogram() -> Histogram {
    // 100 µs to ~3.3 s.
    Histogram::new(exponential_buckets(0.000_1, 2.0, 16))
}

fn wait_histogram() -> Histogram {
    // 1 ms to ~9 min: waits are bounded by the caller's wait, up to hours.
    Histogram::new(exponential_buckets(0.001, 2.0, 20))
}

fn fsync_histogram() -> Histogram {
    // 25 µs to ~0.8 s.
    Histogram::new(exponential_buckets(0.000_025, 2.0, 16))
}

/// Every metric the server exports; cheap to update from any task.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    durations: Family<OpLabel, Histogram, fn() -> Histogram>,
    events: Family<KindLabel, Counter>,
    /// Open client connections.
    pub connections: Gauge,
    /// Connections closed at once because the cap was reached.
    pub refused: Counter,
    leases: Gauge,
    locks_held: Gauge,
    waiters: Gauge,
    waits: Histogram,
    /// Each fsync of the Raft log; the log's writer observes it.
    pub log_fsync: Histogram,
    fence_next: Gauge,
    applied: Gauge,
    table_time: Gauge<f64, AtomicU64>,
    leader: Gauge,
    hash_mismatch: Gauge,
    term: Gauge,
    last_log: Gauge,
    commit: Gauge,
    snapshot: Gauge,
    leader_changes: Counter,
    lag: Family<PeerLabel, Gauge>,
    /// Snapshot chunks sent to peers; the peer network counts them.
    pub snapshot_chunks: Counter,
    /// Streams of appends opened to peers, by transport; the peer
    /// transport counts them.
    pub append_streams: Family<TransportLabel, Counter>,
    process: Option<process::Process>,
}

/// How a stream of appends goes to a peer: `framed` or `grpc`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransportLabel {
    pub transport: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabel {
    peer: u64,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut m = Metrics {
            registry: Registry::default(),
            requests: Family::default(),
            durations: Family::new_with_constructor(duration_histogram),
            events: Family::default(),
            connections: Gauge::default(),
            refused: Counter::default(),
            leases: Gauge::default(),
            locks_held: Gauge::default(),
            waiters: Gauge::default(),
            waits: wait_histogram(),
            log_fsync: fsync_histogram(),
            fence_next: Gauge::default(),
            applied: Gauge::default(),
            table_time: Gauge::default(),
            leader: Gauge::default(),
            hash_mismatch: Gauge::default(),
            term: Gauge::default(),
            last_log: Gauge::default(),
            commit: Gauge::default(),
            snapshot: Gauge::default(),
            leader_changes: Counter::default(),
            lag: Family::default(),
            snapshot_chunks: Counter::default(),
            append_streams: Family::default(),
            process: None,
        };
        let r = &mut m.registry;
        r.register(
            "leasehold_requests",
            "Calls by operation and outcome",
            m.requests.clone(),
        );
        r.register_with_unit(
            "leasehold_request_duration",
            "Time to answer a call",
            Unit::Seconds,
            m.durations.clone(),
        );
        r.register(
            "leasehold_lock_events",
            "Locks acquired, released and expired",
            m.events.clone(),
        );
        r.register(
            "leasehold_connections",
            "Open client connections",
            m.connections.clone(),
        );
        r.register(
            "leasehold_connections_refused",
            "Connections closed at once because the connection cap was reached",
            m.refused.clone(),
        );
        r.register("leasehold_leases", "Live leases", m.leases.clone());
        r.register("leasehold_locks_held", "Held locks", m.locks_held.clone());
        r.register(
            "leasehold_waiters",
            "Acquires waiting in a key's queue",
            m.waiters.clone(),
        );
        r.register_with_unit(
            "leasehold_wait",
            "How long an acquire that queued waited for its grant",
            Unit::Seconds,
            m.waits.clone(),
        );
        r.register_with_unit(
            "leasehold_log_fsync",
            "Time of each fsync of the Raft log",
            Unit::Seconds,
            m.log_fsync.clone(),
        );
        r.register(
            "leasehold_fence_next",
            "The fencing token the next grant gets",
            m.fence_next.clone(),
        );
        r.register(
            "leasehold_raft_applied_index",
            "Last applied Raft log index",
            m.applied.clone(),
        );
        r.register_with_unit(
            "leasehold_table_time",
            "The lock table's clock",
            Unit::Seconds,
            m.table_time.clone(),
        );
        r.register(
            "leasehold_is_leader",
            "1 if this node leads",
            m.leader.clone(),
        );
        r.register(
            "leasehold_table_hash_mismatch",
            "1 once members' tables were found to differ",
            m.hash_mismatch.clone(),
        );
        r.register("leasehold_raft_term", "The current term", m.term.clone());
        r.register(
            "leasehold_raft_last_log_index",
            "Last log index on this node",
            m.last_log.clone(),
        );
        r.register(
            "leasehold_raft_commit_index",
            "Highest log index known committed (on a follower: the last applied)",
            m.commit.clone(),
        );
        r.register(
            "leasehold_raft_snapshot_index",
            "Last log index in this node's snapshot",
            m.snapshot.clone(),
        );
        r.register(
            "leasehold_leader_changes",
            "Times this node saw a new leader",
            m.leader_changes.clone(),
        );
        r.register(
            "leasehold_raft_replication_lag",
            "On the leader: entries each member is behind",
            m.lag.clone(),
        );
        r.register(
            "leasehold_raft_snapshot_chunks_sent",
            "Snapshot chunks sent to peers",
            m.snapshot_chunks.clone(),
        );
        r.register(
            "leasehold_raft_append_streams",
            "On a leader: streams of appends opened to peers, by transport",
            m.append_streams.clone(),
        );
        m.process = Some(process::Process::register(&mut m.registry));
        m
    }
}

fn gauge_value(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Metrics {
    /// Counts one answered call.
    pub fn request(&self, op: &'static str, code: &'static str, took: Duration) {
        self.requests
            .get_or_create(&RequestLabels { op, code })
            .inc();
        self.durations
            .get_or_create(&OpLabel { op })
            .observe(took.as_secs_f64());
    }

    /// Records how long a queued acquire waited for its grant.
    pub fn waited(&self, took: Duration) {
        self.waits.observe(took.as_secs_f64());
    }

    /// Counts a change of leader seen by this node.
    pub fn leader_changed(&self) {
        self.leader_changes.inc();
    }

    /// Counts the lock events of one applied entry.
    ///
    /// Counted first and added once a kind: an expiry that frees a million
    /// keys is one entry, and would otherwise be a million look-ups in the
    /// family, each behind its lock.
    pub fn events(&self, events: &[Event]) {
        let mut counts = [0u64; 3];
        for event in events {
            match event {
                Event::Acquired { .. } => counts[0] += 1,
                Event::Released { .. } => counts[1] += 1,
                Event::Expired { .. } => counts[2] += 1,
                _ => {}
            }
        }
        for (kind, n) in ["acquired", "released", "expired"].into_iter().zip(counts) {
            if n > 0 {
                self.events.get_or_create(&KindLabel { kind }).inc_by(n);
            }
        }
    }

    /// The metrics as OpenMetrics text, with the gauges set from `now`.
    pub fn render(&self, now: &Gauges) -> String {
        self.leases.set(gauge_value(now.leases));
        self.locks_held.set(gauge_value(now.locks_held));
        self.waiters.set(gauge_value(now.waiters));
        self.fence_next.set(gauge_value(now.fence_next));
        self.applied.set(gauge_value(now.applied_index));
        self.table_time.set(now.table_time_ms as f64 / 1_000.0);
        self.leader.set(i64::from(now.is_leader));
        self.hash_mismatch.set(i64::from(now.table_hash_mismatch));
        self.term.set(gauge_value(now.term));
        self.last_log.set(gauge_value(now.last_log_index));
        self.commit.set(gauge_value(now.commit_index));
        self.snapshot.set(gauge_value(now.snapshot_index));
        if let Some(process) = &self.process {
            process.sample();
        }
        self.lag.clear();
        for &(peer, lag) in &now.replication_lag {
            self.lag
                .get_or_create(&PeerLabel { peer })
                .set(gauge_value(lag));
        }
        let mut text = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::warn!(error = %e, "encode metrics");
        }
        text
    }
}

/// What the gauges show, read off the node when `/metrics` is scraped.
#[derive(Debug, Clone, Default)]
pub struct Gauges {
    /// Live leases.
    pub leases: u64,
    /// Held locks.
    pub locks_held: u64,
    /// Acquires waiting in a key's queue.
    pub waiters: u64,
    /// The token the next grant gets.
    pub fence_next: u64,
    /// The last applied log index.
    pub applied_index: u64,
    /// The lock table's clock, in milliseconds.
    pub table_time_ms: u64,
    /// Whether this node leads (its clock is armed).
    pub is_leader: bool,
    /// Whether members' tables were found to differ (`raft::operations::hash_check`).
    pub table_hash_mismatch: bool,
    /// The current term.
    pub term: u64,
    /// The last log index on this node.
    pub last_log_index: u64,
    /// The highest index known committed here.
    pub commit_index: u64,
    /// The last index in this node's snapshot.
    pub snapshot_index: u64,
    /// On the leader: each member's id and how many entries it is behind.
    pub replication_lag: Vec<(u64, u64)>,
}
