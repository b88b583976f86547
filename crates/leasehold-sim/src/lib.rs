//! Deterministic simulation of leaseholdd clusters under faults, and a
//! checker over what happened.
//!
//! A run puts 3 or 5 real nodes (the real consensus, lock table, expiry
//! driver and lock service of `leasehold-server`), clients that keep their
//! leases with the `leasehold` crate's own rules, and a fenced resource into
//! one [`World`](world::World): hosts stepped in turn on one thread, each
//! on its own tokio runtime with a paused clock. Between the nodes, and
//! between clients and nodes, runs a simulated network (seeded delay and
//! loss, cuts); each node's real log store sits on a simulated disk
//! ([`disk`]) that loses what was not synced when the node crashes. A seed fixes everything, so a failing
//! seed replays exactly.
//!
//! Why not turmoil: its hosts are the same idea, but it neither seeds tokio's
//! own randomness (`select!` picks branches at random) nor simulates a disk,
//! and our nodes talk through a [`Transport`](leasehold_server::raft::Transport)
//! seam already, so the simulated network sits under the real encoding of
//! every Raft message rather than under TCP. The cost: the gRPC and HTTP
//! layers are not simulated (they have their own tests against real
//! processes).
//!
//! The faults ([`nemesis`]) are seeded and combined: partitions (one node
//! from the rest, both ways or one way), message loss and congestion,
//! crashes that lose or tear unsynced log writes, a whole-cluster power loss, a node
//! frozen past the election timeout and the TTL, a client cut off after its
//! answers came late, a client's process paused past its TTL between its
//! `token()` check and its write, a member removed and added back, a node
//! that was never a member joining, and clocks that drift by up to
//! [`MAX_DRIFT`]. The [`checker`] states what every history must satisfy;
//! [`applied`] follows what the nodes applied, for FIFO order and
//! lock-delay; [`linearizable`] holds expiries to the lease rule and checks
//! each lock's history for linearizability against what the nodes applied.
//! [`chaos`] runs the same checker over real processes. Bugs can be planted ([`Bug`]) to show the
//! checker catches them.

#[cfg(not(tokio_unstable))]
compile_error!(
    "leasehold-sim needs `--cfg tokio_unstable` to seed tokio's randomness; .cargo/config.toml sets it (a RUSTFLAGS variable replaces it: add `--cfg tokio_unstable` there)"
);

pub mod applied;
pub mod chaos;
pub mod checker;
pub mod client;
pub mod disk;
pub mod history;
pub mod linearizable;
pub mod nemesis;
pub mod net;
pub mod node;
pub mod world;

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::planted::TableBug;
use leasehold_fence::MemoryGate;
use leasehold_server::raft::RaftOptions;
use leasehold_server::service::PlantedBug;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use checker::Verdict;
use client::{SimClient, Workload};
use history::{Event, History, Micros, Record};
use net::{Net, NetStats};
use node::NodeParts;
use world::World;

/// Clocks run at a rate within this fraction of true time. A client's
/// deadline keeps a margin of a tenth of the TTL, which covers twice this.
pub const MAX_DRIFT: f64 = 0.02;

/// A bug planted on purpose; the checker must catch each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bug {
    /// The log acknowledges an append before it is synced.
    AckBeforeFsync,
    /// Release ignores the token and frees whoever holds the key.
    BlindRelease,
    /// The client counts its deadline from the grant's answer, not its send.
    DeadlineFromReply,
    /// Reads answer from the node's own table without confirming it leads.
    StaleRead,
    /// A checkpoint save is acknowledged and never written.
    LostCheckpoint,
    /// The table puts a new waiter at the front of the queue.
    LifoQueue,
    /// An expiry never starts the hold's lock-delay.
    NoLockDelay,
    /// A new leader forgets the renewals of each lease's last TTL, and
    /// expires leases renewed on time.
    ForgetRenewals,
}

