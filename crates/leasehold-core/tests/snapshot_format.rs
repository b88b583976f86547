//! The snapshot format is a promise: a server restores a table from the
//! bytes an older build wrote, and replicas of different builds exchange
//! snapshots. `bincode::serialize(&table)` is what a server writes.
//!
//! `fixtures/table-v1.bin` was written from the table built here;
//! `fixtures/table-v1-views.txt` holds what that table showed through its
//! public views, and `fixtures/table-v1-continued.txt` what it answered and
//! told in the steps after. Today's build must write the same table to
//! exactly those bytes, read them back into a table equal to the one built
//! (indexes and counts rebuilt included), and show and do the same. A missing fixture is
//! written on the first run, from the build that runs; a fixture that exists
//! is never rewritten, so a change of format fails here.

use std::fmt::Write as _;
use std::path::PathBuf;

use leasehold_core::auth::{hash_secret, AuthChange, Permission, Rule};
use leasehold_core::{Command, Event, LockTable, Mode, Response, Stamp};

/// Drives a table with a stamped clock, checking its invariants after every step.
struct Driver {
    table: LockTable,
    stamp: Stamp,
    events: Vec<Event>,
}

impl Driver {
    fn run(&mut self, command: Command) -> Response {
        let out = self.table.apply(self.stamp, command, &mut self.events);
        self.table.check_invariants().expect("invariants");
        out.expect("every command here succeeds")
    }

    fn at(&mut self, now: u64, epoch: u64) {
        self.stamp = Stamp { now, epoch };
    }

    fn grant(&mut self, ttl_ms: u64, holder: &str, request_id: u64) -> u64 {
        match self.run(Command::Grant {
            ttl_ms,
            holder: holder.into(),
            request_id,
        }) {
            Response::LeaseGranted { lease, .. } => lease,
            other => panic!("grant: {other:?}"),
        }
    }

    fn acquire(
        &mut self,
        lease: u64,
        key: &str,
        mode: Mode,
        wait_ms: u64,
        request_id: u64,
    ) -> Response {
        self.run(Command::Acquire {
            lease,
            key: key.into(),
            wait_ms,
            lock_delay_ms: 0,
            request_id,
            mode,
        })
    }

    fn fence(&mut self, lease: u64, key: &str, request_id: u64) -> u64 {
        match self.acquire(lease, key, Mode::Exclusive, 0, request_id) {
            Response::Acquired(grant) => grant.fence,
            other => panic!("acquire: {other:?}"),
        }
    }

    fn auth(&mut self, change: AuthChange) -> Option<u64> {
        match self.run(Command::Auth {
            change,
            at_unix_ms: 1_700_000_000_000,
        }) {
            Response::AuthChanged { token } => token,
            other => panic!("auth: {other:?}"),
        }
    }
}

const HOUR: u64 = 3_600_000;
const WAIT: u64 = 600_000;

