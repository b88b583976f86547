//! The nemesis: seeded faults, one at a time, often aimed at the leader.
//!
//! | kind | what it does |
//! |---|---|
//! | `partition` | one node cut from the other nodes, both ways |
//! | `one-way` | one node's messages to another dropped, not the answers |
//! | `loss` | a share of all messages lost |
//! | `delay` | congestion: all messages slowed (up to 200 ms a leg), some lost |
//! | `crash` | one node killed (its unsynced log lost), restarted later |
//! | `power-loss` | every node killed at once, restarted later |
//! | `freeze` | one node frozen past the election timeout and often the TTL |
//! | `client-cut` | answers to one client slowed, then the client cut off from every node |
//! | `membership` | one node removed from the group through the leader, later added back (learner, then voter) |
//! | `join` | (in a third of the runs, from its own generator: see `Joiner` in the crate root) a node that was never a member started and added through the leader |
//!
//! Clients stall on their own (`client-stall`, see [`client`](crate::client));
//! clocks drift from the start ([`MAX_DRIFT`](crate::MAX_DRIFT)).

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::disk::Disk;
use crate::history::{Event, History, Micros};
use crate::net::Net;
use crate::node::{addr, Registry};
use crate::world::{HostId, World};

enum Active {
    Cut,
    /// A client's answers slowed, then the client cut off at `cut_at`.
    Client {
        name: String,
        cut_at: Micros,
    },
    Loss,
    Delay((Duration, Duration)),
    Down(Vec<usize>),
    Frozen(usize),
    /// A node removed from the group, to be added back.
    Removed(usize),
}

/// Injects faults into a world's nodes.
pub struct Nemesis {
    rng: StdRng,
    /// Node `i + 1` is host `nodes[i]`.
    nodes: Vec<HostId>,
    clients: usize,
    disks: Vec<Arc<Disk>>,
    net: Net,
    registry: Registry,
    next_at: Micros,
    active: Option<(Active, Micros, String)>,
    healed_at: Option<Micros>,
    /// A removed node still to be added back, and when to try next.
    readd: Option<(usize, Micros)>,
}

fn ms(rng: &mut StdRng, low: u64, high: u64) -> Micros {
    rng.gen_range(low..high) * 1000
}

impl Nemesis {
    /// A nemesis drawing from `seed`, for these node hosts and their disks.
    pub fn new(
        seed: u64,
        nodes: Vec<HostId>,
        clients: usize,
        disks: Vec<Arc<Disk>>,
        net: Net,
        registry: Registry,
    ) -> Nemesis {
        Nemesis {
            rng: StdRng::seed_from_u64(seed),
            nodes,
            clients,
            disks,
            net,
            registry,
            // The group forms first.
            next_at: 1_500_000,
            active: None,
            healed_at: None,
            readd: None,
        }
    }

    /// When the last fault ended.
    pub fn healed_at(&self) -> Option<Micros> {
        self.healed_at
    }

    /// Ends the fault in force, if its time is up, and starts the next when due.
    pub fn act(&mut self, world: &mut World, history: &History, now: Micros) {
        self.add_back(world, history, now);
        if let Some((active, until, _)) = &mut self.active {
            if now >= *until {
                self.end(world, history, now);
            } else if let Active::Client { name, cut_at } = active {
                if now >= *cut_at {
                    for node in 0..self.nodes.len() {
                        self.net.cut(name, &addr(node as u64 + 1));
                        self.net.cut(&addr(node as u64 + 1), name);
                    }
                    *cut_at = Micros::MAX;
                }
            }
            return;
        }
        if now >= self.next_at {
            self.start(world, history, now);
        }
    }

    /// Ends the fault in force, if any, and keeps adding a removed member
    /// back (the run's faulty part is over).
    pub fn heal(&mut self, world: &mut World, history: &History) {
        if self.active.is_some() {
            self.end(world, history, history.now());
        }
        self.add_back(world, history, history.now());
    }

    /// Asks the leader, every 200 ms, to add a removed node back (learner,
    /// catch-up, voter) until it is a voter again.
    fn add_back(&mut self, world: &mut World, history: &History, now: Micros) {
        let Some((node, next)) = self.readd else {
            return;
        };
        if now < next {
            return;
        }
        let id = node as u64 + 1;
        if self.registry.is_voter(id) {
            self.readd = None;
            history.record(Event::Healed {
                detail: format!("n{id} is a voter again"),
            });
            self.healed_at = Some(now);
            return;
        }
        self.readd = Some((node, now + 200_000));
        let Some((leader, _)) = self.registry.leader() else {
            return;
        };
        if let (Some(consensus), Some(on)) =
            (self.registry.get(leader), self.host_of(world, leader))
        {
            world.spawn_on(on, async move {
                let _ = consensus.membership().add(id, addr(id)).await;
            });
        }
    }

    /// A host to run an operator's call to node `id` on: its own, or (for
    /// a node that joined later) any node that is up.
    fn host_of(&self, world: &World, id: u64) -> Option<HostId> {
        match self.nodes.get(id as usize - 1) {
            Some(&host) => Some(host),
            None => self.nodes.iter().copied().find(|&h| world.is_up(h)),
        }
    }

    /// Index of the node to hit: the leader more often than not.
    fn target(&mut self) -> usize {
        let leader = self.registry.leader();
        match leader {
            // A node that joined later leads at times: not one of these.
            Some((id, _)) if self.rng.gen_bool(0.6) && id as usize <= self.nodes.len() => {
                id as usize - 1
            }
            _ => self.rng.gen_range(0..self.nodes.len()),
        }
    }

