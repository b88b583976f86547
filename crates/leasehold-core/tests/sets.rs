//! Property tests for lock sets: random sets and single keys over four keys,
//! with waits, releases, revokes, expiries and new leaderships.
//!
//! After every step: a set is held on all its keys or on none; a key has at
//! most one holder; tokens only grow; every two waiters are in the same order
//! on every key they both wait for (so no two sets can wait for each other);
//! and nothing that could be granted is left waiting (`check_invariants`).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use leasehold_core::{Command, Event, LockTable, Mode, Response, Stamp};
use proptest::prelude::*;

const KEYS: [&str; 4] = ["a", "b", "c", "d"];

#[derive(Debug, Clone)]
enum Op {
    Grant {
        ttl_ms: u64,
    },
    KeepAlive(usize),
    Revoke(usize),
    AcquireSet {
        lease: usize,
        keys: Vec<usize>,
        wait_ms: u64,
        request_id: u64,
    },
    Acquire {
        lease: usize,
        key: usize,
        wait_ms: u64,
    },
    CancelWait {
        lease: usize,
        key: usize,
        request_id: u64,
        /// 0: any attempt; otherwise withdraws only that attempt's wait.
        attempt: u64,
    },
    Release {
        key: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let wait = prop_oneof![1 => Just(0u64), 3 => 1u64..600];
    let request_id = prop_oneof![1 => Just(0u64), 1 => 1u64..4];
    prop_oneof![
        3 => (50u64..900).prop_map(|ttl_ms| Op::Grant { ttl_ms }),
        2 => (0usize..6).prop_map(Op::KeepAlive),
        1 => (0usize..6).prop_map(Op::Revoke),
        6 => (0usize..6, prop::collection::vec(0usize..KEYS.len(), 1..4), wait.clone(), request_id.clone())
            .prop_map(|(lease, keys, wait_ms, request_id)| Op::AcquireSet { lease, keys, wait_ms, request_id }),
        3 => (0usize..6, 0usize..KEYS.len(), wait)
            .prop_map(|(lease, key, wait_ms)| Op::Acquire { lease, key, wait_ms }),
        1 => (0usize..6, 0usize..KEYS.len(), request_id, 0u64..4)
            .prop_map(|(lease, key, request_id, attempt)| Op::CancelWait { lease, key, request_id, attempt }),
        4 => (0usize..KEYS.len()).prop_map(|key| Op::Release { key }),
    ]
}

fn steps() -> impl Strategy<Value = Vec<(u64, bool, Op)>> {
    prop::collection::vec(
        (
            prop_oneof![10 => 0u64..50, 3 => 50u64..500],
            prop::bool::weighted(0.02),
            op(),
        ),
        1..200,
    )
}

#[derive(Default)]
struct Checker {
    table: LockTable,
    now: u64,
    epoch: u64,
    leases: Vec<u64>,
    /// Which wait each (lease, key) in a queue belongs to: the step that
    /// queued it. One lease may wait several times (for disjoint keys).
    waits: HashMap<(u64, String), usize>,
    steps: usize,
    /// Who holds each key, from the events: (lease, fence).
    holders: HashMap<String, (u64, u64)>,
    /// The keys granted with each token (several for a set).
    granted: BTreeMap<u64, BTreeSet<String>>,
    highest_fence: u64,
    sets_granted: usize,
    sets_from_queue: usize,
}

impl Checker {
    fn lease(&self, n: usize) -> u64 {
        self.leases
            .iter()
            .rev()
            .nth(n)
            .copied()
            .unwrap_or(n as u64 + 1_000)
    }

    fn command(&self, op: &Op) -> Command {
        match op {
            Op::Grant { ttl_ms } => Command::Grant {
                ttl_ms: *ttl_ms,
                holder: "h".into(),
                request_id: 0,
            },
            Op::KeepAlive(l) => Command::KeepAlive {
                lease: self.lease(*l),
            },
            Op::Revoke(l) => Command::Revoke {
                lease: self.lease(*l),
            },
            Op::AcquireSet {
                lease,
                keys,
                wait_ms,
                request_id,
            } => Command::AcquireSet {
                lease: self.lease(*lease),
                keys: keys.iter().map(|k| KEYS[*k].to_string()).collect(),
                wait_ms: *wait_ms,
                lock_delay_ms: 0,
                request_id: *request_id,
            },
            Op::Acquire {
                lease,
                key,
                wait_ms,
            } => Command::Acquire {
                lease: self.lease(*lease),
                key: KEYS[*key].into(),
                wait_ms: *wait_ms,
                lock_delay_ms: 0,
                request_id: 0,
                mode: Mode::Exclusive,
            },
            Op::CancelWait {
                lease,
                key,
                request_id,
                attempt,
            } => Command::CancelWait {
                lease: self.lease(*lease),
                key: KEYS[*key].into(),
                request_id: *request_id,
                attempt: *attempt,
            },
            Op::Release { key } => Command::Release {
                key: KEYS[*key].into(),
                fence: self.holders.get(KEYS[*key]).map_or(0, |h| h.1),
                request_id: 0,
            },
        }
    }

