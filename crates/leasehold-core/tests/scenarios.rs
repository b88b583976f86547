//! Named scenarios from the design, one behaviour each.

use leasehold_core::{Command, Event, LockError, LockTable, Mode, Response, Stamp, WaitEnd};

struct T {
    table: LockTable,
    now: u64,
    epoch: u64,
    events: Vec<Event>,
}

impl T {
    fn new() -> Self {
        T {
            table: LockTable::new(),
            now: 0,
            epoch: 1,
            events: Vec::new(),
        }
    }
    fn at(&mut self, now: u64) -> &mut Self {
        self.now = now;
        self
    }
    fn run(&mut self, command: Command) -> Result<Response, LockError> {
        self.events.clear();
        let out = self.table.apply(
            Stamp {
                now: self.now,
                epoch: self.epoch,
            },
            command,
            &mut self.events,
        );
        self.table.check_invariants().expect("invariants");
        out
    }
    fn lease(&mut self, ttl_ms: u64, holder: &str) -> u64 {
        match self.run(Command::Grant {
            ttl_ms,
            holder: holder.into(),
            request_id: 0,
        }) {
            Ok(Response::LeaseGranted { lease, .. }) => lease,
            other => panic!("grant: {other:?}"),
        }
    }
    fn acquire(&mut self, lease: u64, key: &str, wait_ms: u64) -> Result<Response, LockError> {
        self.run(Command::Acquire {
            lease,
            key: key.into(),
            wait_ms,
            lock_delay_ms: 0,
            request_id: 0,
            mode: leasehold_core::Mode::Exclusive,
        })
    }
    fn acquire_as(
        &mut self,
        lease: u64,
        key: &str,
        mode: Mode,
        wait_ms: u64,
    ) -> Result<Response, LockError> {
        self.run(Command::Acquire {
            lease,
            key: key.into(),
            wait_ms,
            lock_delay_ms: 0,
            request_id: 0,
            mode,
        })
    }
    fn fence(&mut self, lease: u64, key: &str) -> u64 {
        match self.acquire(lease, key, 0) {
            Ok(Response::Acquired(g)) => g.fence,
            other => panic!("acquire: {other:?}"),
        }
    }
    /// Runs `wait` twice (attempts 1 and 2), then the first attempt's
    /// `cancel`, which must change nothing.
    fn wait_twice_and_give_up_the_first(&mut self, wait: &Command, cancel: Command) {
        for attempt in [1, 2] {
            match self.run(wait.clone()) {
                Ok(Response::Queued { attempt: a, .. }) => assert_eq!(a, attempt),
                other => panic!("attempt {attempt}: {other:?}"),
            }
        }
        let before = self.table.clone();
        self.run(cancel).unwrap();
        assert_eq!(self.table, before);
        assert!(self.events.is_empty());
    }
    /// The lease holding `key` now, and its token.
    fn held_by(&self, key: &str) -> Option<(u64, u64)> {
        let holder = self.table.lock(key, self.now)?.holder?;
        Some((holder.lease, holder.fence))
    }
    fn granted(&self) -> Vec<(String, u64, u64)> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::Acquired {
                    key, lease, fence, ..
                } => Some((key.to_string(), *lease, *fence)),
                _ => None,
            })
            .collect()
    }
}

