//! The same checker over real processes: a chaos run.
//!
//! [`run`] starts a 3-node cluster of real `leaseholdd` processes, each on
//! its own 127.0.0.N behind the testkit's fault proxy, and client processes
//! ([`client`], `leasehold-chaos client`) that take locks with the
//! `leasehold` crate over the network, write to a [`FileGate`] shared by all
//! of them (a directory: every write is checked against the highest token
//! the resource has seen), save checkpoints and release. Each client prints
//! what it did as one JSON line per event, stamped with the machine's
//! monotonic clock (one clock for every process on the machine, so there is
//! no drift to allow for). Meanwhile a seeded nemesis injects real faults, one
//! at a time: `kill -9` of a node (the leader more often than not) and its
//! restart on the same data dir, SIGSTOP/SIGCONT of a node past the election
//! timeout and the TTL, a node partitioned from the others through the
//! proxies (clients still reach it: a holder may only reach the old leader),
//! and a client frozen past its TTL, wherever it was (between its `token()`
//! check and its write, sometimes). Then everything heals, the clients run on
//! for a while, finish, and [`crate::checker::check`] reads the merged
//! history.
//!
//! Unlike the simulation this is not reproducible: the seed fixes the faults'
//! kinds, targets and lengths, not the timing of the processes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use leasehold::{Client, Error, LockOptions};
use leasehold_fence::{FileGate, GateError};
use leasehold_testkit::{http_get, Cluster, Process};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::checker::{self, Verdict};
use crate::history::{Event, Micros, Record};

/// The machine's monotonic clock, in microseconds: the same clock in every
/// process on the machine.
pub fn monotonic_micros() -> Micros {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec as Micros * 1_000_000 + ts.tv_nsec as Micros / 1_000
}

/// What a chaos run does.
#[derive(Debug, Clone)]
pub struct ChaosConfig {
    /// Seeds the faults and the clients' choices.
    pub seed: u64,
    /// How long faults are injected.
    pub faulty: Duration,
    /// How long the clients run on after the last fault healed.
    pub healthy: Duration,
    /// Client processes.
    pub clients: usize,
    /// Keys the clients contend for.
    pub keys: usize,
    /// Their leases' TTL.
    pub ttl: Duration,
    /// Only freeze clients (no node faults): with [`ChaosConfig::blind`], a
    /// quick proof that the checker sees what real processes do.
    pub clients_only: bool,
    /// A planted bug: clients write without checking `token()` and believe
    /// they hold a lock until they release it, whatever their deadline.
    pub blind: bool,
}

impl Default for ChaosConfig {
    fn default() -> Self {
        ChaosConfig {
            seed: 1,
            faulty: Duration::from_secs(30),
            healthy: Duration::from_secs(10),
            clients: 5,
            keys: 2,
            ttl: Duration::from_secs(2),
            clients_only: false,
            blind: false,
        }
    }
}

/// What a chaos run found.
#[derive(Debug)]
pub struct ChaosReport {
    /// The checker's verdict over the merged history.
    pub verdict: Verdict,
    /// Every event, on one clock, from the start of the run.
    pub records: Vec<Record>,
    /// Faults injected, by kind.
    pub faults: std::collections::BTreeMap<&'static str, u64>,
    /// Client calls answered (ok or not).
    pub answers: u64,
    /// Grants received.
    pub grants: u64,
    /// Reads of who holds a key.
    pub reads: u64,
    /// Writes the resource admitted, and refused.
    pub writes: (u64, u64),
    /// Where the history and every process's log were kept, when the
    /// checker found something.
    pub kept: Option<PathBuf>,
}

/// One client's choices, after its flags.
#[derive(Debug, Clone)]
pub struct ClientArgs {
    /// Its number (`c{id}`).
    pub id: usize,
    /// `http://a,b,c`.
    pub endpoints: String,
    /// The fenced resource's directory.
    pub gate: PathBuf,
    /// Keys `k0`, `k1`, ...
    pub keys: usize,
    /// Lease TTL.
    pub ttl: Duration,
    /// Take no new lock once the monotonic clock passes this.
    pub until: Micros,
    /// Seeds its choices.
    pub seed: u64,
    /// The planted bug of [`ChaosConfig::blind`].
    pub blind: bool,
}

