//! Deterministic simulation of leaseholdd clusters under faults, and a
//! checker over what happened.
//!
//! A run puts 3 or 5 real nodes (the real consensus, lock table, expiry
//! driver and lock service of `leasehold-server`), clients that keep their
//! leases with the `leasehold` crate's own rules, and a fenced resource into
//! one [`World`](world::World): hosts stepped in turn on one thread, each
//! on its own tokio runtime with a paused clock. Between the nodes, and
//! between clients and nodes, runs a simulated network (seeded delay and
//! loss, cuts); each node's log sits on a simulated disk that loses what was
//! not synced when the node crashes. A seed fixes everything, so a failing
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
//! crashes that lose unsynced log entries, a whole-cluster power loss, a node
//! frozen past the election timeout and the TTL, a client cut off after its
//! answers came late, a client's process paused past its TTL between its
//! `token()` check and its write, a member removed and added back, and
//! clocks that drift by up to [`MAX_DRIFT`]. The [`checker`] states what
//! every history must satisfy. Bugs can be planted ([`Bug`]) to show the
//! checker catches them.

#[cfg(not(tokio_unstable))]
compile_error!(
    "leasehold-sim needs `--cfg tokio_unstable` to seed tokio's randomness; .cargo/config.toml sets it (a RUSTFLAGS variable replaces it: add `--cfg tokio_unstable` there)"
);

pub mod chaos;
pub mod checker;
pub mod client;
pub mod disk;
pub mod history;
pub mod nemesis;
pub mod net;
pub mod node;
pub mod world;

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

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
}

impl Bug {
    /// Every planted bug.
    pub const ALL: [Bug; 5] = [
        Bug::AckBeforeFsync,
        Bug::BlindRelease,
        Bug::DeadlineFromReply,
        Bug::StaleRead,
        Bug::LostCheckpoint,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Bug::AckBeforeFsync => "ack-before-fsync",
            Bug::BlindRelease => "blind-release",
            Bug::DeadlineFromReply => "deadline-from-reply",
            Bug::StaleRead => "stale-read",
            Bug::LostCheckpoint => "lost-checkpoint",
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
    /// Log entries lost to crashes.
    pub lost_entries: u64,
    /// Times a node's software exited (its Raft stopped) and was restarted.
    pub exits: u64,
    /// The checker's findings.
    pub verdict: Verdict,
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
    rng: StdRng,
}

fn drift(rng: &mut StdRng) -> f64 {
    1.0 + rng.gen_range(-MAX_DRIFT..=MAX_DRIFT)
}

impl Sandbox {
    /// `nodes` voters forming a group, seeded by `seed`, with `bug` planted.
    pub fn new(seed: u64, nodes: usize, bug: Option<Bug>) -> Sandbox {
        let mut rng = StdRng::seed_from_u64(seed);
        let history = History::default();
        let net = Net::new(
            rng.gen(),
            (Duration::from_micros(200), Duration::from_millis(4)),
        );
        let mut world = World::new(seed, TICK, history.clone());
        let members: Vec<u64> = (1..=nodes as u64).collect();
        let registry = node::Registry::default();
        let (mut hosts, mut disks) = (Vec::new(), Vec::new());
        for &id in &members {
            // Distinct election timeouts from the seed: openraft draws its
            // own from the thread's generator, so each node's range is one
            // millisecond wide and the seed picks where it lies.
            let low = rng.gen_range(150..450);
            let parts = NodeParts {
                id,
                members: members.clone(),
                disk: Arc::default(),
                snapshots: Default::default(),
                options: RaftOptions {
                    snapshot_every: 200,
                    snapshot_chunk_bytes: 4096,
                    heartbeat: Duration::from_millis(50),
                    election_timeout: (Duration::from_millis(low), Duration::from_millis(low + 1)),
                },
                sync_time: Duration::from_micros(rng.gen_range(2000..15000)),
                ack_before_sync: bug == Some(Bug::AckBeforeFsync),
                planted: match bug {
                    Some(Bug::BlindRelease) => Some(PlantedBug::BlindRelease),
                    Some(Bug::StaleRead) => Some(PlantedBug::StaleRead),
                    Some(Bug::LostCheckpoint) => Some(PlantedBug::LostCheckpoint),
                    _ => None,
                },
                net: net.clone(),
                registry: registry.clone(),
            };
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

/// Runs one simulation.
pub fn run(config: &Config) -> Report {
    let Sandbox {
        mut world,
        history,
        net,
        registry,
        nodes,
        disks,
        mut rng,
    } = Sandbox::new(config.seed, config.nodes, config.bug);
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
    let mut clients = Vec::new();
    for c in 0..config.clients {
        let client = Arc::new((
            c,
            drift(&mut rng),
            rng.gen::<u64>(),
            members.iter().map(|&id| node::addr(id)).collect::<Vec<_>>(),
        ));
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
        registry,
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
        if now > faulty_until && clients.iter().all(|&c| world.is_done(c)) {
            break;
        }
    }
    if let Some(failure) = failure {
        history.record(Event::Panic { message: failure });
    }
    for host in nodes.iter().chain(&clients) {
        world.crash(*host);
    }
    let records = history.records();
    let verdict = checker::check(&records, nemesis.healed_at().unwrap_or(faulty_until));
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
        lost_entries: disks.iter().map(|d| d.lost()).sum(),
        exits: records
            .iter()
            .filter(|r| matches!(r.event, Event::Exited { .. }))
            .count() as u64,
        verdict,
        digest: hasher.finish(),
        history: records,
    }
}