impl Bug {
    /// Every planted bug.
    pub const ALL: [Bug; 8] = [
        Bug::AckBeforeFsync,
        Bug::BlindRelease,
        Bug::DeadlineFromReply,
        Bug::StaleRead,
        Bug::LostCheckpoint,
        Bug::LifoQueue,
        Bug::NoLockDelay,
        Bug::ForgetRenewals,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Bug::AckBeforeFsync => "ack-before-fsync",
            Bug::BlindRelease => "blind-release",
            Bug::DeadlineFromReply => "deadline-from-reply",
            Bug::StaleRead => "stale-read",
            Bug::LostCheckpoint => "lost-checkpoint",
            Bug::LifoQueue => "lifo-queue",
            Bug::NoLockDelay => "no-lock-delay",
            Bug::ForgetRenewals => "forget-renewals",
        }
    }
}

impl std::str::FromStr for Bug {
    type Err = String;
    fn from_str(s: &str) -> Result<Bug, String> {
        Bug::ALL.into_iter().find(|b| b.name() == s).ok_or_else(|| {
            let names: Vec<_> = Bug::ALL.iter().map(|b| b.name()).collect();
            format!("unknown bug {s:?}: one of {}", names.join(", "))
        })
    }
}

/// What to simulate.
#[derive(Debug, Clone)]
pub struct Config {
    /// The seed: the same seed, the same run.
    pub seed: u64,
    /// Voters: 3 or 5.
    pub nodes: usize,
    /// Client hosts.
    pub clients: usize,
    /// How long faults are injected; then everything heals.
    pub faulty: Duration,
    /// A planted bug, if any.
    pub bug: Option<Bug>,
}

impl Config {
    /// The default run for `seed`.
    pub fn seed(seed: u64) -> Config {
        Config {
            seed,
            nodes: 3,
            clients: 4,
            faulty: Duration::from_secs(12),
            bug: None,
        }
    }

    /// This run with `bug` planted.
    pub fn with_bug(mut self, bug: Option<Bug>) -> Config {
        self.bug = bug;
        self
    }

    /// The command that replays this run.
    pub fn replay_command(&self) -> String {
        let mut cmd = format!(
            "cargo run -p leasehold-sim --release -- --seed {} --nodes {} --clients {} --faulty-secs {}",
            self.seed,
            self.nodes,
            self.clients,
            self.faulty.as_secs()
        );
        if let Some(bug) = self.bug {
            cmd.push_str(&format!(" --bug {}", bug.name()));
        }
        cmd
    }
}

/// What a run did and what the checker found.
#[derive(Debug, Clone)]
pub struct Report {
    /// The run.
    pub config: Config,
    /// Client calls that got a final answer.
    pub operations: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// The network's counts.
    pub net: NetStats,
    /// Unsynced log writes dropped or torn by crashes.
    pub lost_writes: u64,
    /// Times a node's software exited (its Raft stopped) and was restarted.
    pub exits: u64,
    /// The checker's findings.
    pub verdict: Verdict,
    /// What the nodes applied, as followed for FIFO order and lock-delay.
    pub applied: applied::AppliedStats,
    /// What the lease rule and linearizability checks covered; none when an
    /// index no node applied left the server's side unknown.
    pub linearized: Option<linearizable::Checked>,
    /// A digest of the whole history: equal for equal seeds.
    pub digest: u64,
    /// Everything recorded.
    pub history: Vec<Record>,
}

impl Report {
    /// Whether the checker found nothing.
    pub fn passed(&self) -> bool {
        self.verdict.violations.is_empty()
    }
}

const TICK: Duration = Duration::from_millis(1);
const TTL: Duration = Duration::from_millis(600);

/// A cluster in a world, without clients: what a run is built on, and what
/// tests of single faults drive by hand.
pub struct Sandbox {
    /// The world.
    pub world: World,
    /// Its clock and record.
    pub history: History,
    /// The network.
    pub net: Net,
    /// The nodes that are up.
    pub registry: node::Registry,
    /// Node `i + 1` is host `nodes[i]`.
    pub nodes: Vec<world::HostId>,
    /// Node `i + 1`'s disk.
    pub disks: Vec<Arc<disk::Disk>>,
    /// What the nodes applied, followed for FIFO order and lock-delay.
    pub applied: applied::AppliedLog,
    rng: StdRng,
}