fn emit(event: Value) {
    use std::io::Write;
    let mut line = event.to_string();
    line.push('\n');
    let mut out = std::io::stdout().lock();
    // A client that cannot write its history has nothing left to do.
    if out
        .write_all(line.as_bytes())
        .and_then(|_| out.flush())
        .is_err()
    {
        std::process::exit(2);
    }
}

/// The code a call failed with, as the history names it.
fn code(e: &Error) -> &'static str {
    match e {
        Error::Held { .. } => "held",
        Error::LockDelayed { .. } => "lock_delayed",
        Error::Timeout { .. } => "timeout",
        Error::LeaseLost { .. } => "lease_lost",
        Error::StaleFence { .. } => "stale_fence",
        Error::Unavailable(_) => "unavailable",
        Error::OutcomeUnknown(_) => "outcome_unknown",
        _ => "error",
    }
}

/// Microseconds on the monotonic clock of a tokio instant.
fn micros_of(at: tokio::time::Instant) -> Micros {
    let (now, mono) = (tokio::time::Instant::now(), monotonic_micros());
    if at >= now {
        mono + (at - now).as_micros() as Micros
    } else {
        mono.saturating_sub((now - at).as_micros() as Micros)
    }
}

/// A client process: takes locks until `until`, writing through the gate
/// while `token()` says the lease is live, and prints every event.
pub async fn client(args: ClientArgs) -> anyhow::Result<()> {
    let me = args.id;
    let mut rng = StdRng::seed_from_u64(args.seed ^ (me as u64).wrapping_mul(0x9e37_79b9));
    let gate = FileGate::new(&args.gate)?;
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("leasehold=debug"))
        .with_writer(std::io::stderr)
        .init();
    let client = loop {
        match Client::builder(&args.endpoints)
            .holder(format!("c{me}"))
            .connect()
            .await
        {
            Ok(c) => break c,
            Err(_) if monotonic_micros() < args.until => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => return Err(e.into()),
        }
    };
    let opts = LockOptions::default()
        .ttl(args.ttl)
        .wait(Duration::from_secs(3));
    while monotonic_micros() < args.until {
        let key = format!("k{}", rng.gen_range(0..args.keys));
        // Now and then, read who holds the key (a linearizable read at the
        // leader): it must show no released hold and nothing older than a
        // grant already received.
        if rng.gen_bool(0.3) {
            let sent = monotonic_micros();
            if let Ok(locks) = client.status(&key).await {
                let holder = locks.iter().find(|l| l.key == key).and_then(|l| l.fence);
                emit(
                    json!({"at": monotonic_micros(), "ev": "observed", "client": me, "key": key, "holder": holder, "sent": sent}),
                );
            }
        }
        let sent = monotonic_micros();
        emit(json!({"at": sent, "ev": "acquire_sent", "client": me, "key": key}));
        let lease = match client.acquire(&key, opts.clone()).await {
            Ok(lease) => lease,
            Err(e) => {
                emit(
                    json!({"at": monotonic_micros(), "ev": "answer", "client": me, "op": "acquire", "code": code(&e)}),
                );
                tokio::time::sleep(Duration::from_millis(rng.gen_range(20..200))).await;
                continue;
            }
        };
        let fence = lease.fence().unwrap_or(0);
        // A checkpoint is "<saver's token>:<client>:<n>".
        let checkpoint = lease.checkpoint().map(|data| {
            let text = String::from_utf8_lossy(data);
            let saver: u64 = text
                .split(':')
                .next()
                .and_then(|f| f.parse().ok())
                .unwrap_or(0);
            (saver, text.into_owned())
        });
        let at = monotonic_micros();
        emit(
            json!({"at": at, "ev": "granted", "client": me, "key": key, "fence": fence, "sent": sent, "checkpoint": checkpoint}),
        );
        emit(json!({"at": at, "ev": "answer", "client": me, "op": "acquire", "code": "ok"}));
        let writes = rng.gen_range(2..6);
        let mut lost = false;
        for n in 0..writes {
            let token = match lease.token() {
                Ok(token) => token,
                Err(_) if args.blind => fence,
                Err(_) => {
                    lost = true;
                    break;
                }
            };
            // Some writes take a while after the check (work done between
            // `token()` and the write), so a freeze lands there more often.
            if rng.gen_bool(0.3) {
                tokio::time::sleep(Duration::from_millis(rng.gen_range(20..150))).await;
            }
            let sent = monotonic_micros();
            let admitted = match gate.write(&key, token, format!("c{me}").into_bytes()).await {
                Ok(()) => true,
                Err(GateError::Stale(_)) => false,
                Err(e) => return Err(e.into()),
            };
            emit(
                json!({"at": monotonic_micros(), "ev": "wrote", "client": me, "key": key, "fence": token, "admitted": admitted, "sent": sent}),
            );
            if n == writes / 2 {
                let data = format!("{fence}:{me}:{n}");
                emit(
                    json!({"at": monotonic_micros(), "ev": "checkpoint_sent", "client": me, "key": key, "fence": fence, "data": data}),
                );
                let saved = lease.save_checkpoint(data.as_bytes()).await;
                let at = monotonic_micros();
                if saved.is_ok() {
                    emit(
                        json!({"at": at, "ev": "checkpoint_saved", "client": me, "key": key, "fence": fence, "data": data}),
                    );
                }
                let code = saved.as_ref().map_or_else(code, |_| "ok");
                emit(
                    json!({"at": at, "ev": "answer", "client": me, "op": "checkpoint", "code": code}),
                );
            }
            let pause = rng.gen_range(10..(args.ttl.as_millis() as u64 / 2).max(20));
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        let now = monotonic_micros();
        let until = if args.blind {
            now
        } else {
            now.min(micros_of(lease.deadline()))
        };
        let why = if lost || (!lease.is_live() && !args.blind) {
            "lost"
        } else {
            "released"
        };
        emit(
            json!({"at": now, "ev": "hold_ended", "client": me, "key": key, "fence": fence, "until": until, "why": why}),
        );
        let released = lease.release().await;
        let at = monotonic_micros();
        if released.is_ok() {
            emit(json!({"at": at, "ev": "released", "client": me, "key": key, "fence": fence}));
        }
        let code = released.as_ref().map_or_else(code, |_| "ok");
        emit(json!({"at": at, "ev": "answer", "client": me, "op": "release", "code": code}));
    }
    client.close().await;
    Ok(())
}

