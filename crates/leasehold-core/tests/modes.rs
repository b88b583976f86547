//! Property tests for keys with several holders: read/write locks (readers
//! share, a writer is alone) and counting semaphores (at most N holders).
//!
//! Random commands on two keys, "rw" (acquired as exclusive or shared) and
//! "sem" (acquired as a semaphore of 3 permits, sometimes of 2 or as a plain
//! lock, which must be refused while anyone holds or waits for it). After
//! every step the holders the events report are checked against what the
//! modes allow, the table's own view and its invariants.

use std::collections::{BTreeMap, HashMap};

use leasehold_core::{Command, Event, LockTable, Mode, Outcome, Response, Stamp};
use proptest::prelude::*;

const KEYS: [&str; 2] = ["rw", "sem"];
const PERMITS: u32 = 3;

#[derive(Debug, Clone)]
enum Op {
    Grant {
        ttl_ms: u64,
    },
    KeepAlive(usize),
    Revoke(usize),
    Acquire {
        lease: usize,
        key: usize,
        mode: usize,
        wait_ms: u64,
        request_id: u64,
    },
    GrantAndAcquire {
        key: usize,
        mode: usize,
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
        lease: usize,
        key: usize,
    },
    /// A release with a token that holds nothing.
    ReleaseStale {
        key: usize,
        fence: u64,
    },
}

fn mode(key: usize, choice: usize) -> Mode {
    match (KEYS[key], choice) {
        ("rw", 0..=2) => Mode::Shared,
        ("rw", _) => Mode::Exclusive,
        (_, 0..=3) => Mode::Permit { permits: PERMITS },
        (_, 4) => Mode::Permit { permits: 2 },
        _ => Mode::Exclusive,
    }
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0usize..KEYS.len();
    let wait = prop_oneof![2 => Just(0u64), 3 => 1u64..500];
    let request_id = prop_oneof![2 => Just(0u64), 1 => 1u64..4];
    prop_oneof![
        3 => (50u64..800).prop_map(|ttl_ms| Op::Grant { ttl_ms }),
        2 => (0usize..6).prop_map(Op::KeepAlive),
        1 => (0usize..6).prop_map(Op::Revoke),
        8 => (0usize..6, key.clone(), 0usize..6, wait.clone(), request_id.clone())
            .prop_map(|(lease, key, mode, wait_ms, request_id)| Op::Acquire { lease, key, mode, wait_ms, request_id }),
        2 => (key.clone(), 0usize..6, wait)
            .prop_map(|(key, mode, wait_ms)| Op::GrantAndAcquire { key, mode, wait_ms }),
        1 => (0usize..6, key.clone(), request_id, 0u64..4)
            .prop_map(|(lease, key, request_id, attempt)| Op::CancelWait { lease, key, request_id, attempt }),
        5 => (0usize..6, key.clone()).prop_map(|(lease, key)| Op::Release { lease, key }),
        1 => (key, 0u64..60).prop_map(|(key, fence)| Op::ReleaseStale { key, fence }),
    ]
}

