//! Property tests over random command sequences.
//!
//! Commands name leases and fences by *choice* (a recent lease, the current
//! holder's fence, the one before it) as well as by raw value, so that random
//! runs reach contention, queues, expiries and stale tokens often instead of
//! mostly hitting unknown ids.

use std::collections::{HashMap, HashSet};

use leasehold_core::auth::{hash_secret, AuthChange, Permission, Rule};
use leasehold_core::{Command, Event, LockError, LockTable, Outcome, Response, Stamp};
use proptest::prelude::*;

const KEYS: [&str; 3] = ["a", "b", "c"];

/// How a command names a lease.
#[derive(Debug, Clone, Copy)]
enum LeaseChoice {
    /// The n-th most recently granted lease.
    Recent(usize),
    /// A raw id, mostly never granted.
    Raw(u64),
}

/// How a command names a fence.
#[derive(Debug, Clone, Copy)]
enum FenceChoice {
    /// The current holder's token (0 when free).
    Current,
    /// One below the current holder's token: a stale holder.
    Previous,
    /// The highest token handed out on any key.
    Highest,
    /// A raw value.
    Raw(u64),
}

#[derive(Debug, Clone)]
enum Op {
    Grant {
        ttl_ms: u64,
        holder: String,
        request_id: u64,
    },
    GrantAndAcquire {
        ttl_ms: u64,
        key: usize,
        wait_ms: u64,
        request_id: u64,
    },
    KeepAlive(LeaseChoice),
    Revoke(LeaseChoice),
    Acquire {
        lease: LeaseChoice,
        key: usize,
        wait_ms: u64,
        lock_delay_ms: u64,
        request_id: u64,
    },
    CancelWait {
        lease: LeaseChoice,
        key: usize,
        request_id: u64,
        /// 0: any attempt; otherwise withdraws only that attempt's wait.
        attempt: u64,
    },
    Release {
        key: usize,
        fence: FenceChoice,
        request_id: u64,
    },
    SaveCheckpoint {
        key: usize,
        fence: FenceChoice,
        data: Vec<u8>,
    },
    Tick,
}

#[derive(Debug, Clone)]
struct Step {
    /// Milliseconds since the previous step.
    dt: u64,
    /// Whether a new leader took over before this step.
    new_epoch: bool,
    op: Op,
    /// Which token sends it, in a run with auth on (see [`Tokens`]).
    token: usize,
}

fn lease_choice() -> impl Strategy<Value = LeaseChoice> {
    prop_oneof![
        8 => (0usize..4).prop_map(LeaseChoice::Recent),
        1 => prop_oneof![Just(0u64), 1u64..40, Just(u64::MAX)].prop_map(LeaseChoice::Raw),
    ]
}

fn fence_choice() -> impl Strategy<Value = FenceChoice> {
    prop_oneof![
        5 => Just(FenceChoice::Current),
        2 => Just(FenceChoice::Previous),
        1 => Just(FenceChoice::Highest),
        1 => (0u64..40).prop_map(FenceChoice::Raw),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0usize..KEYS.len();
    let request_id = prop_oneof![2 => Just(0u64), 1 => 1u64..6];
    // Mostly short, so expiries are frequent; sometimes past REATTACH_MS, so
    // waits outlive a new leadership.
    let ttl = prop_oneof![1 => Just(0u64), 12 => 50u64..600, 2 => 6_000u64..20_000];
    let wait = prop_oneof![4 => Just(0u64), 4 => 1u64..400, 1 => 6_000u64..20_000];
    prop_oneof![
        3 => (ttl.clone(), "[a-z]{0,3}", request_id.clone())
            .prop_map(|(ttl_ms, holder, request_id)| Op::Grant { ttl_ms, holder, request_id }),
        2 => (ttl, key.clone(), wait.clone(), request_id.clone())
            .prop_map(|(ttl_ms, key, wait_ms, request_id)| Op::GrantAndAcquire { ttl_ms, key, wait_ms, request_id }),
        2 => lease_choice().prop_map(Op::KeepAlive),
        1 => lease_choice().prop_map(Op::Revoke),
        6 => (lease_choice(), key.clone(), wait, prop_oneof![Just(0u64), 1u64..150], request_id.clone())
            .prop_map(|(lease, key, wait_ms, lock_delay_ms, request_id)| Op::Acquire { lease, key, wait_ms, lock_delay_ms, request_id }),
        1 => (lease_choice(), key.clone(), request_id.clone(), 0u64..4)
            .prop_map(|(lease, key, request_id, attempt)| Op::CancelWait { lease, key, request_id, attempt }),
        4 => (key.clone(), fence_choice(), request_id).prop_map(|(key, fence, request_id)| Op::Release { key, fence, request_id }),
        1 => (key, fence_choice(), prop::collection::vec(any::<u8>(), 0..4))
            .prop_map(|(key, fence, data)| Op::SaveCheckpoint { key, fence, data }),
        1 => Just(Op::Tick),
    ]
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (
            prop_oneof![40 => 0u64..30, 10 => 30u64..300, 1 => 2_000u64..6_000],
            prop::bool::weighted(0.02),
            op(),
            0usize..3,
        )
            .prop_map(|(dt, new_epoch, op, token)| Step {
                dt,
                new_epoch,
                op,
                token,
            }),
        1..150,
    )
}