/// A table with something in every part of the snapshot: leases (one owned
/// by a token), exclusive, shared and semaphore holds, a checkpoint, queued
/// waits, a lock-delay in effect, waits and a grant that wait for their
/// callers to come back after a new leadership, a held and a waiting lock
/// set, auth with roles, tokens and audit entries, and remembered answers of
/// every kind of caller. Deterministic: time comes only from the stamps.
fn built() -> LockTable {
    let mut d = Driver {
        table: LockTable::new(),
        stamp: Stamp { now: 0, epoch: 1 },
        events: Vec::new(),
    };

    // Auth: a role, a token, then auth on (which adds root).
    d.auth(AuthChange::SetRole {
        name: "worker".into(),
        rules: vec![
            Rule {
                prefix: "jobs/".into(),
                permission: Permission::Lock,
            },
            Rule {
                prefix: String::new(),
                permission: Permission::Read,
            },
        ],
    });
    d.auth(AuthChange::CreateToken {
        name: "worker-1".into(),
        role: "worker".into(),
        hash: hash_secret("worker-secret"),
    });
    let root = d
        .auth(AuthChange::Enable {
            root_hash: hash_secret("root-secret"),
        })
        .expect("root's token");

    // Leases; two remembered under a request id, one of them owned by root.
    let a = d.grant(HOUR, "alpha", 11);
    let b = d.grant(HOUR, "bravo", 0);
    let c = d.grant(HOUR, "charlie", 0);
    let short = d.grant(1_000, "delta", 0);
    let e = d.grant(HOUR, "echo", 0);
    let owned = match d.run(Command::As {
        token: Some(root),
        command: Box::new(Command::Grant {
            ttl_ms: HOUR,
            holder: "owned".into(),
            request_id: 12,
        }),
    }) {
        Response::LeaseGranted { lease, .. } => lease,
        other => panic!("grant as root: {other:?}"),
    };

    // An exclusive hold with a checkpoint, remembered under its request id,
    // and a wait behind it.
    d.at(100, 1);
    let fa = d.fence(a, "jobs/a", 21);
    d.run(Command::SaveCheckpoint {
        key: "jobs/a".into(),
        fence: fa,
        data: b"page 7 of 12".to_vec(),
    });
    d.acquire(b, "jobs/a", Mode::Exclusive, WAIT, 22);

    // Two readers, a writer waiting behind them, and a semaphore.
    d.acquire(b, "docs/r", Mode::Shared, 0, 0);
    d.acquire(c, "docs/r", Mode::Shared, 0, 0);
    d.acquire(e, "docs/r", Mode::Exclusive, WAIT, 23);
    d.acquire(e, "pool/p", Mode::Permit { permits: 3 }, 0, 0);
    d.acquire(owned, "pool/p", Mode::Permit { permits: 3 }, 0, 0);

    // A hold with a lock-delay, on a lease that will expire.
    d.run(Command::Acquire {
        lease: short,
        key: "jobs/d".into(),
        wait_ms: 0,
        lock_delay_ms: 60_000,
        request_id: 0,
        mode: Mode::Exclusive,
    });

    // A held lock set, and a set waiting behind it on one of its keys.
    d.run(Command::AcquireSet {
        lease: c,
        keys: vec!["set/y".into(), "set/x".into()],
        wait_ms: 0,
        lock_delay_ms: 0,
        request_id: 31,
    });
    d.run(Command::AcquireSet {
        lease: owned,
        keys: vec!["set/x".into(), "set/z".into()],
        wait_ms: WAIT,
        lock_delay_ms: 0,
        request_id: 32,
    });

    // A release remembered under its request id, and a grant-and-acquire.
    let ft = d.fence(a, "tmp/t", 41);
    d.run(Command::Release {
        key: "tmp/t".into(),
        fence: ft,
        request_id: 42,
    });
    d.run(Command::GrantAndAcquire {
        ttl_ms: HOUR,
        holder: "foxtrot".into(),
        key: "jobs/f".into(),
        wait_ms: 0,
        lock_delay_ms: 5_000,
        request_id: 51,
        mode: Mode::Exclusive,
    });

    // A wait that will be granted during the re-attach window.
    let g = d.grant(HOUR, "golf", 0);
    let h = d.grant(HOUR, "hotel", 0);
    let fh = d.fence(h, "jobs/g", 0);
    d.acquire(g, "jobs/g", Mode::Exclusive, WAIT, 61);

    // The short lease expires: its key enters its lock-delay.
    d.at(2_000, 1);
    d.run(Command::Tick);

    // A new leader: every lease restamped, every wait given time to re-attach.
    d.at(3_000, 2);
    d.run(Command::Tick);

    // The grant to a wait nobody came back for yet keeps its re-attach deadline.
    d.at(3_500, 2);
    d.run(Command::Release {
        key: "jobs/g".into(),
        fence: fh,
        request_id: 0,
    });

    // One caller comes back for its wait; a new wait queues after the change.
    d.acquire(e, "docs/r", Mode::Exclusive, WAIT, 23);
    d.acquire(h, "jobs/a", Mode::Exclusive, WAIT, 62);
    d.run(Command::KeepAlive { lease: a });

    d.at(4_000, 2);
    d.run(Command::Tick);
    d.table
}

/// Everything the public API shows of a table, one line per item.
fn views(table: &LockTable) -> String {
    let now = table.now();
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(format!("now {now}"));
    line(format!("epoch {}", table.epoch()));
    line(format!("next fence {}", table.next_fence()));
    line(format!("leases {}", table.lease_count()));
    line(format!("held {}", table.held_count()));
    line(format!("waiters {}", table.waiter_count()));
    line(format!("next deadline {:?}", table.next_deadline()));
    for at in [
        now,
        now + 1_000,
        now + 10_000,
        now + 100_000,
        now + 2 * HOUR,
    ] {
        let stamp = Stamp {
            now: at,
            epoch: table.epoch(),
        };
        line(format!(
            "work at {at}: {}",
            table.work(stamp, &[Command::Tick])
        ));
    }
    let stamp = Stamp {
        now,
        epoch: table.epoch() + 1,
    };
    line(format!(
        "work on a new leadership: {}",
        table.work(stamp, std::iter::empty())
    ));
    for view in table.locks("", None, usize::MAX, now) {
        line(format!("{view:?}"));
    }
    for view in table.leases(0, usize::MAX, usize::MAX, now) {
        line(format!("{view:?}"));
    }
    line(format!("{:?}", table.auth()));
    out
}