fn drift(rng: &mut StdRng) -> f64 {
    1.0 + rng.gen_range(-MAX_DRIFT..=MAX_DRIFT)
}

/// Node `id`'s parts: a fresh disk, Raft timing and a sync time drawn from
/// `rng`, and `bug` if it is planted in nodes.
fn node_parts(
    id: u64,
    members: Vec<u64>,
    rng: &mut StdRng,
    bug: Option<Bug>,
    net: &Net,
    registry: &node::Registry,
    applied: &applied::AppliedLog,
) -> NodeParts {
    // Distinct election timeouts from the seed: each node's range is one
    // millisecond wide and the seed picks where it lies.
    let low = rng.gen_range(150..450);
    let sync_time = Duration::from_micros(rng.gen_range(2000..15000));
    let disk = disk::Disk::new(rng.gen(), sync_time, bug == Some(Bug::AckBeforeFsync));
    NodeParts {
        id,
        members,
        disk: Arc::new(disk),
        snapshots: Default::default(),
        options: RaftOptions {
            snapshot_every: 200,
            snapshot_chunk_bytes: 4096,
            heartbeat: Duration::from_millis(50),
            election_timeout: (Duration::from_millis(low), Duration::from_millis(low + 1)),
            hash_check_every: 0,
        },
        planted: match bug {
            Some(Bug::BlindRelease) => Some(PlantedBug::BlindRelease),
            Some(Bug::StaleRead) => Some(PlantedBug::StaleRead),
            Some(Bug::LostCheckpoint) => Some(PlantedBug::LostCheckpoint),
            _ => None,
        },
        net: net.clone(),
        registry: registry.clone(),
        applied: applied.clone(),
    }
}

/// A node that was never a member, started during the faults and added
/// through the leader (learner, catch-up, voter), in a third of the runs.
/// It draws from its own generator, so the other faults of a seed are the
/// same with or without it until it starts.
struct Joiner {
    rng: StdRng,
    id: u64,
    /// When it starts, if this run has one.
    at: Option<Micros>,
    host: Option<world::HostId>,
    next_try: Micros,
    joined_at: Option<Micros>,
}

impl Joiner {
    fn new(seed: u64, nodes: usize, faulty_until: Micros) -> Joiner {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x6a6f_696e_6572);
        let at = (rng.gen_bool(1.0 / 3.0) && faulty_until > 4_000_000)
            .then(|| rng.gen_range(2_000_000..faulty_until - 2_000_000));
        Joiner {
            rng,
            id: nodes as u64 + 1,
            at,
            host: None,
            next_try: 0,
            joined_at: None,
        }
    }

    /// Its address, for clients to know from the start (calls to it fail
    /// until it runs).
    fn addr(&self) -> Option<String> {
        self.at.map(|_| node::addr(self.id))
    }

    #[allow(clippy::too_many_arguments)]
    fn act(
        &mut self,
        world: &mut World,
        history: &History,
        sandbox: (
            &Net,
            &node::Registry,
            &applied::AppliedLog,
            &[world::HostId],
        ),
        bug: Option<Bug>,
        voters: &[u64],
        now: Micros,
    ) {
        let (net, registry, applied, nodes) = sandbox;
        let Some(at) = self.at else { return };
        if now < at || self.joined_at.is_some() || now < self.next_try {
            return;
        }
        let id = self.id;
        if self.host.is_none() {
            let mut members = voters.to_vec();
            members.push(id);
            let parts = node_parts(id, members, &mut self.rng, bug, net, registry, applied);
            let rate = drift(&mut self.rng);
            let host = world.add(&node::addr(id), rate, move || parts.clone().run());
            world.supervise(host);
            self.host = Some(host);
            history.record(Event::Fault {
                kind: "join",
                detail: format!("n{id}, never a member, started and added through the leader"),
            });
        }
        if registry.is_voter(id) {
            self.joined_at = Some(now);
            history.record(Event::Healed {
                detail: format!("n{id} is a voter"),
            });
            return;
        }
        self.next_try = now + 200_000;
        let Some((leader, _)) = registry.leader() else {
            return;
        };
        let on = match nodes.get(leader as usize - 1) {
            Some(&host) if leader < id => host,
            _ => self.host.unwrap_or(0),
        };
        if let Some(consensus) = registry.get(leader) {
            world.spawn_on(on, async move {
                let _ = consensus.membership().add(id, node::addr(id)).await;
            });
        }
    }
}

