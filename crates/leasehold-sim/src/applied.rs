//! Checks over what the nodes applied: FIFO order and lock-delay.
//!
//! Clients cannot see a queue's order or when a key left its lock-delay, so
//! these two properties are checked on the server's side: every node's state
//! machine shows each entry it applies to an [`AppliedLog`] (through
//! [`StateMachine::tap`](leasehold_server::raft::StateMachine::tap)), which
//! takes each log index once, from whichever node applies it first (committed
//! entries are the same on every node), and follows the queues:
//! - **FIFO**: a waiter is granted a key only when no waiter queued before it
//!   for that key still waits; a key is granted at once only when nobody
//!   waits for it;
//! - **lock-delay**: after a hold with a lock-delay expires, nobody is
//!   granted the key until that much table time has passed.
//!
//! It also keeps what the server did to each lock and lease, with the
//! world's time at which a node first applied it (the entry was committed
//! by then): the server's side of the history that
//! [`linearizable`](crate::linearizable) checks.
//!
//! Only exclusive holds are followed (the simulation's workload takes no
//! others). An index no node applied (every node that had it took a
//! snapshot past it) ends the checks for the run: the queues before it are
//! unknown. The log is kept out of the history, so a seed's history is the
//! same with or without it.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use leasehold_core::{Command, Event, Fence, LeaseId, Mode, Response, Time};
use leasehold_server::raft::{AppliedCommand, ApplyTap};

use crate::history::{History, Micros};

/// What the server did, as the log has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Served {
    /// A key was granted.
    Granted {
        /// The key.
        key: Arc<str>,
        /// The token.
        fence: Fence,
        /// The holding lease.
        lease: LeaseId,
    },
    /// A hold ended: released (by its holder, a revoke, or nobody coming
    /// back for it after a new leadership), or expired with its lease.
    Ended {
        /// The key.
        key: Arc<str>,
        /// The token that held it.
        fence: Fence,
        /// The lease that held it.
        lease: LeaseId,
        /// Whether its lease expired.
        expired: bool,
    },
    /// A lease expired.
    LeaseExpired {
        /// The lease.
        lease: LeaseId,
    },
}

/// Something the server did, and when a node first applied it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedAt {
    /// The world's time of the first apply.
    pub at: Micros,
    /// The log index.
    pub index: u64,
    /// What.
    pub what: Served,
}

/// What was followed, and what broke.
#[derive(Debug, Clone, Default)]
pub struct AppliedStats {
    /// Log indexes followed.
    pub entries: u64,
    /// Grants of a key someone had waited for.
    pub queue_grants: u64,
    /// Expiries that started a lock-delay.
    pub delays: u64,
    /// Set when an index was missing and the checks stopped there.
    pub gap_at: Option<u64>,
    /// Each broken property, one line each.
    pub violations: Vec<String>,
    /// What the server did to locks and leases, in log order.
    pub served: Vec<ServedAt>,
}

#[derive(Default)]
struct Model {
    last: u64,
    stats: AppliedStats,
    /// Per key, the waiting leases in the order they queued.
    queues: HashMap<String, Vec<LeaseId>>,
    /// The lock-delay each wait asked for, by lease and key.
    asked: HashMap<(LeaseId, String), u64>,
    /// The lock-delay of each hold, by key and token.
    holds: BTreeMap<(String, u64), u64>,
    /// Per key, table time before which nobody may be granted it.
    delayed: HashMap<String, Time>,
}

/// The applied log of a run, shared by its nodes' taps.
#[derive(Clone)]
pub struct AppliedLog {
    model: Arc<Mutex<Model>>,
    clock: History,
}

impl AppliedLog {
    /// An empty log, timing what it takes in on `clock`.
    pub fn new(clock: History) -> AppliedLog {
        AppliedLog {
            model: Arc::default(),
            clock,
        }
    }

    /// A tap for one node's state machine.
    pub fn tap(&self) -> ApplyTap {
        let log = self.clone();
        Arc::new(move |index, commands| log.observe(index, commands))
    }

    /// What was followed so far, and what broke.
    pub fn stats(&self) -> AppliedStats {
        self.model.lock().stats.clone()
    }

    fn observe(&self, index: u64, commands: &[AppliedCommand]) {
        let mut model = self.model.lock();
        if model.stats.gap_at.is_some() || index <= model.last {
            return;
        }
        if index != model.last + 1 {
            model.stats.gap_at = Some(model.last + 1);
            return;
        }
        model.last = index;
        model.stats.entries += 1;
        let at = self.clock.now();
        for c in commands {
            model.apply(index, c);
            model.serve(at, index, &c.events);
        }
    }
}