/// What the next steps answer and tell, from `table`: proves that a restored
/// table goes on exactly as the original would.
fn continuation(mut table: LockTable) -> String {
    let mut out = String::new();
    let mut events = Vec::new();
    let now = table.now();
    let steps = [
        (now + 1, 2, Command::Tick),
        (
            now + 2,
            2,
            Command::Acquire {
                lease: 1,
                key: "jobs/a".into(),
                wait_ms: 0,
                lock_delay_ms: 0,
                request_id: 21,
                mode: Mode::Exclusive,
            },
        ),
        (now + 3, 2, Command::Revoke { lease: 3 }),
        (now + 10_000, 2, Command::Tick),
        (now + 70_000, 2, Command::Tick),
        (now + 80_000, 3, Command::Tick),
        (now + 2 * HOUR, 3, Command::Tick),
    ];
    for (at, epoch, command) in steps {
        events.clear();
        let outcome = table.apply(Stamp { now: at, epoch }, command, &mut events);
        table.check_invariants().expect("invariants");
        writeln!(out, "{outcome:?} {events:?}").expect("write to a string");
    }
    out.push_str(&views(&table));
    out
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("fixtures")
        .join(name)
}

/// Reads a fixture, writing `made` to it first if it is missing.
fn read_or_write(name: &str, made: &[u8]) -> Vec<u8> {
    let path = fixture(name);
    if !path.exists() {
        std::fs::create_dir_all(path.parent().expect("a fixtures directory")).expect("mkdir");
        // Tests run side by side: write aside, then rename into place, so no
        // test reads a half-written fixture.
        let aside = path.with_file_name(format!("{name}.{:?}.tmp", std::thread::current().id()));
        std::fs::write(&aside, made).expect("write fixture");
        std::fs::rename(&aside, &path).expect("move fixture into place");
        eprintln!("wrote {}", path.display());
    }
    std::fs::read(&path).expect("read fixture")
}

#[test]
fn the_table_is_written_to_the_same_bytes() {
    let table = built();
    let bytes = bincode::serialize(&table).expect("serialize");
    let fixture = read_or_write("table-v1.bin", &bytes);
    assert!(
        bytes == fixture,
        "the snapshot encoding changed: {} bytes now, {} in the fixture; first difference at byte {:?}",
        bytes.len(),
        fixture.len(),
        bytes.iter().zip(&fixture).position(|(x, y)| x != y)
    );
}

#[test]
fn the_fixture_reads_back_into_the_same_table() {
    let table = built();
    let fixture = read_or_write(
        "table-v1.bin",
        &bincode::serialize(&table).expect("serialize"),
    );
    let restored: LockTable = bincode::deserialize(&fixture).expect("deserialize the fixture");
    restored
        .check_invariants()
        .expect("invariants of the restored table");
    // Equal in every field, the rebuilt indexes and counts included. (Not
    // compared by their Debug form: remembered answers are kept in a hash
    // map, which lists them in an order that depends on its history.)
    assert_eq!(restored, table);
    assert_eq!(views(&restored), views(&table));
    assert_eq!(continuation(restored), continuation(table));
}

#[test]
fn the_table_shows_the_same_views() {
    let shown = views(&built());
    let fixture = read_or_write("table-v1-views.txt", shown.as_bytes());
    assert_eq!(shown, String::from_utf8(fixture).expect("utf-8"));
}

#[test]
fn the_table_goes_on_the_same_way() {
    let went = continuation(built());
    let fixture = read_or_write("table-v1-continued.txt", went.as_bytes());
    assert_eq!(went, String::from_utf8(fixture).expect("utf-8"));
}

/// The built table reaches every part of the snapshot, so the fixture pins
/// all of them.
#[test]
fn the_fixture_table_covers_every_part() {
    let table = built();
    let shown = views(&table);
    let locks = table.locks("", None, usize::MAX, table.now());
    assert!(locks.iter().any(|l| l.holders.len() > 1), "shared holders");
    assert!(locks.iter().any(|l| l.permits > 0), "a semaphore");
    assert!(locks.iter().any(|l| !l.waiters.is_empty()), "a queue");
    assert!(locks.iter().any(|l| l.delay_left_ms > 0), "a lock-delay");
    assert!(locks.iter().any(|l| l.has_checkpoint), "a checkpoint");
    assert!(table.auth().enabled(), "auth on");
    assert!(
        table
            .leases(0, usize::MAX, usize::MAX, table.now())
            .iter()
            .any(|l| l.owner.is_some()),
        "a lease owned by a token"
    );
    assert!(shown.contains("set/x"), "a lock set");
    // The Debug form shows the parts the views do not.
    let debug = format!("{table:?}");
    for part in [
        "attach_by: Some(",
        "request_id: Some(",
        "set: Some(",
        "GrantingAs",
        "Hold(",
        "Granting,",
    ] {
        assert!(debug.contains(part), "no {part} in the table");
    }
}