impl Sandbox {
    /// `nodes` voters forming a group, seeded by `seed`, with `bug` planted.
    pub fn new(seed: u64, nodes: usize, bug: Option<Bug>) -> Sandbox {
        let mut rng = StdRng::seed_from_u64(seed);
        // Every host runs on this thread: openraft's own draws (election
        // timeouts, the first tick) come from the seed too.
        leasehold_server::raft::seed_thread_randomness(seed);
        let history = History::default();
        let net = Net::new(
            rng.gen(),
            (Duration::from_micros(200), Duration::from_millis(4)),
        );
        let mut world = World::new(seed, TICK, history.clone());
        let members: Vec<u64> = (1..=nodes as u64).collect();
        let registry = node::Registry::default();
        let applied = applied::AppliedLog::new(history.clone());
        let (mut hosts, mut disks) = (Vec::new(), Vec::new());
        for &id in &members {
            let parts = node_parts(
                id,
                members.clone(),
                &mut rng,
                bug,
                &net,
                &registry,
                &applied,
            );
            disks.push(parts.disk.clone());
            let rate = drift(&mut rng);
            let host = world.add(&node::addr(id), rate, move || parts.clone().run());
            world.supervise(host);
            hosts.push(host);
        }
        Sandbox {
            world,
            history,
            net,
            registry,
            nodes: hosts,
            disks,
            applied,
            rng,
        }
    }

    /// Runs the world for `d` of its time.
    pub fn run_for(&mut self, d: Duration) -> anyhow::Result<()> {
        let until = self.history.now() + d.as_micros() as Micros;
        while self.history.now() < until {
            self.world.step()?;
        }
        Ok(())
    }

    /// The node leading in the highest term, if any, and that term.
    pub fn leader(&self) -> Option<(u64, u64)> {
        self.registry.leader()
    }
}

/// Plants a table bug on this thread while it lives.
struct PlantedTable;

impl PlantedTable {
    fn new(bug: Option<TableBug>) -> PlantedTable {
        leasehold_core::planted::plant(bug);
        PlantedTable
    }
}

impl Drop for PlantedTable {
    fn drop(&mut self) {
        leasehold_core::planted::plant(None);
    }
}