/// Replays steps, checking every property after every step.
#[derive(Clone)]
struct Checker {
    table: LockTable,
    now: u64,
    epoch: u64,
    granted: Vec<u64>,
    /// Who holds each key, and with which token, according to the events.
    holders: HashMap<String, (u64, u64)>,
    highest_fence: u64,
    /// Releases answered with a request id: (key, fence, id).
    released: HashSet<(String, u64, u64)>,
    /// What was applied, for replays.
    log: Vec<(Stamp, Command, Outcome, Vec<Event>)>,
    /// With auth on: the tokens steps are sent as, and each lease's owner.
    tokens: Option<Tokens>,
    owners: HashMap<u64, u64>,
}

/// The tokens of a run with auth on: root (admin on every key), a worker
/// (lock on "a" only, read on the rest), and a reader (read on every key).
#[derive(Clone, Copy, Debug)]
struct Tokens {
    ids: [u64; 3],
    /// The worker's token is revoked at this step.
    revoke_worker_at: usize,
}

const ROOT: usize = 0;
const WORKER: usize = 1;

impl Checker {
    fn new() -> Self {
        Checker {
            table: LockTable::new(),
            now: 0,
            epoch: 1,
            granted: Vec::new(),
            holders: HashMap::new(),
            highest_fence: 0,
            released: HashSet::new(),
            log: Vec::new(),
            tokens: None,
            owners: HashMap::new(),
        }
    }

    /// A checker whose table has auth on, and whose steps are each sent as
    /// one of three tokens.
    fn with_auth(revoke_worker_at: usize) -> Self {
        let mut checker = Checker::new();
        let stamp = Stamp { now: 0, epoch: 1 };
        let mut apply = |change| {
            let command = Command::Auth {
                change,
                at_unix_ms: 0,
            };
            match checker.table.apply(stamp, command, &mut Vec::new()) {
                Ok(Response::AuthChanged { token }) => token,
                other => panic!("{other:?}"),
            }
        };
        let rule = |prefix: &str, permission| Rule {
            prefix: prefix.into(),
            permission,
        };
        apply(AuthChange::SetRole {
            name: "worker".into(),
            rules: vec![rule("a", Permission::Lock), rule("", Permission::Read)],
        });
        apply(AuthChange::SetRole {
            name: "reader".into(),
            rules: vec![rule("", Permission::Read)],
        });
        let mut token = |role: &str| {
            apply(AuthChange::CreateToken {
                name: role.into(),
                role: role.into(),
                hash: hash_secret(role),
            })
            .expect("a token id")
        };
        let worker = token("worker");
        let reader = token("reader");
        let root = apply(AuthChange::Enable {
            root_hash: hash_secret("root"),
        })
        .expect("a token id");
        checker.tokens = Some(Tokens {
            ids: [root, worker, reader],
            revoke_worker_at,
        });
        checker
    }

    fn lease(&self, choice: LeaseChoice) -> u64 {
        match choice {
            LeaseChoice::Recent(n) if n < self.granted.len() => {
                self.granted[self.granted.len() - 1 - n]
            }
            LeaseChoice::Recent(n) => n as u64 + 1_000,
            LeaseChoice::Raw(id) => id,
        }
    }

    fn fence(&self, key: &str, choice: FenceChoice) -> u64 {
        let current = self.holders.get(key).map_or(0, |h| h.1);
        match choice {
            FenceChoice::Current => current,
            FenceChoice::Previous => current.saturating_sub(1),
            FenceChoice::Highest => self.highest_fence,
            FenceChoice::Raw(f) => f,
        }
    }