/// The history's names for the strings a client prints.
fn known(name: &str) -> &'static str {
    [
        "acquire",
        "release",
        "checkpoint",
        "ok",
        "held",
        "timeout",
        "lease_lost",
        "stale_fence",
        "unavailable",
        "outcome_unknown",
        "lost",
        "released",
    ]
    .into_iter()
    .find(|k| *k == name)
    .unwrap_or("error")
}

/// One line a client printed, as a record; `None` for anything else.
pub fn parse_line(line: &str) -> Option<Record> {
    let v: Value = serde_json::from_str(line).ok()?;
    let at = v["at"].as_u64()?;
    let client = v["client"].as_u64()? as usize;
    let key = || v["key"].as_str().map(str::to_string);
    let fence = || v["fence"].as_u64();
    let event = match v["ev"].as_str()? {
        "acquire_sent" => Event::AcquireSent {
            client,
            key: key()?,
        },
        "granted" => Event::Granted {
            client,
            key: key()?,
            fence: fence()?,
            lease: 0,
            sent: v["sent"].as_u64()?,
            checkpoint: v["checkpoint"].as_array().and_then(|c| {
                Some((
                    c.first()?.as_u64()?,
                    c.get(1)?.as_str()?.as_bytes().to_vec(),
                ))
            }),
        },
        "wrote" => Event::Wrote {
            client,
            key: key()?,
            fence: fence()?,
            admitted: v["admitted"].as_bool()?,
            sent: v["sent"].as_u64()?,
        },
        "checkpoint_sent" => Event::CheckpointSent {
            client,
            key: key()?,
            fence: fence()?,
            data: v["data"].as_str()?.as_bytes().to_vec(),
        },
        "checkpoint_saved" => Event::CheckpointSaved {
            client,
            key: key()?,
            fence: fence()?,
            data: v["data"].as_str()?.as_bytes().to_vec(),
        },
        "hold_ended" => Event::HoldEnded {
            client,
            key: key()?,
            fence: fence()?,
            until: v["until"].as_u64()?,
            why: known(v["why"].as_str()?),
        },
        "released" => Event::Released {
            client,
            key: key()?,
            fence: fence()?,
        },
        "observed" => Event::Observed {
            client,
            key: key()?,
            holder: v["holder"].as_u64(),
            sent: v["sent"].as_u64()?,
            node: "the leader".to_string(),
        },
        "answer" => Event::Answer {
            client,
            op: known(v["op"].as_str()?),
            code: v["code"].as_str()?.to_string(),
        },
        _ => return None,
    };
    Some(Record { at, event })
}