    fn step(&mut self, dt: u64, new_epoch: bool, op: &Op) -> Result<(), TestCaseError> {
        self.now += dt;
        self.epoch += u64::from(new_epoch);
        let stamp = Stamp {
            now: self.now,
            epoch: self.epoch,
        };
        let mut time_only = self.table.clone();
        time_only.apply(stamp, Command::Tick, &mut Vec::new()).ok();
        let command = self.command(op);
        let mut events = Vec::new();
        let outcome = self.table.apply(stamp, command.clone(), &mut events);
        self.steps += 1;
        if let Ok(Response::Queued { lease, .. }) = &outcome {
            let keys: Vec<String> = match &command {
                Command::AcquireSet { keys, .. } => keys.clone(),
                Command::Acquire { key, .. } => vec![key.clone()],
                _ => Vec::new(),
            };
            for key in keys {
                self.waits.insert((*lease, key), self.steps);
            }
        }
        self.table.check_invariants().map_err(TestCaseError::fail)?;
        if outcome.is_err() {
            prop_assert_eq!(
                &time_only,
                &self.table,
                "refused {:?} changed state",
                command
            );
        }
        if let Ok(Response::LeaseGranted { lease, .. }) = &outcome {
            self.leases.push(*lease);
        }
        if let (Ok(Response::Acquired(_)), Command::AcquireSet { .. }) = (&outcome, &command) {
            self.sets_granted += 1;
        }
        let mut granted_now: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
        for e in &events {
            match e {
                Event::Acquired {
                    key, fence, lease, ..
                } => {
                    prop_assert!(
                        !self.holders.contains_key(&**key),
                        "{} granted to {} while held by {:?}",
                        key,
                        lease,
                        self.holders.get(&**key)
                    );
                    prop_assert!(
                        *fence > self.highest_fence || granted_now.contains_key(fence),
                        "token {} not above {}",
                        fence,
                        self.highest_fence
                    );
                    self.highest_fence = self.highest_fence.max(*fence);
                    self.holders.insert(key.to_string(), (*lease, *fence));
                    granted_now
                        .entry(*fence)
                        .or_default()
                        .insert(key.to_string());
                }
                Event::Released {
                    key, fence, lease, ..
                }
                | Event::Expired {
                    key, fence, lease, ..
                } => {
                    prop_assert_eq!(self.holders.remove(&**key), Some((*lease, *fence)));
                }
                _ => {}
            }
        }
        for (fence, keys) in granted_now {
            if keys.len() > 1
                && !matches!(outcome, Ok(Response::Acquired(ref g)) if g.fence == fence)
            {
                self.sets_from_queue += 1;
            }
            self.granted.insert(fence, keys);
        }
        // A set is held on all its keys or on none.
        for (fence, keys) in &self.granted {
            let held = keys
                .iter()
                .filter(|k| self.holders.get(*k).is_some_and(|h| h.1 == *fence))
                .count();
            prop_assert!(
                held == 0 || held == keys.len(),
                "token {} holds {} of {:?}",
                fence,
                held,
                keys
            );
        }
        // Every two waits are in the same order on every key they share (a
        // lease that holds keys while it waits can still deadlock with
        // another, as with any locks; its TTL and wait end that).
        let queues: Vec<Vec<usize>> = KEYS
            .iter()
            .map(|k| {
                self.table.lock(k, self.now).map_or_else(Vec::new, |l| {
                    l.waiters
                        .iter()
                        .map(|w| {
                            self.waits
                                .get(&(w.lease, k.to_string()))
                                .copied()
                                .unwrap_or(0)
                        })
                        .collect()
                })
            })
            .collect();
        for q1 in &queues {
            for q2 in &queues {
                let common1: Vec<usize> = q1.iter().copied().filter(|l| q2.contains(l)).collect();
                let common2: Vec<usize> = q2.iter().copied().filter(|l| q1.contains(l)).collect();
                prop_assert_eq!(&common1, &common2, "queues disagree: {:?}", queues);
            }
        }
        // The table agrees with the events.
        for key in KEYS {
            let held = self
                .table
                .lock(key, self.now)
                .and_then(|l| l.holder)
                .map(|h| (h.lease, h.fence));
            prop_assert_eq!(held, self.holders.get(key).copied(), "{} disagrees", key);
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn sets_are_held_whole_and_never_wait_in_a_cycle(steps in steps()) {
        let mut checker = Checker { epoch: 1, ..Checker::default() };
        for (dt, new_epoch, op) in &steps {
            checker.step(*dt, *new_epoch, op)?;
        }
    }
}

/// Guards the generator: runs must grant sets at once and from queues.
#[test]
fn random_runs_grant_sets_at_once_and_from_queues() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let (mut at_once, mut from_queue) = (0, 0);
    for _ in 0..100 {
        let steps = steps().new_tree(&mut runner).expect("tree").current();
        let mut checker = Checker {
            epoch: 1,
            ..Checker::default()
        };
        for (dt, new_epoch, op) in &steps {
            checker.step(*dt, *new_epoch, op).expect("properties hold");
        }
        at_once += checker.sets_granted;
        from_queue += checker.sets_from_queue;
    }
    assert!(at_once >= 50, "few sets granted at once: {at_once}");
    assert!(
        from_queue >= 10,
        "few sets granted from a queue: {from_queue}"
    );
}