/// Runs one simulation.
pub fn run(config: &Config) -> Report {
    let Sandbox {
        mut world,
        history,
        net,
        registry,
        nodes,
        disks,
        applied,
        mut rng,
    } = Sandbox::new(config.seed, config.nodes, config.bug);
    // The table's bugs are planted on this thread, where every host runs.
    let _planted = PlantedTable::new(match config.bug {
        Some(Bug::LifoQueue) => Some(TableBug::LifoQueue),
        Some(Bug::NoLockDelay) => Some(TableBug::NoLockDelay),
        Some(Bug::ForgetRenewals) => Some(TableBug::ForgetRenewals),
        _ => None,
    });
    let members: Vec<u64> = (1..=config.nodes as u64).collect();
    let gate = Arc::new(MemoryGate::new());
    let faulty_until = config.faulty.as_micros() as Micros;
    let workload = Workload {
        keys: 2,
        ttl: TTL,
        wait: Duration::from_secs(2),
        writes: 10,
        stall: 0.05,
        deadline_from_reply: config.bug == Some(Bug::DeadlineFromReply),
        until: faulty_until + 4_000_000,
    };
    let mut joiner = Joiner::new(config.seed, config.nodes, faulty_until);
    let mut clients = Vec::new();
    for c in 0..config.clients {
        let mut addrs: Vec<String> = members.iter().map(|&id| node::addr(id)).collect();
        addrs.extend(joiner.addr());
        let client = Arc::new((c, drift(&mut rng), rng.gen::<u64>(), addrs));
        let (net, history, gate, workload) =
            (net.clone(), history.clone(), gate.clone(), workload.clone());
        let rate = client.1;
        clients.push(world.add(&format!("c{c}"), rate, move || {
            SimClient {
                id: client.0,
                rate: client.1,
                nodes: client.3.clone(),
                net: net.clone(),
                history: history.clone(),
                gate: gate.clone(),
                workload: workload.clone(),
                seed: client.2,
            }
            .run()
        }));
    }

    let mut nemesis = nemesis::Nemesis::new(
        rng.gen(),
        nodes.clone(),
        config.clients,
        disks.clone(),
        net.clone(),
        registry.clone(),
    );
    let cap = faulty_until + 20_000_000;
    let mut failure = None;
    let mut paused: Vec<(world::HostId, Micros)> = Vec::new();
    while history.now() < cap {
        let now = history.now();
        if now < faulty_until {
            nemesis.act(&mut world, &history, now);
        } else {
            nemesis.heal(&mut world, &history);
        }
        joiner.act(
            &mut world,
            &history,
            (&net, &registry, &applied, &nodes),
            config.bug,
            &members,
            now,
        );
        if let Err(e) = world.step() {
            failure = Some(e.to_string());
            break;
        }
        for (name, span) in history.take_pauses() {
            if let Some(&host) = clients.iter().find(|&&h| world.name(h) == name) {
                world.freeze(host);
                paused.push((host, history.now() + span));
            }
        }
        paused.retain(|&(host, until)| {
            if history.now() >= until {
                world.thaw(host);
                false
            } else {
                true
            }
        });
        if now > faulty_until
            && clients.iter().all(|&c| world.is_done(c))
            && (joiner.at.is_none() || joiner.joined_at.is_some())
        {
            break;
        }
    }
    if let Some(failure) = failure {
        history.record(Event::Panic { message: failure });
    }
    for host in nodes.iter().chain(&clients).chain(&joiner.host) {
        world.crash(*host);
    }
    let records = history.records();
    let healed = nemesis
        .healed_at()
        .unwrap_or(faulty_until)
        .max(joiner.joined_at.unwrap_or(0));
    let mut verdict = checker::check(&records, healed);
    if let (Some(at), None) = (joiner.at, joiner.joined_at) {
        verdict.violations.push(format!(
            "n{}, started at {at} µs to join, never became a voter",
            joiner.id
        ));
    }
    let applied = applied.stats();
    verdict
        .violations
        .extend(applied.violations.iter().cloned());
    // Without every index the server's side is unknown past the gap.
    let linearized = applied
        .gap_at
        .is_none()
        .then(|| linearizable::check(&records, &applied.served, TTL));
    if let Some(checked) = &linearized {
        verdict
            .violations
            .extend(checked.violations.iter().cloned());
    }
    let mut hasher = DefaultHasher::new();
    for r in &records {
        r.to_string().hash(&mut hasher);
    }
    Report {
        config: config.clone(),
        operations: records
            .iter()
            .filter(|r| matches!(r.event, Event::Answer { .. }))
            .count() as u64,
        faults: records.iter().fold(BTreeMap::new(), |mut counts, r| {
            if let Event::Fault { kind, .. } = r.event {
                *counts.entry(kind).or_insert(0) += 1;
            }
            counts
        }),
        net: net.stats(),
        lost_writes: disks.iter().map(|d| d.lost()).sum(),
        exits: records
            .iter()
            .filter(|r| matches!(r.event, Event::Exited { .. }))
            .count() as u64,
        verdict,
        applied,
        linearized,
        digest: hasher.finish(),
        history: records,
    }
}