    fn kill(&mut self, world: &mut World, node: usize) {
        self.registry.remove(node as u64 + 1);
        self.net.close(&addr(node as u64 + 1));
        world.crash(self.nodes[node]);
        self.disks[node].crash();
    }

    fn start(&mut self, world: &mut World, history: &History, now: Micros) {
        let n = self.nodes.len();
        let (kind, active, lasts, detail) = match self.rng.gen_range(0..21) {
            19..=20 => {
                // An operator removes a node (the leader, at times) and adds
                // it back once the fault ends.
                let node = self.target();
                let id = node as u64 + 1;
                if let Some((leader, _)) = self.registry.leader() {
                    if let (Some(consensus), Some(on)) =
                        (self.registry.get(leader), self.host_of(world, leader))
                    {
                        world.spawn_on(on, async move {
                            let _ = consensus.membership().remove(id).await;
                        });
                    }
                }
                let lasts = ms(&mut self.rng, 500, 3000);
                (
                    "membership",
                    Active::Removed(node),
                    lasts,
                    format!("n{id} removed"),
                )
            }
            0..=2 => {
                let node = self.target();
                for other in (0..n).filter(|&o| o != node) {
                    let (a, b) = (addr(node as u64 + 1), addr(other as u64 + 1));
                    self.net.cut(&a, &b);
                    self.net.cut(&b, &a);
                }
                let lasts = ms(&mut self.rng, 500, 3000);
                (
                    "partition",
                    Active::Cut,
                    lasts,
                    format!("n{} from the rest", node + 1),
                )
            }
            3..=4 => {
                let from = self.target();
                let to = (from + self.rng.gen_range(1..n)) % n;
                self.net.cut(&addr(from as u64 + 1), &addr(to as u64 + 1));
                let lasts = ms(&mut self.rng, 500, 3000);
                (
                    "one-way",
                    Active::Cut,
                    lasts,
                    format!("n{} to n{}", from + 1, to + 1),
                )
            }
            5..=6 => {
                let loss = self.rng.gen_range(0.1..0.5);
                self.net.set_loss(loss);
                let lasts = ms(&mut self.rng, 1000, 3000);
                (
                    "loss",
                    Active::Loss,
                    lasts,
                    format!("{:.0}% of messages", loss * 100.0),
                )
            }
            7..=8 => {
                // Congestion: slow, and lossy with it.
                let before = self.net.delay();
                let high = Duration::from_millis(self.rng.gen_range(20..200));
                let loss = self.rng.gen_range(0.0..0.4);
                self.net.set_delay((before.0, high));
                self.net.set_loss(loss);
                let lasts = ms(&mut self.rng, 1000, 3000);
                let detail = format!("up to {high:?}, {:.0}% lost", loss * 100.0);
                ("delay", Active::Delay(before), lasts, detail)
            }
            9..=11 => {
                let node = self.target();
                self.kill(world, node);
                let lasts = ms(&mut self.rng, 200, 2000);
                (
                    "crash",
                    Active::Down(vec![node]),
                    lasts,
                    format!("n{}", node + 1),
                )
            }
            14..=16 => {
                // Answers to one client come late, then nothing gets through.
                let name = format!("c{}", self.rng.gen_range(0..self.clients));
                let extra = Duration::from_millis(self.rng.gen_range(50..200));
                self.net.slow_down(&name, extra);
                let slow_for = ms(&mut self.rng, 300, 1500);
                let lasts = slow_for + ms(&mut self.rng, 500, 2000);
                let detail = format!(
                    "{name}: answers {extra:?} late for {} ms, then cut off",
                    slow_for / 1000
                );
                let active = Active::Client {
                    name,
                    cut_at: now + slow_for,
                };
                ("client-cut", active, lasts, detail)
            }
            12..=13 => {
                for node in 0..n {
                    self.kill(world, node);
                }
                let lasts = ms(&mut self.rng, 100, 1000);
                (
                    "power-loss",
                    Active::Down((0..n).collect()),
                    lasts,
                    "every node".into(),
                )
            }
            _ => {
                let node = self.target();
                world.freeze(self.nodes[node]);
                let lasts = ms(&mut self.rng, 1000, 3000);
                (
                    "freeze",
                    Active::Frozen(node),
                    lasts,
                    format!("n{}", node + 1),
                )
            }
        };
        let detail = format!("{detail} for {} ms", lasts / 1000);
        history.record(Event::Fault {
            kind,
            detail: detail.clone(),
        });
        self.active = Some((active, now + lasts, format!("{kind} {detail}")));
    }

    fn end(&mut self, world: &mut World, history: &History, now: Micros) {
        let Some((active, _, detail)) = self.active.take() else {
            return;
        };
        match active {
            Active::Cut | Active::Client { .. } => self.net.heal(),
            Active::Loss => self.net.set_loss(0.0),
            Active::Delay(before) => {
                self.net.set_delay(before);
                self.net.set_loss(0.0);
            }
            Active::Down(nodes) => {
                for node in nodes {
                    world.restart(self.nodes[node]);
                }
            }
            Active::Frozen(node) => world.thaw(self.nodes[node]),
            Active::Removed(node) => self.readd = Some((node, now)),
        }
        history.record(Event::Healed { detail });
        self.healed_at = Some(now);
        self.next_at = now + ms(&mut self.rng, 200, 1500);
    }
}