    fn command(&self, op: &Op) -> Command {
        match op.clone() {
            Op::Grant {
                ttl_ms,
                holder,
                request_id,
            } => Command::Grant {
                ttl_ms,
                holder,
                request_id,
            },
            Op::GrantAndAcquire {
                ttl_ms,
                key,
                wait_ms,
                request_id,
            } => Command::GrantAndAcquire {
                ttl_ms,
                holder: "one-lock".into(),
                key: KEYS[key].into(),
                wait_ms,
                lock_delay_ms: 0,
                request_id,
                mode: leasehold_core::Mode::Exclusive,
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
                wait_ms,
                lock_delay_ms,
                request_id,
            } => Command::Acquire {
                lease: self.lease(lease),
                key: KEYS[key].into(),
                wait_ms,
                lock_delay_ms,
                request_id,
                mode: leasehold_core::Mode::Exclusive,
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
            Op::Release {
                key,
                fence,
                request_id,
            } => Command::Release {
                key: KEYS[key].into(),
                fence: self.fence(KEYS[key], fence),
                request_id,
            },
            Op::SaveCheckpoint { key, fence, data } => Command::SaveCheckpoint {
                key: KEYS[key].into(),
                fence: self.fence(KEYS[key], fence),
                data,
            },
            Op::Tick => Command::Tick,
        }
    }

    fn step(&mut self, step: &Step) -> Result<(), TestCaseError> {
        self.now += step.dt;
        if step.new_epoch {
            self.epoch += 1;
        }
        let stamp = Stamp {
            now: self.now,
            epoch: self.epoch,
        };

        if let Some(tokens) = self.tokens.filter(|t| t.revoke_worker_at == self.log.len()) {
            // Revoked at the stamp's time, as a step of its own.
            let revoke = Command::As {
                token: Some(tokens.ids[ROOT]),
                command: Box::new(Command::Auth {
                    change: AuthChange::RevokeToken {
                        id: tokens.ids[WORKER],
                    },
                    at_unix_ms: 0,
                }),
            };
            let mut events = Vec::new();
            let revoked = self.table.apply(stamp, revoke, &mut events);
            prop_assert!(revoked.is_ok(), "{:?}", revoked);
            self.observe(&events)?;
        }

        // What the table is once time alone has passed: a refused command must
        // leave exactly this, and the holders the events report must match it.
        let mut time_only = self.table.clone();
        let mut time_events = Vec::new();
        time_only.apply(stamp, Command::Tick, &mut time_events).ok();
        self.observe(&time_events)?;
        let before: HashMap<String, (u64, u64)> = self.holders.clone();

        let mut command = self.command(&step.op);
        let mut sender = None;
        if let Some(tokens) = self.tokens {
            sender = Some(step.token);
            command = Command::As {
                token: Some(tokens.ids[step.token]),
                command: Box::new(command),
            };
        }
        let mut events = Vec::new();
        let growth = time_only.growth(&command, None);
        let outcome = self.table.apply(stamp, command.clone(), &mut events);
        self.table.check_invariants().map_err(TestCaseError::fail)?;

        // The growth a quota is checked against is never less than the real one.
        let grew = |after: usize, before: usize| after.saturating_sub(before);
        prop_assert!(
            grew(self.table.lease_count(), time_only.lease_count()) <= growth.leases
                && grew(self.table.held_count(), time_only.held_count()) <= growth.keys
                && grew(self.table.waiter_count(), time_only.waiter_count()) <= growth.waits,
            "{:?} grew the table past {:?}",
            command,
            growth
        );
        if let Some(owner) = growth.owner {
            // A wait that becomes a hold moves from one count to the other.
            let (after, before) = (self.table.owned_by(owner), time_only.owned_by(owner));
            prop_assert!(
                grew(after.leases, before.leases) <= growth.leases
                    && grew(after.keys + after.waits, before.keys + before.waits)
                        <= growth.keys + growth.waits,
                "{:?} grew {:?} past {:?}",
                command,
                (before, after),
                growth
            );
        }

        // Events from the passage of time come first and are the same ones.
        prop_assert_eq!(&events[..time_events.len()], &time_events[..]);
        self.observe(&events[time_events.len()..])?;

        // With auth on, the command as the table ran it.
        let inner = match &command {
            Command::As { command, .. } => &**command,
            other => other,
        };
        // A stale token never releases or writes anything.
        if let Command::Release { key, fence, .. } | Command::SaveCheckpoint { key, fence, .. } =
            inner
        {
            let holds = before.get(key).is_some_and(|h| h.1 == *fence);
            // Only a retry of the same release (same key, token and id) is
            // answered "released" without holding.
            let retried = matches!(inner, Command::Release { request_id, .. }
                if self.released.contains(&(key.clone(), *fence, *request_id)));
            if let (Command::Release { request_id, .. }, Ok(_)) = (inner, &outcome) {
                if *request_id != 0 {
                    self.released.insert((key.clone(), *fence, *request_id));
                }
            }
            if !holds && !retried {
                prop_assert!(
                    outcome.is_err(),
                    "{:?} with a stale token succeeded: {:?}",
                    command,
                    outcome
                );
            }
        }
        if outcome.is_err() {
            prop_assert_eq!(
                &time_only,
                &self.table,
                "refused {:?} changed state: {:?}",
                command,
                outcome
            );
        }
        let made = match &outcome {
            Ok(Response::LeaseGranted { lease, .. }) => Some(*lease),
            Ok(Response::Acquired(g)) if matches!(inner, Command::GrantAndAcquire { .. }) => {
                Some(g.lease)
            }
            Ok(Response::Queued { lease, .. })
                if matches!(inner, Command::GrantAndAcquire { .. }) =>
            {
                Some(*lease)
            }
            _ => None,
        };
        if let Some(lease) = made.filter(|l| !self.granted.contains(l)) {
            self.granted.push(lease);
            if let (Some(tokens), Some(sender)) = (self.tokens, sender) {
                self.owners.insert(lease, tokens.ids[sender]);
            }
        }
        if let (Some(tokens), Some(sender)) = (self.tokens, sender) {
            self.check_scopes(tokens, sender, &command, &outcome, &time_only)?;
        }

        for key in KEYS {
            let held = self
                .table
                .lock(key, self.now)
                .and_then(|l| l.holder)
                .map(|h| (h.lease, h.fence));
            prop_assert_eq!(
                held,
                self.holders.get(key).copied(),
                "events and table disagree on {}",
                key
            );
        }
        self.log.push((stamp, command, outcome, events));
        Ok(())
    }

    /// A token does only what its role allows, on its own leases, and
    /// nothing at all once revoked.
    fn check_scopes(
        &self,
        tokens: Tokens,
        sender: usize,
        command: &Command,
        outcome: &Outcome,
        before: &LockTable,
    ) -> Result<(), TestCaseError> {
        let Command::As { command, .. } = command else {
            return Ok(());
        };
        if sender == WORKER && self.log.len() >= tokens.revoke_worker_at {
            prop_assert!(
                matches!(outcome, Err(LockError::Unauthenticated { .. })),
                "a revoked token ran {:?}: {:?}",
                command,
                outcome
            );
            return Ok(());
        }
        if outcome.is_err() || sender == ROOT {
            return Ok(());
        }
        let key = match &**command {
            Command::Acquire { key, .. }
            | Command::GrantAndAcquire { key, .. }
            | Command::Release { key, .. }
            | Command::SaveCheckpoint { key, .. } => Some(key.as_str()),
            _ => None,
        };
        if let Some(key) = key {
            prop_assert!(
                sender == WORKER && key == "a",
                "token {} was allowed {:?}",
                sender,
                command
            );
        }
        if let Command::KeepAlive { lease }
        | Command::Revoke { lease }
        | Command::Acquire { lease, .. }
        | Command::CancelWait { lease, .. } = &**command
        {
            // Every lease here was made with auth on, so has an owner; a
            // cancel of a wait on a lease that is gone changes nothing.
            let live = before.lease(*lease, self.now).is_some();
            prop_assert!(
                !live || self.owners.get(lease) == Some(&tokens.ids[sender]),
                "token {} used lease {} it does not own: {:?}",
                sender,
                lease,
                command
            );
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
                        !self.holders.contains_key(&**key),
                        "{} granted to lease {} while held by {:?}",
                        key,
                        lease,
                        self.holders.get(&**key)
                    );
                    prop_assert!(
                        *fence > self.highest_fence,
                        "fence {} not above {}",
                        fence,
                        self.highest_fence
                    );
                    self.highest_fence = *fence;
                    self.holders.insert(key.to_string(), (*lease, *fence));
                }
                Event::Released {
                    key, lease, fence, ..
                }
                | Event::Expired {
                    key, lease, fence, ..
                } => {
                    prop_assert_eq!(self.holders.remove(&**key), Some((*lease, *fence)));
                }
                Event::CheckpointSaved {
                    key, fence, lease, ..
                } => {
                    prop_assert_eq!(self.holders.get(&**key), Some(&(*lease, *fence)));
                }
                Event::WaitEnded { .. }
                | Event::LeaseExpired { .. }
                | Event::AuthChanged { .. } => {}
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// At most one holder per key; every grant's token is above every earlier one;
    /// a stale release or renewal is refused and changes nothing; expired leases
    /// free their keys and queues advance in the same step (`check_invariants`
    /// refuses a live lease past its deadline and a free key with a queue).
    #[test]
    fn random_sequences_keep_every_property(steps in steps()) {
        let mut checker = Checker::new();
        for step in &steps {
            checker.step(step)?;
        }
    }

    /// With auth on, a token locks only keys its role allows, uses only its
    /// own leases, is refused everything once revoked, and every other
    /// property still holds.
    #[test]
    fn tokens_stay_inside_their_scopes(steps in steps(), revoke_at in 0usize..200) {
        let mut checker = Checker::with_auth(revoke_at);
        for step in &steps {
            checker.step(step)?;
        }
    }

    /// A table loaded from its snapshot after any step acts exactly as the
    /// table it was taken from, and shows the same leases: a takeover's
    /// restamp, which the table keeps pending and its snapshot writes out
    /// lease by lease, changes nothing either of them does.
    #[test]
    fn a_snapshot_after_any_step_acts_as_its_table(steps in steps()) {
        let mut checker = Checker::new();
        let mut loaded = checker.table.clone();
        for step in &steps {
            let at = checker.log.len();
            checker.step(step)?;
            for (stamp, command, outcome, events) in &checker.log[at..] {
                let mut replayed = Vec::new();
                prop_assert_eq!(&loaded.apply(*stamp, command.clone(), &mut replayed), outcome);
                prop_assert_eq!(&replayed, events);
                let now = stamp.now;
                prop_assert_eq!(loaded.leases(0, usize::MAX, 0, now), checker.table.leases(0, usize::MAX, 0, now));
                prop_assert_eq!(loaded.locks("", None, usize::MAX, now), checker.table.locks("", None, usize::MAX, now));
                prop_assert_eq!(loaded.next_deadline().is_some(), checker.table.next_deadline().is_some());
            }
            let snapshot = bincode::serialize(&checker.table).expect("serialize");
            prop_assert_eq!(&bincode::serialize(&loaded).expect("serialize"), &snapshot);
            prop_assert_eq!(&loaded, &checker.table);
            loaded = bincode::deserialize(&snapshot).expect("deserialize");
            loaded.check_invariants().map_err(TestCaseError::fail)?;
        }
    }

    /// The same commands from the same snapshot give the same state, answers and events.
    #[test]
    fn replay_from_a_snapshot_is_deterministic(prefix in steps(), rest in steps()) {
        let mut checker = Checker::new();
        for step in &prefix {
            checker.step(step)?;
        }
        let snapshot = bincode::serialize(&checker.table).expect("serialize");
        let split = checker.log.len();
        for step in &rest {
            checker.step(step)?;
        }
        let mut restored: LockTable = bincode::deserialize(&snapshot).expect("deserialize");
        for (stamp, command, outcome, events) in &checker.log[split..] {
            let mut replayed = Vec::new();
            let again = restored.apply(*stamp, command.clone(), &mut replayed);
            prop_assert_eq!(&again, outcome);
            prop_assert_eq!(&replayed, events);
        }
        prop_assert_eq!(&restored, &checker.table);
        prop_assert_eq!(bincode::serialize(&restored).expect("serialize"), bincode::serialize(&checker.table).expect("serialize"));
    }
}

/// Guards the generator: random runs must reach the interesting cases.
#[test]
fn random_runs_reach_contention_queues_and_expiry() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for _ in 0..100 {
        let steps = steps().new_tree(&mut runner).expect("tree").current();
        let mut checker = Checker::new();
        for step in &steps {
            checker.step(step).expect("properties hold");
        }
        for (_, command, outcome, events) in &checker.log {
            let name = match outcome {
                Err(leasehold_core::LockError::Invalid { field, .. }) if field == "request_id" => {
                    "request id reused"
                }
                Ok(Response::Acquired(_)) => "acquired",
                Ok(Response::Queued { .. }) => "queued",
                Ok(Response::Released) => "released",
                Err(e) => e.code(),
                Ok(_) => "other",
            };
            *counts.entry(name).or_default() += 1;
            for e in events {
                if matches!(e, Event::Expired { .. }) {
                    *counts.entry("expired").or_default() += 1;
                }

                if matches!(e, Event::Acquired { .. })
                    && !matches!(command, Command::Acquire { .. })
                {
                    *counts.entry("granted from a queue").or_default() += 1;
                }
            }
        }
    }
    for case in [
        "acquired",
        "queued",
        "released",
        "held",
        "stale_fence",
        "lease_expired",
        "expired",
        "lock_delayed",
        "request id reused",
    ] {
        assert!(
            counts.get(case).copied().unwrap_or(0) >= 5,
            "too few {case}: {counts:?}"
        );
    }
    assert!(
        counts.get("granted from a queue").copied().unwrap_or(0) >= 5,
        "queues never advanced: {counts:?}"
    );
}