/// A client's output as records: its JSON lines, and a panic if it printed one.
fn parse_output(output: &str, client: usize) -> Vec<Record> {
    let mut records: Vec<Record> = output.lines().filter_map(parse_line).collect();
    if let Some(line) = output.lines().find(|l| l.contains("panicked")) {
        let at = records.last().map_or(0, |r| r.at);
        records.push(Record {
            at,
            event: Event::Panic {
                message: format!("client {client}: {line}"),
            },
        });
    }
    records
}

/// The faults the nemesis picks from.
#[derive(Debug, Clone, Copy)]
enum Fault {
    Kill,
    Freeze,
    Partition,
    ClientFreeze,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill-9",
            Fault::Freeze => "sigstop-node",
            Fault::Partition => "partition",
            Fault::ClientFreeze => "sigstop-client",
        }
    }
}

struct Run {
    cluster: Cluster,
    clients: Vec<Process>,
    events: Vec<Record>,
    faults: std::collections::BTreeMap<&'static str, u64>,
}

impl Run {
    fn note(&mut self, event: Event) {
        self.events.push(Record {
            at: monotonic_micros(),
            event,
        });
    }

    /// A node to hit: the leader three times in five, if one leads.
    fn target(&self, rng: &mut StdRng) -> usize {
        match self.cluster.leader() {
            Some(l) if rng.gen_bool(0.6) => l,
            _ => rng.gen_range(0..self.cluster.nodes.len()),
        }
    }

    /// Clients that hold a lock now, by the leader's list of locks.
    fn holders(&self) -> Vec<usize> {
        fn names(v: &Value, out: &mut Vec<usize>) {
            match v {
                Value::String(s) => {
                    out.extend(s.strip_prefix('c').and_then(|n| n.parse::<usize>().ok()))
                }
                Value::Array(a) => a.iter().for_each(|v| names(v, out)),
                Value::Object(o) => o.values().for_each(|v| names(v, out)),
                _ => {}
            }
        }
        let mut found = Vec::new();
        let leader = self.cluster.leader().map(|l| &self.cluster.nodes[l]);
        if let Some(body) = leader.and_then(|n| http_get(&n.addr, "/v1/locks")) {
            if let Ok(v) = serde_json::from_str::<Value>(&body) {
                names(&v, &mut found);
            }
        }
        found.retain(|&c| c < self.clients.len());
        found
    }

    fn inject(&mut self, fault: Fault, rng: &mut StdRng, ttl: Duration) {
        let span = match fault {
            Fault::Kill => Duration::from_millis(rng.gen_range(300..3_000)),
            Fault::Freeze | Fault::Partition => {
                Duration::from_millis(rng.gen_range(1_000..3_000)) + ttl
            }
            Fault::ClientFreeze => ttl.mul_f64(rng.gen_range(1.2..2.5)),
        };
        let target = match fault {
            Fault::ClientFreeze => match self.holders().first() {
                Some(&holder) if rng.gen_bool(0.7) => holder,
                _ => rng.gen_range(0..self.clients.len()),
            },
            _ => self.target(rng),
        };
        let who = match fault {
            Fault::ClientFreeze => format!("client {target}"),
            _ => format!("node {}", target + 1),
        };
        *self.faults.entry(fault.name()).or_default() += 1;
        self.note(Event::Fault {
            kind: fault.name(),
            detail: format!("{who} for {} ms", span.as_millis()),
        });
        match fault {
            Fault::Kill => self.cluster.kill(target),
            Fault::Freeze => {
                if let Some(p) = &self.cluster.nodes[target].process {
                    p.pause()
                }
            }
            Fault::Partition => self.cluster.isolate(target),
            Fault::ClientFreeze => self.clients[target].pause(),
        }
        std::thread::sleep(span);
        match fault {
            Fault::Kill => self.cluster.restart(target),
            Fault::Freeze => {
                if let Some(p) = &self.cluster.nodes[target].process {
                    p.resume()
                }
            }
            Fault::Partition => self.cluster.heal(),
            Fault::ClientFreeze => self.clients[target].resume(),
        }
        self.note(Event::Healed {
            detail: format!("{} of {who}", fault.name()),
        });
    }
}

