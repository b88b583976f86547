//! The `leasehold` command against a real `leaseholdd`.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use leasehold_testkit::{wait_until, Leaseholdd};

fn leasehold(server: &Leaseholdd) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    c.env("LEASEHOLD_ENDPOINT", server.url())
        .env_remove("LEASEHOLD_HOLDER");
    c
}

fn run(server: &Leaseholdd, args: &[&str]) -> Output {
    leasehold(server)
        .args(args)
        .output()
        .expect("run leasehold")
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// Whether `pid` runs and is not a zombie waiting for a parent that is
/// not us to reap it.
fn alive_unreaped(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z')
        })
        .unwrap_or(false)
}

/// The first line a child printed on its piped stdout (an acquired token).
fn first_line(child: &mut std::process::Child) -> String {
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().expect("piped stdout")),
        &mut line,
    )
    .expect("read stdout");
    line
}

#[test]
fn of_two_runs_at_once_exactly_one_runs_the_command() {
    let server = Leaseholdd::start();
    let dir = tmp();
    let log = dir.path().join("ran");
    let script = format!("echo $LEASEHOLD_FENCE >> {}; sleep 1", log.display());
    let spawn = || {
        leasehold(&server)
            .args(["run", "nightly", "--", "sh", "-c", &script])
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn")
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let mut codes = [a.status.code(), b.status.code()];
    codes.sort();
    assert_eq!(codes, [Some(0), Some(75)]);
    let loser = if a.status.code() == Some(75) { &a } else { &b };
    assert!(
        String::from_utf8_lossy(&loser.stderr).contains("is held by"),
        "{loser:?}"
    );
    assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 1);
}