/// The command inside any `As` wrapping.
fn inner(command: &Command) -> &Command {
    match command {
        Command::As { command, .. } => inner(command),
        other => other,
    }
}

impl Model {
    fn serve(&mut self, at: Micros, index: u64, events: &[Event]) {
        let served = events.iter().filter_map(|event| match event {
            Event::Acquired {
                key, fence, lease, ..
            } => Some(Served::Granted {
                key: key.clone(),
                fence: *fence,
                lease: *lease,
            }),
            Event::Released {
                key, fence, lease, ..
            }
            | Event::Expired {
                key, fence, lease, ..
            } => Some(Served::Ended {
                key: key.clone(),
                fence: *fence,
                lease: *lease,
                expired: matches!(event, Event::Expired { .. }),
            }),
            Event::LeaseExpired { lease } => Some(Served::LeaseExpired { lease: *lease }),
            _ => None,
        });
        let stamped = served.map(|what| ServedAt { at, index, what });
        self.stats.served.extend(stamped);
    }

    fn apply(&mut self, index: u64, c: &AppliedCommand) {
        // The wait this command may add: its lease comes from the answer
        // (a `GrantAndAcquire` makes the lease).
        let asked = match inner(&c.command) {
            Command::Acquire {
                key,
                lock_delay_ms,
                mode: Mode::Exclusive,
                ..
            }
            | Command::GrantAndAcquire {
                key,
                lock_delay_ms,
                mode: Mode::Exclusive,
                ..
            } => Some((key.clone(), *lock_delay_ms)),
            _ => None,
        };
        if let Some((key, delay)) = &asked {
            let lease = match &c.outcome {
                Ok(Response::Acquired(grant)) => Some(grant.lease),
                Ok(Response::Queued { lease, .. }) => Some(*lease),
                _ => None,
            };
            if let Some(lease) = lease {
                self.asked.entry((lease, key.clone())).or_insert(*delay);
            }
        }
        for event in &c.events {
            match event {
                Event::Acquired {
                    key, fence, lease, ..
                } => self.granted(index, c.now, key, *fence, *lease),
                Event::WaitEnded { key, lease, .. } => {
                    if let Some(q) = self.queues.get_mut(&**key) {
                        q.retain(|l| l != lease);
                    }
                    self.asked.remove(&(*lease, key.to_string()));
                }
                Event::Expired { key, fence, .. } => {
                    let delay = self.holds.remove(&(key.to_string(), *fence)).unwrap_or(0);
                    if delay > 0 {
                        self.stats.delays += 1;
                        self.delayed
                            .insert(key.to_string(), c.now.saturating_add(delay));
                    }
                }
                Event::Released { key, fence, .. } => {
                    self.holds.remove(&(key.to_string(), *fence));
                }
                _ => {}
            }
        }
        if let (Some((key, _)), Ok(Response::Queued { lease, .. })) = (&asked, &c.outcome) {
            let queue = self.queues.entry(key.clone()).or_default();
            // A retry of a queued wait keeps its place.
            if !queue.contains(lease) {
                queue.push(*lease);
            }
        }
    }

    fn granted(&mut self, index: u64, now: Time, key: &str, fence: u64, lease: LeaseId) {
        if let Some(until) = self.delayed.get(key).copied() {
            if now < until {
                self.stats.violations.push(format!(
                    "lock-delay broken: {key:?} granted to lease {lease} (fence {fence}) at table time {now} ms, in its lock-delay until {until} ms (log index {index})"
                ));
            }
        }
        let queue = self.queues.entry(key.to_string()).or_default();
        match queue.iter().position(|l| *l == lease) {
            Some(at) => {
                if at > 0 {
                    self.stats.violations.push(format!(
                        "FIFO broken: {key:?} granted to lease {lease} (fence {fence}) while leases {:?} waited ahead of it (log index {index})",
                        &queue[..at]
                    ));
                }
                queue.remove(at);
                self.stats.queue_grants += 1;
            }
            None if !queue.is_empty() => self.stats.violations.push(format!(
                "FIFO broken: {key:?} granted at once to lease {lease} (fence {fence}) while leases {queue:?} waited (log index {index})"
            )),
            None => {}
        }
        let delay = self.asked.remove(&(lease, key.to_string())).unwrap_or(0);
        self.holds.insert((key.to_string(), fence), delay);
    }
}