fn steps() -> impl Strategy<Value = Vec<(u64, bool, Op)>> {
    prop::collection::vec(
        (
            prop_oneof![10 => 0u64..40, 3 => 40u64..400],
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
    /// The mode each lease last asked for on each key.
    asked: HashMap<(String, u64), Mode>,
    /// Holders by key, from the events: lease -> (fence, mode).
    holders: HashMap<String, BTreeMap<u64, (u64, Mode)>>,
    highest_fence: u64,
    granted_shared_and_permits: usize,
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

    fn command(&mut self, op: &Op) -> Command {
        match *op {
            Op::Grant { ttl_ms } => Command::Grant {
                ttl_ms,
                holder: "h".into(),
                request_id: 0,
            },
            Op::KeepAlive(l) => Command::KeepAlive {
                lease: self.lease(l),
            },
            Op::Revoke(l) => Command::Revoke {
                lease: self.lease(l),
            },
            Op::Acquire {
                lease,
                key,
                mode: m,
                wait_ms,
                request_id,
            } => Command::Acquire {
                lease: self.lease(lease),
                key: KEYS[key].into(),
                wait_ms,
                lock_delay_ms: 0,
                request_id,
                mode: mode(key, m),
            },
            Op::GrantAndAcquire {
                key,
                mode: m,
                wait_ms,
            } => Command::GrantAndAcquire {
                ttl_ms: 400,
                holder: "g".into(),
                key: KEYS[key].into(),
                wait_ms,
                lock_delay_ms: 0,
                request_id: 0,
                mode: mode(key, m),
            },
            Op::CancelWait {
                lease,
                key,
                request_id,
                attempt,
            } => Command::CancelWait {
                lease: self.lease(lease),
                key: KEYS[key].into(),
                request_id,
                attempt,
            },
            Op::Release { lease, key } => {
                let lease = self.lease(lease);
                let fence = self
                    .holders
                    .get(KEYS[key])
                    .and_then(|h| h.get(&lease))
                    .map_or(0, |h| h.0);
                Command::Release {
                    key: KEYS[key].into(),
                    fence,
                    request_id: 0,
                }
            }
            Op::ReleaseStale { key, fence } => Command::Release {
                key: KEYS[key].into(),
                fence,
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
        let mut time_events = Vec::new();
        time_only.apply(stamp, Command::Tick, &mut time_events).ok();
        self.observe(&time_events)?;
        // The queues once time has passed, first in line first.
        let queues: HashMap<&str, Vec<(u64, &'static str)>> = KEYS
            .iter()
            .map(|k| {
                let waiters = time_only.lock(k, self.now).map_or_else(Vec::new, |l| {
                    l.waiters.iter().map(|w| (w.lease, w.mode)).collect()
                });
                (*k, waiters)
            })
            .collect();

        let command = self.command(op);
        // What the lease asked before: a refused acquire asked for nothing.
        let mut asked_before = None;
        if let Command::Acquire {
            lease, key, mode, ..
        } = &command
        {
            asked_before = Some((
                (key.clone(), *lease),
                self.asked.insert((key.clone(), *lease), *mode),
            ));
        }
        let stale_release = match &command {
            Command::Release { key, fence, .. } => !self
                .holders
                .get(key)
                .is_some_and(|h| h.values().any(|(f, _)| f == fence)),
            _ => false,
        };
        let mut events = Vec::new();
        let outcome: Outcome = self.table.apply(stamp, command.clone(), &mut events);
        self.table.check_invariants().map_err(TestCaseError::fail)?;
        prop_assert_eq!(&events[..time_events.len()], &time_events[..]);
        let events = &events[time_events.len()..];
        if let (Err(_), Some((at, before))) = (&outcome, asked_before) {
            match before {
                Some(mode) => self.asked.insert(at, mode),
                None => self.asked.remove(&at),
            };
        }

        let made = match (&command, &outcome) {
            (_, Ok(Response::LeaseGranted { lease, .. })) => Some(*lease),
            (Command::GrantAndAcquire { .. }, Ok(Response::Acquired(g))) => Some(g.lease),
            (Command::GrantAndAcquire { .. }, Ok(Response::Queued { lease, .. })) => Some(*lease),
            _ => None,
        };
        if let Some(lease) = made {
            self.leases.push(lease);
            if let Command::GrantAndAcquire { key, mode, .. } = &command {
                self.asked.insert((key.clone(), lease), *mode);
            }
        }
        if stale_release {
            prop_assert!(outcome.is_err(), "a stale release succeeded: {:?}", command);
        }
        if outcome.is_err() {
            prop_assert_eq!(
                &time_only,
                &self.table,
                "refused {:?} changed state",
                command
            );
        }
        // A newcomer is granted at once only if nobody waited before it:
        // a waiting writer stops new readers, a full semaphore's queue
        // stops new permits.
        // (A retry answered from memory grants nothing: only a grant this
        // step made counts.)
        if let (Ok(Response::Acquired(g)), Some(key)) = (&outcome, acquired_key(&command)) {
            let granted_now = events.iter().any(|e| {
                matches!(e, Event::Acquired { key: k, lease, fence, .. }
                    if &**k == key && *lease == g.lease && *fence == g.fence)
            });
            if granted_now {
                prop_assert!(
                    queues[key].is_empty(),
                    "{:?} granted past the queue {:?}",
                    command,
                    queues[key]
                );
            }
        }
        // Grants from a queue go in queue order.
        for key in KEYS {
            let ended: Vec<u64> = events
                .iter()
                .filter_map(|e| match e {
                    Event::WaitEnded { key: k, lease, .. } if &**k == key => Some(*lease),
                    _ => None,
                })
                .collect();
            let line: Vec<u64> = queues[key]
                .iter()
                .map(|w| w.0)
                .filter(|l| !ended.contains(l))
                .collect();
            let from_queue: Vec<u64> = events
                .iter()
                .filter_map(|e| match e {
                    Event::Acquired { key: k, lease, .. } if &**k == key => Some(*lease),
                    _ => None,
                })
                .filter(|l| line.contains(l))
                .collect();
            prop_assert_eq!(
                &from_queue[..],
                &line[..from_queue.len()],
                "{} granted out of queue order",
                key
            );
        }
        self.observe(events)?;
        for key in KEYS {
            let view: BTreeMap<u64, u64> = self
                .table
                .lock(key, self.now)
                .map_or_else(BTreeMap::new, |l| {
                    l.holders.iter().map(|h| (h.lease, h.fence)).collect()
                });
            let ours: BTreeMap<u64, u64> = self.holders.get(key).map_or_else(BTreeMap::new, |h| {
                h.iter().map(|(l, (f, _))| (*l, *f)).collect()
            });
            prop_assert_eq!(view, ours, "events and table disagree on {}", key);
        }
        Ok(())
    }

    fn observe(&mut self, events: &[Event]) -> Result<(), TestCaseError> {
        for event in events {
            match event {
                Event::Acquired {
                    key, fence, lease, ..
                } => {
                    prop_assert!(
                        *fence > self.highest_fence,
                        "fence {} not above {}",
                        fence,
                        self.highest_fence
                    );
                    self.highest_fence = *fence;
                    let mode = self
                        .asked
                        .get(&(key.to_string(), *lease))
                        .copied()
                        .unwrap_or_default();
                    let holders = self.holders.entry(key.to_string()).or_default();
                    prop_assert!(
                        !holders.contains_key(lease),
                        "{} granted twice to {}",
                        key,
                        lease
                    );
                    holders.insert(*lease, (*fence, mode));
                    let modes: Vec<Mode> = holders.values().map(|h| h.1).collect();
                    if modes.len() > 1 {
                        self.granted_shared_and_permits += 1;
                    }
                    let exclusive = modes.iter().filter(|m| **m == Mode::Exclusive).count();
                    prop_assert!(
                        exclusive == 0 || modes.len() == 1,
                        "a writer beside others on {}: {:?}",
                        key,
                        modes
                    );
                    if let Some(n) = modes.iter().find_map(|m| m.permits()) {
                        prop_assert!(
                            modes.len() <= n as usize,
                            "{} permits of {} held",
                            modes.len(),
                            n
                        );
                        prop_assert!(
                            modes.iter().all(|m| m.permits() == Some(n)),
                            "a semaphore held in other modes: {:?}",
                            modes
                        );
                    }
                }
                Event::Released {
                    key, lease, fence, ..
                }
                | Event::Expired {
                    key, lease, fence, ..
                } => {
                    let holders = self.holders.entry(key.to_string()).or_default();
                    prop_assert_eq!(holders.remove(lease).map(|h| h.0), Some(*fence));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

fn acquired_key(command: &Command) -> Option<&'static str> {
    match command {
        Command::Acquire { key, .. } | Command::GrantAndAcquire { key, .. } => {
            KEYS.iter().copied().find(|k| k == key)
        }
        _ => None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Never a writer beside a reader or another writer, never more than N
    /// permits, tokens strictly increase, queues hand out in order and new
    /// arrivals never jump them, refusals change nothing.
    #[test]
    fn readers_writers_and_permits_keep_their_limits(steps in steps()) {
        let mut checker = Checker { epoch: 1, ..Checker::default() };
        for (dt, new_epoch, op) in &steps {
            checker.step(*dt, *new_epoch, op)?;
        }
    }
}

/// Guards the generator: runs must reach several holders at once, on both keys.
#[test]
fn random_runs_reach_shared_holds() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut shared = 0;
    let mut conflicts = 0;
    let mut full = 0;
    for _ in 0..100 {
        let steps = steps().new_tree(&mut runner).expect("tree").current();
        let mut checker = Checker {
            epoch: 1,
            ..Checker::default()
        };
        for (dt, new_epoch, op) in &steps {
            checker.step(*dt, *new_epoch, op).expect("properties hold");
            if checker
                .holders
                .get("sem")
                .is_some_and(|h| h.len() == PERMITS as usize)
            {
                full += 1;
            }
        }
        shared += checker.granted_shared_and_permits;
        let mut t = checker.table.clone();
        let probe = Command::Acquire {
            lease: checker.lease(0),
            key: "sem".into(),
            wait_ms: 0,
            lock_delay_ms: 0,
            request_id: 0,
            mode: Mode::Permit { permits: 7 },
        };
        let stamp = Stamp {
            now: checker.now,
            epoch: checker.epoch,
        };
        if let Err(e) = t.apply(stamp, probe, &mut Vec::new()) {
            if e.to_string().contains("semaphore of 3 permits") {
                conflicts += 1;
            }
        }
    }
    assert!(shared >= 50, "few shared holds: {shared}");
    assert!(full >= 20, "the semaphore was rarely full: {full}");
    assert!(conflicts >= 5, "few conflicting permit counts: {conflicts}");
}