/// Runs a chaos run: real processes, real faults, the simulation's checker.
/// `client_bin` is the `leasehold-chaos` binary (it runs the clients).
pub fn run(config: &ChaosConfig, client_bin: &Path) -> anyhow::Result<ChaosReport> {
    let mut rng = StdRng::seed_from_u64(config.seed);
    let dir = tempfile::tempdir()?;
    let gate = dir.path().join("resource");
    std::fs::create_dir_all(&gate)?;
    let cluster = Cluster::start_isolatable(3);
    let origin = monotonic_micros();
    let until = origin + (config.faulty + config.healthy).as_micros() as Micros;
    let endpoints = cluster.endpoints();
    let clients = (0..config.clients)
        .map(|id| {
            let args: Vec<String> = [
                "client",
                "--id",
                &id.to_string(),
                "--endpoints",
                &endpoints,
                "--gate",
                &gate.display().to_string(),
                "--keys",
                &config.keys.to_string(),
                "--ttl-ms",
                &config.ttl.as_millis().to_string(),
                "--until",
                &until.to_string(),
                "--seed",
                &config.seed.to_string(),
            ]
            .map(str::to_string)
            .to_vec();
            let mut args = args;
            if config.blind {
                args.push("--blind".to_string());
            }
            Process::spawn(
                client_bin,
                &args,
                &dir.path().join(format!("client-{id}.log")),
            )
        })
        .collect();
    let mut run = Run {
        cluster,
        clients,
        events: Vec::new(),
        faults: Default::default(),
    };
    let faulty_until = origin + config.faulty.as_micros() as Micros;
    while monotonic_micros() < faulty_until {
        std::thread::sleep(Duration::from_millis(rng.gen_range(500..2_000)));
        let fault = match if config.clients_only {
            3
        } else {
            rng.gen_range(0..4)
        } {
            0 => Fault::Kill,
            1 => Fault::Freeze,
            2 => Fault::Partition,
            _ => Fault::ClientFreeze,
        };
        run.inject(fault, &mut rng, config.ttl);
    }
    let healed = monotonic_micros();
    let mut records = std::mem::take(&mut run.events);
    for (id, client) in run.clients.iter_mut().enumerate() {
        let left = Duration::from_micros(until.saturating_sub(monotonic_micros()));
        let status = client.wait_exit(left + Duration::from_secs(30));
        let mut output = parse_output(&client.output(), id);
        match status {
            Some(s) if s.success() => {}
            other => output.push(Record {
                at: monotonic_micros(),
                event: Event::Panic {
                    message: format!(
                        "client {id} ended with {other:?}: {}",
                        client.output().lines().last().unwrap_or("")
                    ),
                },
            }),
        }
        records.extend(output);
    }
    records.sort_by_key(|r| r.at);
    for r in &mut records {
        r.at = r.at.saturating_sub(origin);
        if let Event::Granted { sent, .. } = &mut r.event {
            *sent = sent.saturating_sub(origin);
        }
        if let Event::HoldEnded { until, .. } = &mut r.event {
            *until = until.saturating_sub(origin);
        }
        if let Event::Observed { sent, .. } = &mut r.event {
            *sent = sent.saturating_sub(origin);
        }
    }
    let verdict = checker::check(&records, healed.saturating_sub(origin));
    let faults = std::mem::take(&mut run.faults);
    let kept = if verdict.violations.is_empty() {
        None
    } else {
        // Keep the nodes' and clients' logs, with the history beside them.
        let history: String = records.iter().map(|r| format!("{r}\n")).collect();
        std::fs::write(dir.path().join("history.txt"), history)?;
        for n in &run.cluster.nodes {
            std::fs::write(dir.path().join(format!("node-{}.log", n.id)), n.output())?;
        }
        drop(run);
        Some(dir.keep())
    };
    let count = |f: &dyn Fn(&Event) -> bool| records.iter().filter(|r| f(&r.event)).count() as u64;
    Ok(ChaosReport {
        answers: count(&|e| matches!(e, Event::Answer { .. })),
        grants: count(&|e| matches!(e, Event::Granted { .. })),
        reads: count(&|e| matches!(e, Event::Observed { .. })),
        writes: (
            count(&|e| matches!(e, Event::Wrote { admitted: true, .. })),
            count(&|e| {
                matches!(
                    e,
                    Event::Wrote {
                        admitted: false,
                        ..
                    }
                )
            }),
        ),
        faults,
        verdict,
        kept,
        records,
    })
}