/// `run --permits 2`: five runs, at most two commands at once, all of them
/// run, each with its own token; `status` shows the holders of the permits.
#[test]
fn runs_with_permits_let_that_many_commands_run_at_once() {
    let server = Leaseholdd::start();
    let dir = tmp();
    let inside = dir.path().join("inside");
    std::fs::create_dir(&inside).expect("mkdir");
    let log = dir.path().join("log");
    // Each command marks itself inside, counts who is, and leaves.
    let script = format!(
        "touch {i}/$$; echo \"$LEASEHOLD_FENCE $(ls {i} | wc -l)\" >> {l}; sleep 0.4; rm {i}/$$",
        i = inside.display(),
        l = log.display()
    );
    let runs: Vec<_> = (0..5)
        .map(|_| {
            leasehold(&server)
                .args([
                    "run",
                    "--permits",
                    "2",
                    "--wait",
                    "30s",
                    "api",
                    "--",
                    "sh",
                    "-c",
                    &script,
                ])
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    // While they run, status shows a semaphore of 2.
    wait_until(Duration::from_secs(10), "two permits in use", || {
        String::from_utf8_lossy(&run(&server, &["status", "api"]).stdout).contains("2/2")
    });
    for r in runs {
        let out = r.wait_with_output().expect("wait");
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let log = std::fs::read_to_string(&log).expect("log");
    let rows: Vec<(u64, usize)> = log
        .lines()
        .map(|l| {
            let (fence, count) = l.split_once(' ').expect("two fields");
            (
                fence.parse().expect("fence"),
                count.trim().parse().expect("count"),
            )
        })
        .collect();
    assert_eq!(rows.len(), 5, "{log}");
    assert!(rows.iter().all(|r| r.1 <= 2), "more than 2 inside: {log}");
    let mut fences: Vec<u64> = rows.iter().map(|r| r.0).collect();
    fences.sort_unstable();
    fences.dedup();
    assert_eq!(fences.len(), 5, "shared tokens: {log}");
    // A plain run on the semaphore's key is refused while it is in use.
    let holder = leasehold(&server)
        .args(["run", "--permits", "2", "api", "--", "sleep", "2"])
        .spawn()
        .expect("spawn");
    wait_until(Duration::from_secs(5), "one permit in use", || {
        String::from_utf8_lossy(&run(&server, &["status", "api"]).stdout).contains("1/2")
    });
    let plain = run(&server, &["run", "api", "--", "true"]);
    assert_ne!(plain.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&plain.stderr).contains("semaphore of 2 permits"),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    let _ = holder.wait_with_output();
}

/// `elect` proclaims its value; `leader` shows it, and with --watch prints
/// each change: the next candidate taking over when the first one's command ends.
#[test]
fn leader_shows_who_elect_made_leader_and_watches_it_change() {
    let server = Leaseholdd::start();
    let none = run(&server, &["leader", "sched"]);
    assert_eq!(none.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&none.stdout).trim(), "(none)");
    let mut watch = leasehold(&server)
        .args(["leader", "sched", "--watch", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn watch");
    let lines = std::io::BufRead::lines(std::io::BufReader::new(
        watch.stdout.take().expect("stdout"),
    ));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || lines.map_while(Result::ok).try_for_each(|l| tx.send(l)));
    let next = || {
        rx.recv_timeout(Duration::from_secs(10))
            .expect("a line in time")
    };
    // Its first line (nobody leads) comes once it watches.
    let mut values = vec![next()];
    let first = leasehold(&server)
        .args(["elect", "sched", "--value", "node-1", "--", "sleep", "1"])
        .spawn()
        .expect("spawn elect");
    wait_until(Duration::from_secs(10), "node-1 to lead", || {
        String::from_utf8_lossy(&run(&server, &["leader", "sched"]).stdout).starts_with("node-1")
    });
    let second = leasehold(&server)
        .args(["elect", "sched", "--value", "node-2", "--", "sleep", "1"])
        .spawn()
        .expect("spawn elect");
    for mut p in [first, second] {
        assert_eq!(p.wait().expect("elect").code(), Some(0));
    }
    // The watch saw: nobody, node-1, nobody, node-2, nobody.
    while values.len() < 5 {
        values.push(next());
    }
    let _ = watch.kill();
    let _ = watch.wait();
    let values: Vec<serde_json::Value> = values
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json")["value"].clone())
        .collect();
    let values: Vec<Option<&str>> = values.iter().map(|v| v.as_str()).collect();
    assert_eq!(
        values,
        [None, Some("node-1"), None, Some("node-2"), None],
        "{values:?}"
    );
    // Nobody leads: the key only keeps the last value, and `status` lists
    // it only when asked for free keys (as the dashboard does).
    let listed = String::from_utf8(run(&server, &["status"]).stdout).expect("utf-8");
    assert_eq!(listed.trim(), "no locks held", "{listed}");
    let all = String::from_utf8(run(&server, &["status", "--all"]).stdout).expect("utf-8");
    assert!(all.contains("(free)"), "{all}");
}

#[test]
fn with_wait_the_second_runs_after_the_first_with_a_higher_fence() {
    let server = Leaseholdd::start();
    let dir = tmp();
    let log = dir.path().join("ran");
    let script = format!(
        "echo start $LEASEHOLD_FENCE >> {0}; sleep 0.5; echo end $LEASEHOLD_FENCE >> {0}",
        log.display()
    );
    let spawn = || {
        leasehold(&server)
            .args(["run", "nightly", "--wait", "10s", "--", "sh", "-c", &script])
            .spawn()
            .expect("spawn")
    };
    let mut a = spawn();
    std::thread::sleep(Duration::from_millis(150));
    let mut b = spawn();
    assert!(a.wait().unwrap().success());
    assert!(b.wait().unwrap().success());
    let lines: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    let fence = |l: &str| l.split(' ').nth(1).unwrap().parse::<u64>().unwrap();
    assert!(
        lines[0].starts_with("start") && lines[1].starts_with("end"),
        "overlapped: {lines:?}"
    );
    assert!(fence(&lines[2]) > fence(&lines[0]), "{lines:?}");
}

#[test]
fn a_paused_run_loses_its_lease_kills_the_command_and_exits_76() {
    let server = Leaseholdd::start();
    let dir = tmp();
    let pidfile = dir.path().join("pid");
    let grandchild_file = dir.path().join("grandchild");
    // A command that starts a process of its own: the whole group is stopped.
    let script = format!(
        "sleep 30 & echo $! > {}; echo $$ > {}; wait",
        grandchild_file.display(),
        pidfile.display()
    );
    let mut holder = leasehold(&server)
        .args([
            "run", "k", "--ttl", "1s", "--grace", "1s", "--", "sh", "-c", &script,
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_until(Duration::from_secs(10), "the command to start", || {
        std::fs::read_to_string(&pidfile).is_ok_and(|s| s.trim().parse::<i32>().is_ok())
    });
    let child: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();

    // Freeze `leasehold run` (not its command) past the TTL.
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(holder.id() as i32, libc::SIGSTOP) };
    let mut taker = leasehold(&server)
        .args(["acquire", "k", "--ttl", "5s", "--wait", "5s", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let line = first_line(&mut taker);
    let taken: serde_json::Value =
        serde_json::from_str(&line).expect("the second holder got the lock");
    assert!(taken["fence"].as_u64().unwrap() > 1);
    // SAFETY: as above.
    unsafe { libc::kill(holder.id() as i32, libc::SIGCONT) };

    let status = holder.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(holder.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(76), "{stderr}");
    // Whichever notices first names the key: the failed renewal ("lease on
    // k lost") or the key's events ("lock on k lost").
    assert!(
        stderr.contains("lease on k lost") || stderr.contains("lock on k lost"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("lease on \"\""),
        "a key-less loss: {stderr}"
    );
    assert!(!alive(child), "the command survived the loss of the lease");
    let grandchild: i32 = std::fs::read_to_string(&grandchild_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_until(
        Duration::from_secs(5),
        "the command's own child to die",
        || !alive_unreaped(grandchild),
    );
    let _ = taker.kill();
    let _ = taker.wait();
}

#[test]
fn exit_codes_and_signals_pass_through() {
    let server = Leaseholdd::start();
    assert_eq!(
        run(&server, &["run", "k", "--", "sh", "-c", "exit 3"])
            .status
            .code(),
        Some(3)
    );
    assert_eq!(
        run(&server, &["run", "k", "--", "sh", "-c", "kill -KILL $$"])
            .status
            .code(),
        Some(137)
    );

    let dir = tmp();
    let marker = dir.path().join("got-term");
    let script = format!(
        "trap 'echo term > {}; exit 9' TERM; while true; do sleep 0.05; done",
        marker.display()
    );
    let mut c = leasehold(&server)
        .args(["run", "k", "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    assert_eq!(c.wait().unwrap().code(), Some(9));
    assert!(marker.exists(), "SIGTERM was not passed on");
    // And the lock was released afterwards.
    assert_eq!(
        run(&server, &["run", "k", "--", "true"]).status.code(),
        Some(0)
    );
}

#[test]
fn status_release_and_bad_input() {
    let server = Leaseholdd::start();
    let mut holder = leasehold(&server)
        .args(["acquire", "jobs/report", "--ttl", "30s", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let line = first_line(&mut holder);
    let printed: serde_json::Value = serde_json::from_str(&line).unwrap();
    let fence = printed["fence"].as_u64().unwrap();

    let out = run(&server, &["status", "jobs/", "--json"]);
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows[0]["key"], "jobs/report");
    assert_eq!(rows[0]["fence"], fence);
    assert!(rows[0]["lease"].as_u64().is_some(), "{rows}");
    let table = String::from_utf8(run(&server, &["status"]).stdout).unwrap();
    assert!(
        table.contains("jobs/report") && table.contains("HOLDER"),
        "{table}"
    );

    let stale = run(
        &server,
        &[
            "release",
            "jobs/report",
            "--fence",
            &(fence + 1).to_string(),
        ],
    );
    assert_ne!(stale.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&stale.stderr).contains("stale fence"),
        "{stale:?}"
    );
    assert!(run(
        &server,
        &["release", "jobs/report", "--fence", &fence.to_string()]
    )
    .status
    .success());

    let bad = run(&server, &["run", "k", "--ttl", "soon", "--", "true"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not a duration"));
    let long_key = "k".repeat(600);
    let bad = run(&server, &["run", &long_key, "--", "true"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("invalid"),
        "{bad:?}"
    );

    // The holder learns at once that an operator released its lock: it
    // says so and exits 76, as `run` does, without waiting for a signal.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let code = loop {
        if let Some(status) = holder.try_wait().unwrap() {
            break status.code();
        }
        if std::time::Instant::now() > deadline {
            let _ = holder.kill();
            panic!("acquire did not notice its lock was released");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code, Some(76));
    let mut err = String::new();
    std::io::Read::read_to_string(holder.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(err.contains("released"), "{err}");
    let none = String::from_utf8(run(&server, &["status", "jobs/"]).stdout).unwrap();
    assert_eq!(none.trim(), "no locks held");
}

/// Ctrl-C releases the lock and ends the session lease it hung off, so no
/// lease is left to run out its TTL.
#[test]
fn acquire_ends_its_session_lease_on_ctrl_c() {
    let server = Leaseholdd::start();
    let mut holder = leasehold(&server)
        .args(["acquire", "jobs/once", "--ttl", "60s"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let line = first_line(&mut holder);
    assert!(line.trim().parse::<u64>().is_ok(), "{line}");
    let leases = || -> serde_json::Value {
        let body = leasehold_testkit::http_get(&server.addr, "/v1/leases").expect("leases");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["leases"].clone()
    };
    assert_eq!(leases().as_array().map(Vec::len), Some(1));
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(holder.id() as i32, libc::SIGINT) };
    assert_eq!(holder.wait().unwrap().code(), Some(0));
    assert_eq!(leases(), serde_json::json!([]));
}

/// Every way a `run` or an `acquire` ends without holding the lock (75,
/// a command that cannot start, a signal while waiting) ends the session
/// lease it made: with `--max-leases 2`, refused runs never fill the node.
#[test]
fn every_exit_path_ends_the_leases_it_made() {
    let server = Leaseholdd::start_with(&["--max-leases", "2"]);
    let leases = || -> Vec<u64> {
        let body = leasehold_testkit::http_get(&server.addr, "/v1/leases").expect("leases");
        let list: serde_json::Value = serde_json::from_str(&body).expect("json");
        list["leases"]
            .as_array()
            .expect("a list")
            .iter()
            .map(|l| l["lease"].as_u64().expect("an id"))
            .collect()
    };
    let mut holder = leasehold(&server)
        .args(["acquire", "held", "--ttl", "60s"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    first_line(&mut holder);
    let held = leases();
    assert_eq!(held.len(), 1, "{held:?}");

    let code = |args: &[&str]| run(&server, args).status.code();
    for _ in 0..3 {
        assert_eq!(code(&["run", "held", "--", "true"]), Some(75));
        assert_eq!(leases(), held, "after a run that exited 75");
        assert_eq!(code(&["acquire", "held", "--ttl", "60s"]), Some(75));
        assert_eq!(leases(), held, "after an acquire that exited 75");
        assert_eq!(
            code(&["run", "held", "--wait", "300ms", "--", "true"]),
            Some(75)
        );
        assert_eq!(leases(), held, "after a wait that timed out");
    }

    // A command that cannot start: 127 (none such) or 126 (not
    // executable), as env(1) says, and the lock and its lease are let go.
    let out = run(&server, &["run", "free", "--", "no-such-command-anywhere"]);
    assert_eq!(out.status.code(), Some(127), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no-such-command-anywhere"),
        "{out:?}"
    );
    assert_eq!(leases(), held, "after a command that did not start");
    let dir = tmp();
    let plain = dir.path().join("not-executable");
    std::fs::write(&plain, "echo hi\n").expect("write");
    let out = run(
        &server,
        &["run", "free", "--", &plain.display().to_string()],
    );
    assert_eq!(out.status.code(), Some(126), "{out:?}");
    assert_eq!(leases(), held, "after a command that could not be run");

    // A signal while waiting in the queue: the wait ends, so does its lease.
    for (args, sig, exit) in [
        (
            vec!["run", "held", "--wait", "60s", "--", "true"],
            libc::SIGINT,
            130,
        ),
        (vec!["acquire", "held", "--wait", "60s"], libc::SIGTERM, 143),
    ] {
        let mut waiting = leasehold(&server).args(&args).spawn().expect("spawn");
        wait_until(Duration::from_secs(10), "the waiter's lease", || {
            leases().len() == 2
        });
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(waiting.id() as i32, sig) };
        assert_eq!(waiting.wait().expect("wait").code(), Some(exit), "{args:?}");
        assert_eq!(leases(), held, "after {args:?} was stopped by a signal");
    }

    // The node has room for an unrelated key: nothing leaked.
    assert_eq!(code(&["run", "other", "--", "true"]), Some(0));
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(holder.id() as i32, libc::SIGINT) };
    assert_eq!(holder.wait().expect("wait").code(), Some(0));
    assert_eq!(leases(), Vec::<u64>::new());
}

#[test]
fn an_unreachable_endpoint_is_a_clear_error() {
    let port = leasehold_testkit::free_port();
    let out = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["--endpoint", &format!("http://127.0.0.1:{port}"), "status"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unavailable") && err.lines().count() == 1,
        "{err}"
    );
}

#[test]
fn the_fencing_demo_shows_the_stale_write_landing_only_without_a_gate() {
    let out = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["demo", "fencing"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |label: &str| {
        text.lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_default()
            .to_string()
    };
    // Without the gate A's stale write lands (150); with it A is refused and B's write stands (130).
    assert!(
        line("final balance").contains("150") && line("final balance").trim_end().ends_with("130"),
        "{text}"
    );
    assert!(
        line("A ").contains("wrote 150") && line("A ").contains("refused: stale fence"),
        "{text}"
    );
    assert!(
        text.contains("CORRUPT") && text.trim_end().ends_with("correct"),
        "{text}"
    );
}

fn bench_json(endpoint: &str, args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["--endpoint", endpoint, "bench", "--json", "--clients", "4"])
        .args(args)
        .output()
        .expect("run leasehold bench");
    assert!(
        out.status.success(),
        "bench {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("bench {args:?} printed no JSON ({e}): {text}"))
}

#[test]
fn bench_runs_every_workload_and_reports_what_it_measured() {
    let server = Leaseholdd::start();
    let pid = server.process.pid().expect("server pid").to_string();
    let url = server.url();
    for workload in ["cycle", "contended", "renew"] {
        let r = bench_json(
            &url,
            &[
                "--workload",
                workload,
                "--duration",
                "1s",
                "--keys",
                "20",
                "--server-pid",
                &pid,
            ],
        );
        assert!(r["ops"].as_u64().unwrap_or(0) > 0, "{workload}: {r}");
        assert!(
            r["latency_ms"]["p50"].as_f64().unwrap_or(0.0) > 0.0,
            "{workload}: {r}"
        );
        assert!(r["server_cpu_seconds"].is_number(), "{workload}: {r}");
        assert!(
            r["setup_seconds"].as_f64().is_some_and(|s| s >= 0.0),
            "{workload}: {r}"
        );
        let errors = r["errors"].as_object().expect("errors");
        assert!(
            errors.keys().all(|k| k == "held"),
            "{workload}: only contention may fail: {r}"
        );
    }
    let hold = bench_json(
        &url,
        &["--workload", "hold", "--keys", "500", "--server-pid", &pid],
    );
    assert_eq!(hold["ops"], 500, "{hold}");
    assert!(hold["bytes_per_held_lock"].is_number(), "{hold}");
}

#[test]
fn bench_keep_holds_every_lock_through_renewals_on_any_backend() {
    let server = Leaseholdd::start();
    let redis = leasehold_testkit::RedisServer::start();
    for (url, pid) in [
        (server.url(), server.process.pid()),
        (redis.url(), redis.process.pid()),
    ] {
        let pid = pid.expect("server pid").to_string();
        // TTL 1 s for 2.5 s: every lock is renewed about seven times, with
        // room for a loaded test machine.
        let r = bench_json(
            &url,
            &[
                "--workload",
                "keep",
                "--keys",
                "200",
                "--ttl",
                "1s",
                "--duration",
                "2500ms",
                "--server-pid",
                &pid,
            ],
        );
        assert_eq!(r["locks_held"], 200, "{url}: {r}");
        assert_eq!(r["locks_lost"], 0, "{url}: {r}");
        assert!(r["server_cpu_share"].is_number(), "{url}: {r}");
    }
}

/// `sessions`: every session, granted with its lock, is renewed on its
/// schedule (every TTL/3), and none is lost on a healthy node.
#[test]
fn bench_sessions_renews_every_session_on_schedule() {
    // Renewals due together in one call (as the Rust client sends them),
    // and one call each.
    for workload in ["sessions", "sessions-each"] {
        sessions_keep_to_their_schedule(workload);
    }
}

fn sessions_keep_to_their_schedule(workload: &str) {
    let server = Leaseholdd::start();
    let pid = server.process.pid().expect("server pid").to_string();
    // TTL 1.5 s: each of the 300 sessions is due every 0.5 s, so a 2 s
    // window holds about four renewals of each.
    let r = bench_json(
        &server.url(),
        &[
            "--workload",
            workload,
            "--keys",
            "300",
            "--ttl",
            "1500ms",
            "--duration",
            "2s",
            "--server-pid",
            &pid,
        ],
    );
    assert_eq!(r["sessions"], 300, "{r}");
    assert_eq!(r["sessions_granted"], 300, "{r}");
    assert_eq!(r["sessions_lost"], 0, "{r}");
    assert_eq!(r["renewals_without_their_lock"], 0, "{r}");
    assert_eq!(r["renewals_not_sent"], 0, "{r}");
    assert!(
        r["ops"].as_u64().unwrap_or(0) >= 600,
        "every session renews: {r}"
    );
    let (due, done) = (
        r["renewals_due_per_sec"].as_f64().unwrap_or(0.0),
        r["renewals_done_per_sec"].as_f64().unwrap_or(0.0),
    );
    assert!(
        due >= 450.0 && done >= due * 0.8,
        "renewals keep to the schedule: {r}"
    );
    assert_eq!(r["errors"], serde_json::json!({}), "{r}");
    let per_call = r["renewals_per_call"].as_f64().unwrap_or(0.0);
    if workload == "sessions-each" {
        assert_eq!(per_call, 1.0, "{r}");
    } else {
        assert!(per_call >= 1.0, "{r}");
    }
}

/// `kill -9` of `leasehold run`: the command dies with it instead of
/// running on, unsupervised, holding nothing.
#[test]
fn the_command_dies_with_a_killed_run() {
    let server = Leaseholdd::start();
    let dir = tmp();
    let pidfile = dir.path().join("pid");
    let script = format!("echo $$ > {}; exec sleep 30", pidfile.display());
    let mut holder = leasehold(&server)
        .args(["run", "k", "--ttl", "5s", "--", "sh", "-c", &script])
        .spawn()
        .expect("spawn");
    wait_until(Duration::from_secs(10), "the command to start", || {
        std::fs::read_to_string(&pidfile).is_ok_and(|s| s.trim().parse::<i32>().is_ok())
    });
    let child: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    holder.kill().unwrap();
    holder.wait().unwrap();
    wait_until(
        Duration::from_secs(5),
        "the command to die with its supervisor",
        || !alive_unreaped(child),
    );
}

/// `leasehold check` inside the command: while `leasehold run` is frozen
/// (so nothing tells the command to stop), the lease passes its deadline
/// and the command's `while leasehold check; do write; done` loop stops by
/// itself, before anyone else can take the lock.
#[test]
fn check_stops_the_commands_writes_while_run_is_frozen() {
    let server = Leaseholdd::start();
    let dir = tmp();
    let writes = dir.path().join("writes");
    let stopped = dir.path().join("stopped");
    let check = env!("CARGO_BIN_EXE_leasehold");
    let script = format!(
        "while {check} check > /dev/null; do echo $LEASEHOLD_FENCE >> {w}; sleep 0.05; done; {check} check; echo $? > {s}; sleep 30",
        w = writes.display(),
        s = stopped.display()
    );
    let mut holder = leasehold(&server)
        .args([
            "run", "k", "--ttl", "1s", "--grace", "1s", "--", "sh", "-c", &script,
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_until(Duration::from_secs(10), "the first writes", || {
        std::fs::read_to_string(&writes).is_ok_and(|w| w.lines().count() >= 3)
    });
    // Several renewals (every TTL/3) pass and the writes go on.
    std::thread::sleep(Duration::from_millis(1_500));
    assert!(
        !stopped.exists(),
        "check failed while the lease was renewed"
    );

    // SAFETY: signalling our own child process.
    unsafe { libc::kill(holder.id() as i32, libc::SIGSTOP) };
    wait_until(Duration::from_secs(5), "the loop to stop by itself", || {
        stopped.exists()
    });
    assert_eq!(std::fs::read_to_string(&stopped).unwrap().trim(), "76");
    let count = std::fs::read_to_string(&writes).unwrap().lines().count();
    // The lock is free for another holder now, and no write follows.
    let taken = run(&server, &["run", "k", "--wait", "5s", "--", "true"]);
    assert_eq!(taken.status.code(), Some(0));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        std::fs::read_to_string(&writes).unwrap().lines().count(),
        count
    );

    // SAFETY: as above.
    unsafe { libc::kill(holder.id() as i32, libc::SIGCONT) };
    assert_eq!(holder.wait().unwrap().code(), Some(76));
}

#[test]
fn check_outside_run_says_there_is_no_lease() {
    let out = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .arg("check")
        .env_remove("LEASEHOLD_STATE")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(76));
    assert!(String::from_utf8_lossy(&out.stderr).contains("LEASEHOLD_STATE"));
}

/// `leasehold cluster` against a real 3-node cluster, given one follower's
/// address: it finds the leader, shows every member with its lag, adds a
/// fourth, and refuses to remove a node that is not a member.
/// `leasehold watch` and `leasehold leader --watch`, given every node with a
/// follower first, stream from that follower; it is `kill -9`ed between
/// runs that take keys and between two leaders. Each event arrives once, in
/// order (the same lines as `watch --after 0` on a node never killed), and
/// each leader is printed.
#[test]
fn watch_and_leader_go_on_across_a_kill_of_their_node() {
    use std::io::BufRead;
    let mut c = leasehold_testkit::Cluster::start(3);
    let leader = c.wait_leader();
    let order = [(leader + 1) % 3, (leader + 2) % 3, leader];
    let follower_first = c.endpoints_from(order[0]);
    let lines_of = |args: &[&str], endpoint: &str| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .env("LEASEHOLD_ENDPOINT", endpoint)
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn");
        let (tx, rx) = std::sync::mpsc::channel();
        let out = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        (child, rx)
    };
    let (mut watch, watched) = lines_of(&["watch", "--json", "w/"], &follower_first);
    let (mut leaders, led) = lines_of(&["leader", "boss", "--watch"], &follower_first);
    let next = |rx: &std::sync::mpsc::Receiver<String>| {
        rx.recv_timeout(Duration::from_secs(20))
            .expect("a line within 20 s")
    };
    assert_eq!(next(&led), "(none)");
    let all = c.endpoints();
    let cli = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .env("LEASEHOLD_ENDPOINT", &all)
            .args(args)
            .output()
            .expect("run leasehold")
    };
    let elect = |value: &str| {
        Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .env("LEASEHOLD_ENDPOINT", &all)
            .args(["elect", "boss", "--value", value, "--", "sleep", "60"])
            .spawn()
            .expect("spawn elect")
    };
    let mut a = elect("a");
    assert!(next(&led).starts_with("a  fence="));
    for i in 0..5 {
        assert_eq!(
            cli(&["run", &format!("w/{i}"), "--", "true"]).status.code(),
            Some(0)
        );
    }
    c.kill(order[0]);
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(a.id() as i32, libc::SIGTERM) };
    a.wait().expect("wait");
    let mut b = elect("b");
    for i in 5..10 {
        // Failovers refuse some: the events say what happened.
        cli(&["run", &format!("w/{i}"), "--", "true"]);
    }
    assert_eq!(next(&led), "(none)");
    assert!(next(&led).starts_with("b  fence="));
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(b.id() as i32, libc::SIGTERM) };
    b.wait().expect("wait");

    let reference = c.nodes[order[2]].url();
    let (mut whole, history) = lines_of(&["watch", "--json", "--after", "0", "w/"], &reference);
    let expected: Vec<String> =
        std::iter::from_fn(|| history.recv_timeout(Duration::from_secs(3)).ok()).collect();
    let seen: Vec<String> =
        std::iter::from_fn(|| watched.recv_timeout(Duration::from_millis(500)).ok()).collect();
    assert!(expected.len() >= 10, "{expected:?}");
    assert_eq!(seen, expected);
    for child in [&mut watch, &mut leaders, &mut whole] {
        let _ = child.kill();
        let _ = child.wait();
    }
}

#[test]
fn cluster_status_add_and_remove() {
    let mut c = leasehold_testkit::Cluster::start(3);
    let leader = c.wait_leader();
    let follower = (leader + 1) % 3;
    let endpoint = c.nodes[follower].url();
    let cli = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .env("LEASEHOLD_ENDPOINT", &endpoint)
            .args(args)
            .output()
            .expect("run leasehold")
    };
    // Every member shows its lag once the leader has heard from it (on a
    // loaded machine the third node may answer a moment after the vote).
    let started = std::time::Instant::now();
    loop {
        let out = cli(&["cluster", "status", "--json"]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(status["role"], "leader", "the leader's view: {status}");
        let members = status["members"].as_array().unwrap();
        assert_eq!(members.len(), 3);
        if members.iter().all(|m| m["lag"].is_u64()) {
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "a member never showed its lag: {status}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }

    // A node that is not running is refused, and says so.
    let nobody = format!("127.0.0.1:{}", leasehold_testkit::free_port());
    let out = cli(&["cluster", "add", "5", &nobody]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    // It says at once what it waits for, and while it waits, what it lacks.
    let said = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = said.trim().lines().collect();
    assert!(
        lines[0].starts_with(&format!("adding node 5 at {nobody}: it joins as a learner")),
        "{said}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("waiting for node 5 to catch up: ")),
        "{said}"
    );
    assert_eq!(
        lines.last().copied(),
        Some(
            format!("leasehold: node 5 at {nobody} did not answer within 10 s; it was not added")
                .as_str()
        )
    );

    let new = c.start_new_node(4);
    let addr = c.nodes[new].addr.clone();
    let out = cli(&["cluster", "add", "4", &addr]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = cli(&["cluster", "status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" voter ") || l.contains(" leader "))
        .collect();
    assert_eq!(rows.len(), 4, "{text}");
    // The columns line up under the header, whatever the ids' widths.
    let header = text
        .lines()
        .find(|l| l.starts_with("ID"))
        .expect("a header");
    let column = |line: &str, word: &str| line.find(word);
    let reach = column(header, "REACHABLE").expect("a REACHABLE column");
    let role = column(header, "ROLE").unwrap();
    for row in &rows {
        assert!(
            row[role..].starts_with("voter") || row[role..].starts_with("leader"),
            "{text}"
        );
        assert!(
            row[reach..].starts_with("yes") || row[reach..].starts_with("-"),
            "{text}"
        );
    }

    let out = cli(&["cluster", "remove", "9"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a member"),
        "{out:?}"
    );
}

#[test]
fn every_command_speaks_tls_with_a_client_certificate() {
    use leasehold_testkit::pki::Ca;
    let dir = tmp();
    let ca = Ca::new(dir.path(), "ca");
    let clients = Ca::new(dir.path(), "clients");
    let served = ca.issue("server", &["127.0.0.1"]);
    let me = clients.issue("operator", &["operator"]);
    let path = |p: &std::path::Path| p.display().to_string();
    let server = Leaseholdd::spawn_with(&[
        "--tls-cert",
        &path(&served.cert),
        "--tls-key",
        &path(&served.key),
        "--tls-client-ca",
        &path(&clients.cert),
    ]);
    let endpoint = format!("https://{}", server.addr);
    let cli = |args: &[&str], identity: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_leasehold"));
        c.env_remove("LEASEHOLD_HOLDER")
            .env("LEASEHOLD_ENDPOINT", &endpoint)
            .env("LEASEHOLD_CACERT", &ca.cert);
        if identity {
            c.env("LEASEHOLD_CLIENT_CERT", &me.cert)
                .env("LEASEHOLD_CLIENT_KEY", &me.key);
        }
        c.args(args).output().expect("run leasehold")
    };
    wait_until(Duration::from_secs(20), "leaseholdd over TLS", || {
        cli(&["status"], true).status.success()
    });

    let ran = cli(
        &[
            "run",
            "tls/nightly",
            "--",
            "sh",
            "-c",
            "echo $LEASEHOLD_FENCE",
        ],
        true,
    );
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    assert!(!String::from_utf8_lossy(&ran.stdout).trim().is_empty());

    let cluster = cli(&["cluster", "status", "--json"], true);
    assert!(
        cluster.status.success(),
        "{}",
        String::from_utf8_lossy(&cluster.stderr)
    );
    let view: serde_json::Value = serde_json::from_slice(&cluster.stdout).unwrap();
    assert_eq!(view["role"], "leader", "{view}");

    let bench = cli(
        &[
            "bench",
            "--json",
            "--clients",
            "2",
            "--duration",
            "1s",
            "--workload",
            "cycle",
        ],
        true,
    );
    assert!(
        bench.status.success(),
        "{}",
        String::from_utf8_lossy(&bench.stderr)
    );

    // Without the client certificate the server turns the CLI away.
    let refused = cli(&["status"], false);
    assert!(!refused.status.success());
}

#[test]
fn auth_commands_turn_it_on_scope_tokens_and_revoke_them() {
    let server = Leaseholdd::start();
    let text = |out: &Output| String::from_utf8_lossy(&out.stdout).trim().to_string();
    let enabled = run(&server, &["auth", "enable"]);
    assert!(enabled.status.success(), "{enabled:?}");
    let root = text(&enabled);
    assert!(root.starts_with("lh_1_"), "{root}");
    let as_root = |args: &[&str]| {
        leasehold(&server)
            .env("LEASEHOLD_TOKEN", &root)
            .args(args)
            .output()
            .expect("run leasehold")
    };
    let set = as_root(&[
        "auth",
        "role",
        "set",
        "jobs",
        "--lock",
        "jobs/",
        "--deny",
        "jobs/secret/",
    ]);
    assert!(set.status.success(), "{set:?}");
    let created = as_root(&[
        "auth", "token", "create", "--role", "jobs", "--name", "nightly",
    ]);
    assert!(created.status.success(), "{created:?}");
    let jobs = text(&created);

    // `leasehold run` with the token: inside its prefix it runs, outside
    // (and in the carved-out subtree) it is refused with the reason.
    let with = |token: &str, key: &str| {
        leasehold(&server)
            .args(["--token", token, "run", key, "--", "true"])
            .output()
            .expect("run")
    };
    assert!(with(&jobs, "jobs/nightly").status.success());
    for key in ["payments/x", "jobs/secret/x"] {
        let refused = with(&jobs, key);
        assert!(!refused.status.success());
        let err = String::from_utf8_lossy(&refused.stderr);
        assert!(err.contains("permission denied"), "{key}: {err}");
    }
    let anonymous = run(&server, &["run", "jobs/nightly", "--", "true"]);
    assert!(!anonymous.status.success());
    assert!(String::from_utf8_lossy(&anonymous.stderr).contains("token"));

    let status = text(&as_root(&["auth", "status"]));
    assert!(
        status.contains("nightly") && status.contains("jobs/secret/"),
        "{status}"
    );
    assert!(!status.contains(&jobs[5..]), "a secret was shown: {status}");
    let revoked = as_root(&["auth", "token", "revoke", "2"]);
    assert!(revoked.status.success(), "{revoked:?}");
    assert!(!with(&jobs, "jobs/nightly").status.success());
    let audit = text(&as_root(&["auth", "audit"]));
    assert!(audit.contains("token 2 \"nightly\" revoked"), "{audit}");
    assert_eq!(audit.lines().count(), 4, "{audit}");
    // Without admin, auth commands are refused.
    let denied = leasehold(&server)
        .args(["--token", &jobs, "auth", "status"])
        .output()
        .expect("run");
    assert!(!denied.status.success());
}

/// The TLS mistakes a user makes each get a line that names the cause and
/// the flag that fixes it, and none says the outcome is unknown: a
/// connection that never got past the handshake did nothing.
#[test]
fn tls_mistakes_name_their_fix() {
    use leasehold_testkit::pki::Ca;
    let dir = tmp();
    let ca = Ca::new(dir.path(), "ca");
    let clients = Ca::new(dir.path(), "clients");
    let strangers = Ca::new(dir.path(), "strangers");
    let served = ca.issue("server", &["127.0.0.1"]);
    let me = clients.issue("operator", &["operator"]);
    let stranger = strangers.issue("stranger", &["stranger"]);
    let path = |p: &std::path::Path| p.display().to_string();
    let server = Leaseholdd::spawn_with(&[
        "--tls-cert",
        &path(&served.cert),
        "--tls-key",
        &path(&served.key),
        "--tls-client-ca",
        &path(&clients.cert),
    ]);
    let cli = |endpoint: &str, flags: &[&str], command: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_leasehold"));
        for var in [
            "LEASEHOLD_HOLDER",
            "LEASEHOLD_CACERT",
            "LEASEHOLD_CLIENT_CERT",
            "LEASEHOLD_CLIENT_KEY",
        ] {
            c.env_remove(var);
        }
        let mut child = c
            .env("LEASEHOLD_ENDPOINT", endpoint)
            .args(flags)
            .args(command)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run leasehold");
        // A command that hangs instead of saying why is a failure too.
        let started = std::time::Instant::now();
        while child.try_wait().expect("wait").is_none() {
            if started.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                panic!("`leasehold {}` did not end within 20 s", command.join(" "));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().expect("output")
    };
    let run_cmd: &[&str] = &["run", "tls/mistake", "--", "true"];
    let https = format!("https://{}", server.addr);
    let ca_file = path(&ca.cert);
    let ca_flag = ["--cacert", ca_file.as_str()];
    let (my_cert, my_key) = (path(&me.cert), path(&me.key));
    let mut good = ca_flag.to_vec();
    good.extend(["--client-cert", &my_cert, "--client-key", &my_key]);
    wait_until(Duration::from_secs(20), "leaseholdd over TLS", || {
        cli(&https, &good, run_cmd).status.success()
    });

    // Every command that talks to the server, over whatever protocol it
    // uses (framed, gRPC, HTTP), says the same of each mistake. (`check`
    // reads a local file, `snapshot status` a backup, `demo` starts its own.)
    let snapshot = dir.path().join("backup.snap");
    let snapshot = path(&snapshot);
    let commands: Vec<Vec<&str>> = vec![
        run_cmd.to_vec(),
        vec!["acquire", "tls/mistake", "--ttl", "5s"],
        vec!["release", "tls/mistake", "--fence", "1"],
        vec!["status"],
        vec!["watch"],
        vec!["leader", "tls/election"],
        vec!["leader", "tls/election", "--watch"],
        vec!["cluster", "status"],
        vec!["snapshot", "save", &snapshot],
        vec!["auth", "status"],
        vec!["auth", "enable"],
        vec!["auth", "audit"],
        vec!["auth", "role", "set", "reader", "--read", ""],
        vec!["auth", "token", "create", "--role", "reader"],
        vec!["auth", "token", "revoke", "1"],
        vec!["auth", "role", "delete", "reader"],
        vec!["auth", "disable"],
        vec!["elect", "tls/election", "--value", "me", "--", "true"],
        vec!["cluster", "add", "9", "127.0.0.1:1"],
        vec!["cluster", "remove", "9"],
        vec!["cluster", "transfer-leader"],
        vec!["bench", "--duration", "1s", "--clients", "1"],
    ];
    let (cert, key) = (path(&stranger.cert), path(&stranger.key));
    let mut wrong = ca_flag.to_vec();
    wrong.extend(["--client-cert", &cert, "--client-key", &key]);
    let plain = format!("http://{}", server.addr);
    let mistakes: [(&str, &[&str], &str); 4] = [
        (&plain, &[], "this port speaks TLS only: use https://"),
        (&https, &[], "pass --cacert"),
        (
            &https,
            &ca_flag,
            "requires a client certificate: pass --client-cert",
        ),
        (&https, &wrong, "does not accept this client certificate"),
    ];
    for command in &commands {
        for (endpoint, flags, says) in &mistakes {
            let out = cli(endpoint, flags, command);
            let stderr = String::from_utf8_lossy(&out.stderr);
            let what = format!(
                "`leasehold {}` with {endpoint} {flags:?}",
                command.join(" ")
            );
            assert_ne!(out.status.code(), Some(0), "{what}: {stderr}");
            assert!(
                stderr.contains(says),
                "{what}: expected {says:?} in: {stderr}"
            );
            assert!(!stderr.contains("outcome unknown"), "{what}: {stderr}");
            assert_eq!(
                stderr.trim().lines().count(),
                1,
                "{what}: one line: {stderr}"
            );
        }
    }

    // A plain HTTP client is told the same, as JSON.
    let mut s = std::net::TcpStream::connect(&server.addr).expect("connect");
    use std::io::{Read, Write};
    write!(
        s,
        "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("read");
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains(r#""code":"tls_required""#), "{answer}");
}

/// The README's one-node CLI walkthrough, run line by line against a node,
/// with its placeholder scripts written here: each command does what the
/// page says of it.
#[test]
fn the_readmes_cli_walkthrough_does_what_it_says() {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README.md");
    let start = page
        .find("```sh\ncargo build --release && export PATH")
        .expect("the walkthrough's block");
    let block = &page[start + 6..];
    let block = &block[..block.find("```").expect("the block's end")];
    let commands: Vec<Vec<String>> = block
        .lines()
        .filter(|l| l.starts_with("leasehold "))
        .map(|l| {
            let l = l.split("  #").next().unwrap_or(l);
            l.split_whitespace().skip(1).map(str::to_string).collect()
        })
        .collect();
    let verbs: Vec<&str> = commands.iter().map(|c| c[0].as_str()).collect();
    assert_eq!(
        verbs,
        ["run", "run", "run", "run", "elect", "leader", "acquire", "release", "status", "watch"],
        "the walkthrough changed: follow it here too"
    );

    let server = Leaseholdd::start();
    let dir = tmp();
    // Each script notes the key and token it was given, as `run` promises.
    let script = |name: &str, body: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write script");
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        path.display().to_string()
    };
    let noted = dir.path().join("noted");
    let note = format!(
        "echo \"$LEASEHOLD_KEY $LEASEHOLD_FENCE\" >> {}",
        noted.display()
    );
    let scripts = [
        ("./report.sh", script("report.sh", &note)),
        ("./sync.sh", script("sync.sh", &note)),
        ("./read-catalog.sh", script("read-catalog.sh", &note)),
        ("./scheduler", script("scheduler", "exec sleep 60")),
    ];
    let args = |c: &[String]| -> Vec<String> {
        c.iter()
            .map(|a| {
                scripts
                    .iter()
                    .find(|(from, _)| a == from)
                    .map_or(a.clone(), |(_, to)| to.clone())
            })
            .collect()
    };
    let spawn = |c: &[String]| {
        leasehold(&server)
            .args(args(c))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn leasehold")
    };
    /// Ends a process this test started, however the test ends.
    struct Ended(std::process::Child);
    impl Drop for Ended {
        fn drop(&mut self) {
            if matches!(self.0.try_wait(), Ok(None)) {
                unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
                let _ = self.0.wait();
            }
        }
    }

    // The four `run`s: each runs its command with its key and a token.
    for c in &commands[..4] {
        let out = leasehold(&server).args(args(c)).output().expect("run");
        assert!(out.status.success(), "{c:?}: {out:?}");
    }
    let noted = std::fs::read_to_string(&noted).expect("the scripts ran");
    let keys: Vec<&str> = noted.lines().filter_map(|l| l.split(' ').next()).collect();
    assert_eq!(
        keys,
        ["nightly-report", "nightly-report", "partner-api", "catalog"]
    );
    assert!(noted.lines().all(|l| l
        .split(' ')
        .nth(1)
        .is_some_and(|f| f.parse::<u64>().is_ok())));

    // `elect` runs its command while leading; `leader` shows its value.
    let _elected = Ended(spawn(&commands[4]));
    wait_until(Duration::from_secs(10), "the candidate to lead", || {
        let out = leasehold(&server)
            .args(&commands[5])
            .output()
            .expect("leader");
        String::from_utf8_lossy(&out.stdout).contains("node-3")
    });

    // `acquire` prints the token and holds; a release by another token is
    // refused and changes nothing; `status` shows the key held.
    let mut held = Ended(spawn(&commands[6]));
    let fence: u64 = first_line(&mut held.0).trim().parse().expect("a token");
    assert_ne!(fence, 12, "the page's token would release it");
    let refused = leasehold(&server)
        .args(&commands[7])
        .output()
        .expect("release");
    assert!(!refused.status.success(), "{refused:?}");
    let status = leasehold(&server)
        .args(&commands[8])
        .output()
        .expect("status");
    assert!(
        String::from_utf8_lossy(&status.stdout).contains("deploy"),
        "{status:?}"
    );
    // Someone else: exit 75, and stderr says who holds it.
    let other = run(&server, &["run", "deploy", "--ttl", "30s", "--", "true"]);
    assert_eq!(other.status.code(), Some(75), "{other:?}");
    assert!(
        String::from_utf8_lossy(&other.stderr).contains("held"),
        "{other:?}"
    );
    // No such command: 127, as env(1) says.
    let missing = run(&server, &["run", "nothing-here", "--", "/no/such/command"]);
    assert_eq!(missing.status.code(), Some(127), "{missing:?}");

    // `watch jobs/` sees a lock under jobs/ taken and given back. It shows
    // what happens from when it is connected: the job runs until it is seen.
    let mut watching = Ended(spawn(&commands[9]));
    let lines = std::io::BufRead::lines(std::io::BufReader::new(
        watching.0.stdout.take().expect("piped stdout"),
    ));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || lines.map_while(Result::ok).try_for_each(|l| tx.send(l)));
    let mut seen = None;
    for _ in 0..20 {
        let job = run(&server, &["run", "jobs/nightly", "--", "true"]);
        assert!(job.status.success(), "{job:?}");
        while let Ok(line) = rx.recv_timeout(Duration::from_millis(500)) {
            if line.contains("jobs/nightly") {
                seen = Some(line);
                break;
            }
        }
        if seen.is_some() {
            break;
        }
    }
    let seen = seen.expect("the watch saw jobs/nightly within 20 tries");
    assert!(
        seen.contains("acquired") || seen.contains("released"),
        "{seen}"
    );

    // ctrl-c ends `acquire`: the key is released.
    unsafe { libc::kill(held.0.id() as i32, libc::SIGINT) };
    assert!(held.0.wait().expect("acquire ends").success());
    let status = leasehold(&server)
        .args(&commands[8])
        .output()
        .expect("status");
    assert!(
        !String::from_utf8_lossy(&status.stdout).contains("deploy"),
        "{status:?}"
    );
}