#[test]
fn contention_names_the_holder() {
    let mut t = T::new();
    let a = t.lease(1_000, "host-a");
    let b = t.lease(1_000, "host-b");
    let fence = t.fence(a, "job");
    match t.acquire(b, "job", 0) {
        Err(LockError::Held {
            holder,
            lease,
            fence: f,
            ..
        }) => {
            assert_eq!((holder.as_str(), lease, f), ("host-a", a, fence));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn waiters_are_granted_in_fifo_order_in_the_step_that_frees_the_key() {
    let mut t = T::new();
    let [a, b, c, d] = ["a", "b", "c", "d"].map(|h| t.lease(10_000, h));
    let fa = t.fence(a, "k");
    for w in [c, b, d] {
        assert!(matches!(
            t.acquire(w, "k", 5_000),
            Ok(Response::Queued { .. })
        ));
    }
    t.run(Command::Release {
        key: "k".into(),
        fence: fa,
        request_id: 0,
    })
    .unwrap();
    let g = t.granted();
    assert_eq!(g.len(), 1);
    assert_eq!(g[0].1, c);
    assert!(g[0].2 > fa);
    let fc = g[0].2;
    t.run(Command::Revoke { lease: c }).unwrap();
    assert_eq!(t.granted()[0].1, b);
    assert!(t.granted()[0].2 > fc);
}

#[test]
fn expiry_frees_the_key_and_grants_the_next_waiter() {
    let mut t = T::new();
    let a = t.lease(100, "a");
    let b = t.lease(10_000, "b");
    t.fence(a, "k");
    t.acquire(b, "k", 5_000).unwrap();
    t.at(99).run(Command::Tick).unwrap();
    assert!(t.granted().is_empty());
    t.at(100).run(Command::Tick).unwrap();
    assert!(t
        .events
        .iter()
        .any(|e| matches!(e, Event::Expired { lease, .. } if *lease == a)));
    assert_eq!(t.granted()[0].1, b);
}

#[test]
fn renewal_after_expiry_is_a_distinct_error() {
    let mut t = T::new();
    let a = t.lease(100, "a");
    t.at(50).run(Command::KeepAlive { lease: a }).unwrap();
    t.at(149).run(Command::KeepAlive { lease: a }).unwrap();
    assert_eq!(
        t.at(249).run(Command::KeepAlive { lease: a }),
        Err(LockError::LeaseExpired { lease: a })
    );
    assert_eq!(
        t.run(Command::KeepAlive { lease: 99 }),
        Err(LockError::LeaseNotFound { lease: 99 })
    );
}

#[test]
fn stale_release_changes_nothing_and_names_both_tokens() {
    let mut t = T::new();
    let a = t.lease(100, "a");
    let old = t.fence(a, "k");
    t.at(200).run(Command::Tick).unwrap();
    let b = t.lease(1_000, "b");
    let new = t.fence(b, "k");
    let before = t.table.clone();
    let err = t
        .run(Command::Release {
            key: "k".into(),
            fence: old,
            request_id: 0,
        })
        .unwrap_err();
    assert_eq!(
        err,
        LockError::StaleFence {
            key: "k".into(),
            presented: old,
            current: Some(new)
        }
    );
    assert!(err
        .to_string()
        .contains(&format!("presented {old}, current {new}")));
    assert_eq!(t.table, before);
}

#[test]
fn the_next_holder_receives_the_checkpoint() {
    let mut t = T::new();
    let a = t.lease(1_000, "a");
    let b = t.lease(1_000, "b");
    let fa = t.fence(a, "job");
    t.run(Command::SaveCheckpoint {
        key: "job".into(),
        fence: fa,
        data: b"item 41".to_vec(),
    })
    .unwrap();
    t.run(Command::Release {
        key: "job".into(),
        fence: fa,
        request_id: 0,
    })
    .unwrap();
    match t.acquire(b, "job", 0) {
        Ok(Response::Acquired(g)) => {
            let cp = g.checkpoint.expect("checkpoint");
            assert_eq!((&*cp.data, cp.fence), (&b"item 41"[..], fa));
        }
        other => panic!("{other:?}"),
    }
    // A stale holder cannot overwrite it.
    let err = t.run(Command::SaveCheckpoint {
        key: "job".into(),
        fence: fa,
        data: b"x".to_vec(),
    });
    assert!(matches!(err, Err(LockError::StaleFence { .. })));
}

#[test]
fn lock_delay_applies_after_expiry_but_not_after_release() {
    let mut t = T::new();
    let a = t.lease(100, "a");
    let b = t.lease(10_000, "b");
    t.run(Command::Acquire {
        lease: a,
        key: "k".into(),
        wait_ms: 0,
        lock_delay_ms: 500,
        request_id: 0,
        mode: leasehold_core::Mode::Exclusive,
    })
    .unwrap();
    t.at(100).run(Command::Tick).unwrap();
    assert!(matches!(
        t.acquire(b, "k", 0),
        Err(LockError::LockDelayed { left_ms: 500, .. })
    ));
    t.acquire(b, "k", 1_000).unwrap();
    t.at(599).run(Command::Tick).unwrap();
    assert!(t.granted().is_empty());
    t.at(600).run(Command::Tick).unwrap();
    assert_eq!(t.granted()[0].1, b);

    let c = t.lease(10_000, "c");
    let fc = t.fence(c, "clean");
    t.run(Command::Release {
        key: "clean".into(),
        fence: fc,
        request_id: 0,
    })
    .unwrap();
    t.fence(b, "clean");
}

#[test]
fn a_new_epoch_gives_every_lease_its_full_ttl_again() {
    let mut t = T::new();
    let a = t.lease(1_000, "a");
    t.fence(a, "k");
    t.epoch = 2;
    t.at(900).run(Command::Tick).unwrap();
    // Its own deadline (1,000) passes: the takeover's (1,900) holds.
    t.at(1_000).run(Command::Tick).unwrap();
    let left = t.table.lease(a, 1_000).map(|l| l.ttl_left_ms);
    assert_eq!(left, Some(900), "the lease shows the deadline in effect");
    t.at(1_800).run(Command::Tick).unwrap();
    assert!(
        t.table.lock("k", 1_800).and_then(|l| l.holder).is_some(),
        "expired early after a leader change"
    );
    t.at(1_900).run(Command::Tick).unwrap();
    assert!(t.table.lock("k", 1_900).is_none());
}

#[test]
fn each_takeover_gives_a_full_ttl_from_itself_and_a_renewal_from_itself() {
    let mut t = T::new();
    let a = t.lease(1_000, "a");
    let b = t.lease(1_000, "b");
    t.fence(a, "ka");
    t.fence(b, "kb");
    t.epoch = 2;
    t.at(500).run(Command::Tick).unwrap();
    // A second takeover before anything came due: 1,700 for both.
    t.epoch = 3;
    t.at(700).run(Command::Tick).unwrap();
    // b is renewed after it: 2,100 for b.
    t.at(1_100).run(Command::KeepAlive { lease: b }).unwrap();
    t.at(1_699).run(Command::Tick).unwrap();
    assert!(t.table.lease(a, 1_699).is_some(), "a expired early");
    t.at(1_700).run(Command::Tick).unwrap();
    assert!(t.table.lease(a, 1_700).is_none(), "a outlived its TTL");
    assert!(t.table.lock("ka", 1_700).is_none());
    t.at(2_099).run(Command::Tick).unwrap();
    assert!(t.table.lease(b, 2_099).is_some(), "b expired early");
    t.at(2_100).run(Command::Tick).unwrap();
    assert!(t.table.lease(b, 2_100).is_none(), "b outlived its TTL");
}

#[test]
fn a_retried_request_id_never_acts_twice() {
    let mut t = T::new();
    let a = t.lease(10_000, "a");
    let acquire = Command::Acquire {
        lease: a,
        key: "k".into(),
        wait_ms: 0,
        lock_delay_ms: 0,
        request_id: 7,
        mode: leasehold_core::Mode::Exclusive,
    };
    let first = t.run(acquire.clone()).unwrap();
    let Response::Acquired(g) = &first else {
        panic!()
    };
    t.run(Command::Release {
        key: "k".into(),
        fence: g.fence,
        request_id: 8,
    })
    .unwrap();
    // The reply to the acquire was lost and it is retried after the release:
    // the first answer comes back and nothing is granted.
    assert_eq!(t.run(acquire).unwrap(), first);
    assert!(t.events.is_empty());
    assert!(t.table.lock("k", t.now).is_none());
    assert_eq!(
        t.run(Command::Release {
            key: "k".into(),
            fence: g.fence,
            request_id: 8
        }),
        Ok(Response::Released)
    );
}

#[test]
fn a_cancelled_wait_takes_back_a_grant_its_caller_never_saw() {
    let mut t = T::new();
    let a = t.lease(10_000, "a");
    let b = t.lease(10_000, "b");
    let fa = t.fence(a, "k");
    t.run(Command::Acquire {
        lease: b,
        key: "k".into(),
        wait_ms: 5_000,
        lock_delay_ms: 0,
        request_id: 3,
        mode: leasehold_core::Mode::Exclusive,
    })
    .unwrap();
    t.run(Command::Release {
        key: "k".into(),
        fence: fa,
        request_id: 0,
    })
    .unwrap();
    assert_eq!(t.granted()[0].1, b);
    t.run(Command::CancelWait {
        lease: b,
        key: "k".into(),
        request_id: 3,
        attempt: 1,
    })
    .unwrap();
    assert!(t.table.lock("k", t.now).is_none());
    // A wait that times out leaves the queue.
    let fa = t.fence(a, "k");
    t.acquire(b, "k", 100).unwrap();
    t.at(t.now + 100).run(Command::Tick).unwrap();
    assert!(t.events.iter().any(|e| matches!(
        e,
        Event::WaitEnded {
            reason: WaitEnd::TimedOut,
            ..
        }
    )));
    t.run(Command::Release {
        key: "k".into(),
        fence: fa,
        request_id: 0,
    })
    .unwrap();
    assert!(t.granted().is_empty());
}

/// Equal tables give equal snapshot bytes however their remembered answers
/// came and went (they are kept in a hash map, whose order is not the ids').
#[test]
fn a_restored_table_serializes_to_the_same_bytes() {
    let mut t = T::new();
    let lease = t.lease(3_600_000, "a");
    let take = |t: &mut T, key: String, request_id: u64| {
        let out = t.run(Command::Acquire {
            lease,
            key,
            wait_ms: 0,
            lock_delay_ms: 0,
            request_id,
            mode: leasehold_core::Mode::Exclusive,
        });
        assert!(matches!(out, Ok(Response::Acquired(_))), "{out:?}");
    };
    for i in 0..1_000u64 {
        take(&mut t, format!("old/{i}"), i * 7_919 + 1);
    }
    // Past the retry window: those answers are forgotten, the map keeps its size.
    t.at(120_000);
    for i in 0..40u64 {
        take(&mut t, format!("new/{i}"), (i + 1) * 104_729);
    }
    let bytes = bincode::serialize(&t.table).expect("serialize");
    let restored: LockTable = bincode::deserialize(&bytes).expect("deserialize");
    assert_eq!(restored, t.table);
    assert_eq!(bincode::serialize(&restored).expect("serialize"), bytes);
}

/// Two callers that pick the same request id never get each other's answers:
/// an acquire's id is scoped to its lease, a release's to the token it names,
/// and an id reused for another request is refused by name.
#[test]
fn request_ids_are_scoped_to_their_caller() {
    let mut t = T::new();
    let a = t.lease(10_000, "a");
    let b = t.lease(10_000, "b");
    let acquire = |lease: u64, key: &str| Command::Acquire {
        lease,
        key: key.into(),
        wait_ms: 0,
        lock_delay_ms: 0,
        request_id: 7,
        mode: leasehold_core::Mode::Exclusive,
    };
    let Ok(Response::Acquired(x)) = t.run(acquire(a, "x")) else {
        panic!("a takes x")
    };
    // b picked the same id for another key: its own request, acted on.
    let Ok(Response::Acquired(y)) = t.run(acquire(b, "y")) else {
        panic!("b takes y")
    };
    assert_eq!((x.lease, y.lease), (a, b));
    assert!(y.fence > x.fence);
    assert_eq!(t.table.lock("y", t.now).unwrap().holder.unwrap().lease, b);
    // a reuses its id for another key: refused, naming the id, nothing changes.
    let before = t.table.clone();
    match t.run(acquire(a, "z")) {
        Err(LockError::Invalid { field, reason }) => {
            assert_eq!(field, "request_id");
            assert!(reason.contains("7") && reason.contains("\"x\""), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(t.table, before);

    // A release with another caller's id releases what it names.
    let release = |key: &str, fence: u64| Command::Release {
        key: key.into(),
        fence,
        request_id: 9,
    };
    t.run(release("x", x.fence)).unwrap();
    t.run(release("y", y.fence)).unwrap();
    assert!(t.table.lock("y", t.now).is_none(), "y was really released");
    // The same release retried: the first answer. A stale token with a fresh id: refused.
    assert_eq!(t.run(release("x", x.fence)), Ok(Response::Released));
    assert!(matches!(
        t.run(Command::Release {
            key: "x".into(),
            fence: x.fence,
            request_id: 10
        }),
        Err(LockError::StaleFence { .. })
    ));
}

/// A grant is retry-safe, and "grant a lease and acquire" is one command: a
/// retry answers with the same lease and token and leaks nothing; a refusal
/// leaves no lease behind.
#[test]
fn grants_and_grant_and_acquire_answer_a_retry_with_the_same_lease() {
    let mut t = T::new();
    let grant = Command::Grant {
        ttl_ms: 10_000,
        holder: "g".into(),
        request_id: 5,
    };
    let first = t.run(grant.clone()).unwrap();
    assert_eq!(t.run(grant).unwrap(), first);
    assert_eq!(t.table.lease_count(), 1);
    assert!(matches!(
        t.run(Command::Grant {
            ttl_ms: 20_000,
            holder: "g".into(),
            request_id: 5
        }),
        Err(LockError::Invalid { .. })
    ));

    let take = |key: &str, wait_ms: u64| Command::GrantAndAcquire {
        ttl_ms: 30_000,
        holder: "curl".into(),
        key: key.into(),
        wait_ms,
        lock_delay_ms: 0,
        request_id: 9,
        mode: leasehold_core::Mode::Exclusive,
    };
    let Ok(Response::Acquired(r)) = t.run(take("r", 0)) else {
        panic!()
    };
    let leases = t.table.lease_count();
    assert_eq!(t.run(take("r", 0)), Ok(Response::Acquired(r.clone())));
    assert_eq!(t.table.lease_count(), leases, "a retry grants no lease");
    assert_eq!(
        t.table.lock("r", t.now).unwrap().holder.unwrap().lease,
        r.lease
    );
    // The same id for another key is another request: refused.
    assert!(matches!(
        t.run(take("s", 0)),
        Err(LockError::Invalid { .. })
    ));

    // Refused because held: no lease is left behind.
    let before = t.table.clone();
    let refused = t.run(Command::GrantAndAcquire {
        ttl_ms: 30_000,
        holder: "other".into(),
        key: "r".into(),
        wait_ms: 0,
        lock_delay_ms: 0,
        request_id: 10,
        mode: leasehold_core::Mode::Exclusive,
    });
    assert!(
        matches!(refused, Err(LockError::Held { .. })),
        "{refused:?}"
    );
    assert_eq!(t.table, before);

    // Queued on a new lease; the retry keeps its place and gets the grant.
    let wait = Command::GrantAndAcquire {
        ttl_ms: 30_000,
        holder: "waiter".into(),
        key: "r".into(),
        wait_ms: 5_000,
        lock_delay_ms: 0,
        request_id: 11,
        mode: leasehold_core::Mode::Exclusive,
    };
    let Ok(Response::Queued { lease: w, .. }) = t.run(wait.clone()) else {
        panic!()
    };
    assert!(matches!(t.run(wait.clone()), Ok(Response::Queued { lease, .. }) if lease == w));
    t.run(Command::Release {
        key: "r".into(),
        fence: r.fence,
        request_id: 0,
    })
    .unwrap();
    let Ok(Response::Acquired(g)) = t.run(wait) else {
        panic!()
    };
    assert_eq!(g.lease, w);
    assert_eq!(
        t.table.lock("r", t.now).unwrap().holder.unwrap().fence,
        g.fence
    );
}

/// A waiting call's attempts: its caller gave up on the first (its node was
/// cut off, say) and asked again through another node. The first attempt's
/// withdrawal, arriving later, must leave alone the wait, and then the
/// grant, that the second one is answering; the second one's own
/// withdrawal still works.
#[test]
fn an_abandoned_attempt_of_a_wait_cannot_withdraw_it_from_a_later_one() {
    let mut t = T::new();
    let a = t.lease(10_000, "a");
    let b = t.lease(10_000, "b");
    let fa = t.fence(a, "k");
    let wait = Command::Acquire {
        lease: b,
        key: "k".into(),
        wait_ms: 5_000,
        lock_delay_ms: 0,
        request_id: 3,
        mode: Mode::Exclusive,
    };
    let cancel = |attempt| Command::CancelWait {
        lease: b,
        key: "k".into(),
        request_id: 3,
        attempt,
    };
    // The first attempt gives up while the second waits: nothing changes.
    t.wait_twice_and_give_up_the_first(&wait, cancel(1));
    // Granted to the wait, and the second attempt is answered with it.
    t.run(Command::Release {
        key: "k".into(),
        fence: fa,
        request_id: 0,
    })
    .unwrap();
    let held = t.held_by("k");
    let fb = match held {
        Some((lease, fence)) if lease == b => fence,
        other => panic!("not granted to the wait: {other:?}"),
    };
    // The first attempt's withdrawal comes only now: the grant stays.
    t.run(cancel(1)).unwrap();
    assert_eq!(t.held_by("k"), held);
    // A third attempt comes back for the grant (its answer was lost): the
    // second can no longer take it back either.
    assert!(matches!(t.run(wait.clone()), Ok(Response::Acquired(g)) if g.fence == fb));
    t.run(cancel(2)).unwrap();
    assert_eq!(t.held_by("k"), held);
    // The latest attempt's withdrawal takes the grant back.
    t.run(cancel(3)).unwrap();
    assert!(t.table.lock("k", t.now).is_none());
    // And a withdrawal that names no attempt withdraws whichever it is.
    let fa = t.fence(a, "k");
    assert!(matches!(
        t.run(wait.clone()),
        Ok(Response::Queued { attempt: 1, .. })
    ));
    t.run(cancel(0)).unwrap();
    t.run(Command::Release {
        key: "k".into(),
        fence: fa,
        request_id: 0,
    })
    .unwrap();
    assert!(t.table.lock("k", t.now).is_none());
}

/// The same for a set's wait: its keys' waits move on together.
#[test]
fn an_abandoned_attempt_of_a_set_wait_cannot_withdraw_it_from_a_later_one() {
    let mut t = T::new();
    let a = t.lease(10_000, "a");
    let b = t.lease(10_000, "b");
    let fa = t.fence(a, "y");
    let wait = Command::AcquireSet {
        lease: b,
        keys: vec!["x".into(), "y".into()],
        wait_ms: 5_000,
        lock_delay_ms: 0,
        request_id: 4,
    };
    let cancel = |attempt| Command::CancelWait {
        lease: b,
        key: "x".into(),
        request_id: 4,
        attempt,
    };
    t.wait_twice_and_give_up_the_first(&wait, cancel(1));
    t.run(Command::Release {
        key: "y".into(),
        fence: fa,
        request_id: 0,
    })
    .unwrap();
    let held = (t.held_by("x"), t.held_by("y"));
    assert!(matches!(held, (Some((l, f)), Some((m, g))) if l == b && m == b && f == g));
    t.run(cancel(1)).unwrap();
    assert_eq!((t.held_by("x"), t.held_by("y")), held);
    t.run(cancel(2)).unwrap();
    assert_eq!((t.held_by("x"), t.held_by("y")), (None, None));
}

/// After a new leadership (a restart), a queued waiter whose caller does not
/// come back within REATTACH_MS is withdrawn, and a grant made to it in that
/// window is taken back; a caller that comes back keeps its place and grant.
#[test]
fn waiters_nobody_comes_back_for_after_a_new_leadership_are_withdrawn() {
    use leasehold_core::REATTACH_MS;
    let mut t = T::new();
    let [a, ghost, live] = ["a", "ghost", "live"].map(|h| t.lease(60_000, h));
    let fa = t.fence(a, "job");
    let wait = |lease: u64, request_id: u64| Command::Acquire {
        lease,
        key: "job".into(),
        wait_ms: 60_000,
        lock_delay_ms: 0,
        request_id,
        mode: leasehold_core::Mode::Exclusive,
    };
    t.run(wait(ghost, 1)).unwrap();
    t.run(wait(live, 2)).unwrap();

    // The server restarts: a new epoch. The holder releases at once; the
    // ghost is first in line and gets a grant nobody will receive.
    t.epoch += 1;
    t.at(1_000).run(Command::Tick).unwrap();
    t.run(Command::Release {
        key: "job".into(),
        fence: fa,
        request_id: 0,
    })
    .unwrap();
    assert_eq!(t.granted()[0].1, ghost);
    // The live caller comes back (its retry with the same id).
    assert!(matches!(t.run(wait(live, 2)), Ok(Response::Queued { .. })));

    // Nobody came for the ghost's grant: taken back, and the live waiter gets it.
    t.at(1_000 + REATTACH_MS).run(Command::Tick).unwrap();
    let holder = t.table.lock("job", t.now).unwrap().holder.unwrap();
    assert_eq!(
        holder.lease, live,
        "the ghost's grant went to the live waiter"
    );
    assert_eq!(t.granted()[0].1, live);
    // The ghost's late retry is not answered with the grant taken back.
    assert!(matches!(t.run(wait(ghost, 1)), Ok(Response::Queued { .. })));

    // Another restart: a queued waiter that never comes back is withdrawn
    // with its reason; one that does stays in line.
    let c = t.lease(60_000, "c");
    t.run(wait(c, 3)).unwrap();
    t.epoch += 1;
    t.at(10_000).run(Command::Tick).unwrap();
    t.at(10_500).run(wait(c, 3)).unwrap();
    t.at(10_000 + REATTACH_MS).run(Command::Tick).unwrap();
    assert!(t.events.iter().any(|e| matches!(
        e,
        Event::WaitEnded { lease, reason: WaitEnd::Abandoned, .. } if *lease == ghost
    )));
    let waiters: Vec<u64> = t
        .table
        .lock("job", t.now)
        .unwrap()
        .waiters
        .iter()
        .map(|w| w.lease)
        .collect();
    assert_eq!(waiters, vec![c]);
}

/// A list of leases shows a bounded number of each lease's keys and the
/// count of all of them; describing one lease shows every key.
#[test]
fn lease_lists_cap_the_keys_they_show() {
    let mut t = T::new();
    let a = t.lease(10_000, "a");
    for i in 0..25 {
        let acquired = t.run(Command::Acquire {
            lease: a,
            key: format!("k{i:02}"),
            wait_ms: 0,
            lock_delay_ms: 0,
            request_id: 0,
            mode: leasehold_core::Mode::Exclusive,
        });
        assert!(
            matches!(acquired, Ok(Response::Acquired(_))),
            "{acquired:?}"
        );
    }
    let listed = t.table.leases(0, 10, 10, t.now);
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].keys.len(), 10);
    assert_eq!(listed[0].key_count, 25);
    assert_eq!(listed[0].keys[0], "k00");
    let one = t.table.lease(a, t.now).expect("live");
    assert_eq!((one.keys.len(), one.key_count), (25, 25));
}

fn fence_of(r: Result<Response, LockError>) -> u64 {
    match r {
        Ok(Response::Acquired(g)) => g.fence,
        other => panic!("not granted: {other:?}"),
    }
}

#[test]
fn a_semaphore_admits_its_permits_and_queues_the_rest_in_order() {
    let mut t = T::new();
    let sem = Mode::Permit { permits: 2 };
    let [a, b, c, d] = ["a", "b", "c", "d"].map(|h| t.lease(10_000, h));
    let fa = fence_of(t.acquire_as(a, "api", sem, 0));
    let fb = fence_of(t.acquire_as(b, "api", sem, 0));
    assert!(fb > fa, "each permit has its own token");
    assert!(matches!(
        t.acquire_as(c, "api", sem, 0),
        Err(LockError::Held { .. })
    ));
    assert!(matches!(
        t.acquire_as(c, "api", sem, 5_000),
        Ok(Response::Queued { position: 0, .. })
    ));
    assert!(matches!(
        t.acquire_as(d, "api", sem, 5_000),
        Ok(Response::Queued { position: 1, .. })
    ));
    // Another size, or a plain lock, is refused while the semaphore is in use.
    let e = t
        .acquire_as(d, "api", Mode::Permit { permits: 3 }, 0)
        .unwrap_err();
    assert!(e.to_string().contains("semaphore of 2 permits"), "{e}");
    assert!(t.acquire_as(d, "api", Mode::Exclusive, 0).is_err());
    t.run(Command::Release {
        key: "api".into(),
        fence: fa,
        request_id: 0,
    })
    .expect("release");
    let view = t.table.lock("api", 0).expect("held");
    let holders: Vec<u64> = view.holders.iter().map(|h| h.lease).collect();
    assert_eq!(
        holders,
        vec![b, c],
        "the first waiter took the freed permit"
    );
    assert_eq!(view.permits, 2);
    // Once nobody holds or waits, the key may be anything again.
    t.run(Command::Revoke { lease: b }).expect("revoke");
    t.run(Command::Revoke { lease: c }).expect("revoke");
    t.run(Command::Revoke { lease: d }).expect("revoke");
    assert!(t.table.lock("api", 0).is_none());
    fence_of(t.acquire_as(a, "api", Mode::Permit { permits: 5 }, 0));
}

#[test]
fn readers_share_and_a_waiting_writer_stops_new_readers() {
    let mut t = T::new();
    let [r1, r2, w, r3] = ["r1", "r2", "w", "r3"].map(|h| t.lease(10_000, h));
    let f1 = fence_of(t.acquire_as(r1, "doc", Mode::Shared, 0));
    let f2 = fence_of(t.acquire_as(r2, "doc", Mode::Shared, 0));
    assert!(matches!(
        t.acquire_as(w, "doc", Mode::Exclusive, 5_000),
        Ok(Response::Queued { .. })
    ));
    // The writer waits, so a new reader queues behind it instead of joining.
    assert!(matches!(
        t.acquire_as(r3, "doc", Mode::Shared, 20_000),
        Ok(Response::Queued { position: 1, .. })
    ));
    // A reader cannot turn itself into a writer: it would wait for itself.
    assert!(t.acquire_as(r1, "doc", Mode::Exclusive, 0).is_err());
    t.run(Command::Release {
        key: "doc".into(),
        fence: f1,
        request_id: 0,
    })
    .expect("release");
    assert_eq!(t.table.lock("doc", 0).expect("held").holders.len(), 1);
    t.run(Command::Release {
        key: "doc".into(),
        fence: f2,
        request_id: 0,
    })
    .expect("release");
    let view = t.table.lock("doc", 0).expect("held");
    assert_eq!(view.holders.len(), 1);
    assert_eq!(
        (view.holders[0].lease, view.holders[0].mode),
        (w, "exclusive")
    );
    // The writer's lease expires: the reader behind it is granted in that step.
    t.run(Command::KeepAlive { lease: r3 }).expect("renew");
    t.at(9_000)
        .run(Command::KeepAlive { lease: r3 })
        .expect("renew");
    t.at(10_500).run(Command::Tick).expect("tick");
    let view = t.table.lock("doc", 10_500).expect("held");
    assert_eq!(
        view.holders.iter().map(|h| h.lease).collect::<Vec<_>>(),
        vec![r3]
    );
}

#[test]
fn readers_behind_a_writer_that_gives_up_are_granted_at_once() {
    let mut t = T::new();
    let [r1, w, r2] = ["r1", "w", "r2"].map(|h| t.lease(10_000, h));
    fence_of(t.acquire_as(r1, "doc", Mode::Shared, 0));
    assert!(matches!(
        t.acquire_as(w, "doc", Mode::Exclusive, 100),
        Ok(Response::Queued { .. })
    ));
    assert!(matches!(
        t.acquire_as(r2, "doc", Mode::Shared, 5_000),
        Ok(Response::Queued { .. })
    ));
    // The writer's wait times out: the reader behind it joins the reader holding.
    t.at(200).run(Command::Tick).expect("tick");
    let view = t.table.lock("doc", 200).expect("held");
    assert_eq!(
        view.holders.iter().map(|h| h.lease).collect::<Vec<_>>(),
        vec![r1, r2]
    );
    assert!(view.waiters.is_empty());
}

#[test]
fn the_work_of_a_command_counts_the_keys_of_every_lease_it_ends() {
    let mut t = T::new();
    let a = t.lease(1_000, "a");
    let b = t.lease(5_000, "b");
    for key in ["a/1", "a/2", "a/3"] {
        t.acquire(a, key, 0).expect("acquire");
    }
    for key in ["b/1", "b/2"] {
        t.acquire(b, key, 0).expect("acquire");
    }
    // b also waits behind a for one key.
    assert!(matches!(
        t.acquire(b, "a/1", 10_000),
        Ok(Response::Queued { .. })
    ));
    let at = |now| Stamp { now, epoch: 1 };
    let tick = [Command::Tick];
    assert_eq!(t.table.work(at(500), &tick), 1, "nothing is due yet");
    assert_eq!(
        t.table.work(at(1_000), &tick),
        1 + 3,
        "a expires: its 3 keys"
    );
    assert_eq!(
        t.table.work(at(5_000), &tick),
        1 + 3 + 3,
        "both expire: b's 2 keys and its wait too"
    );
    assert_eq!(
        t.table.work(at(10_100), &tick),
        1 + 3 + 3 + 1,
        "and b's wait times out"
    );
    let revoke_b = [Command::Revoke { lease: b }];
    assert_eq!(t.table.work(at(500), &revoke_b), 1 + 3);
    let wrapped = [Command::As {
        token: None,
        command: Box::new(Command::Revoke { lease: b }),
    }];
    assert_eq!(t.table.work(at(500), &wrapped), 1 + 3, "seen through As");
    let two = [Command::Tick, Command::Revoke { lease: 99 }];
    assert_eq!(
        t.table.work(at(500), &two),
        2,
        "an unknown lease ends nothing"
    );
    // A newer epoch detaches every queued wait (b's on a/1), and walks
    // neither the leases nor the keys: their restamp is lazy.
    let restamp = Stamp { now: 500, epoch: 2 };
    assert_eq!(t.table.work(restamp, &tick), 1 + 1);
}
