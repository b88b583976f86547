//! `leasehold`: locks from the shell.
//!
//! `leasehold run KEY -- CMD` is flock(1) for a cluster: exactly one machine
//! runs CMD, which gets its fencing token in `LEASEHOLD_FENCE`, and CMD is
//! stopped if the lease is lost.

mod cmd;

use std::time::Duration;

use clap::{Parser, Subcommand};

/// Exit code when the lock is held by someone else (EX_TEMPFAIL).
pub const EXIT_NOT_ACQUIRED: i32 = 75;
/// Exit code when the lease was lost while CMD ran (EX_PROTOCOL).
pub const EXIT_LOST: i32 = 76;

/// Distributed locks with fencing tokens.
#[derive(Parser, Debug)]
#[command(
    name = "leasehold",
    version,
    next_help_heading = "Global options (before or after the subcommand)"
)]
struct Cli {
    /// The lock store: http://HOST:PORT (leaseholdd; a cluster's nodes as
    /// http://HOST:PORT,HOST:PORT,...), redis://, redlock://H1,H2,H3,
    /// postgres://, etcd://HOST:PORT or memory://.
    #[arg(long, global = true, visible_alias = "backend", env = "LEASEHOLD_ENDPOINT", default_value = leasehold::DEFAULT_ENDPOINT)]
    endpoint: String,
    /// How this process names itself to others (default: host/pid).
    #[arg(long, global = true, env = "LEASEHOLD_HOLDER")]
    holder: Option<String>,
    /// For https:// endpoints: trust the CA certificates in this file (PEM)
    /// instead of the system's.
    #[arg(long, global = true, env = "LEASEHOLD_CACERT")]
    cacert: Option<std::path::PathBuf>,
    /// For https:// endpoints: a client certificate (PEM), for a server
    /// started with --tls-client-ca.
    #[arg(
        long,
        global = true,
        alias = "cert",
        env = "LEASEHOLD_CLIENT_CERT",
        requires = "client_key"
    )]
    client_cert: Option<std::path::PathBuf>,
    /// The private key of --client-cert (PEM).
    #[arg(
        long,
        global = true,
        alias = "key",
        env = "LEASEHOLD_CLIENT_KEY",
        requires = "client_cert"
    )]
    client_key: Option<std::path::PathBuf>,
    /// The access token, for a leaseholdd with auth enabled (from
    /// `leasehold auth enable` or `leasehold auth token create`).
    #[arg(long, global = true, env = "LEASEHOLD_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(subcommand)]
    command: Command,
}

impl Cli {
    /// The TLS files given, for https:// endpoints.
    fn tls(&self) -> leasehold::TlsOptions {
        leasehold::TlsOptions {
            ca: self.cacert.clone(),
            identity: self.client_cert.clone().zip(self.client_key.clone()),
        }
    }
}

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration like 500ms, 30s or 5m: {e}"))
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run CMD while holding KEY; stop it if the lease is lost.
    Run {
        /// The lock.
        key: String,
        /// Lease TTL; renewed every TTL/3.
        #[arg(long, default_value = "30s", value_parser = duration)]
        ttl: Duration,
        /// Wait this long for the lock (default: do not wait).
        #[arg(long, value_parser = duration)]
        wait: Option<Duration>,
        /// After SIGTERM on loss, wait this long before SIGKILL.
        #[arg(long, default_value = "5s", value_parser = duration)]
        grace: Duration,
        /// After an expiry of this hold, keep the key from others this long.
        #[arg(long, default_value = "0s", value_parser = duration)]
        lock_delay: Duration,
        /// Take one of N permits of a counting semaphore instead: up to N
        /// commands run at once (every holder must give the same N).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000), conflicts_with = "shared")]
        permits: Option<u32>,
        /// Take KEY as one of many readers of a read/write lock; a plain
        /// `run KEY` is its writer.
        #[arg(long)]
        shared: bool,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Campaign to be the one active NAME, then run CMD while leading.
    Elect {
        /// The election.
        name: String,
        /// This candidate's value, shown to others (e.g. node-3).
        #[arg(long)]
        value: String,
        /// Lease TTL; renewed every TTL/3.
        #[arg(long, default_value = "15s", value_parser = duration)]
        ttl: Duration,
        /// After SIGTERM on loss, wait this long before SIGKILL.
        #[arg(long, default_value = "5s", value_parser = duration)]
        grace: Duration,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Take KEY, print its fencing token, and hold it until interrupted
    /// (then release it); exit 76 at once if the lock is lost.
    Acquire {
        /// The lock.
        key: String,
        /// Lease TTL; renewed every TTL/3.
        #[arg(long, default_value = "30s", value_parser = duration)]
        ttl: Duration,
        /// Wait this long for the lock (default: do not wait).
        #[arg(long, value_parser = duration)]
        wait: Option<Duration>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Release KEY if FENCE still holds it.
    Release {
        /// The lock.
        key: String,
        /// The fencing token that holds it.
        #[arg(long)]
        fence: u64,
    },
    /// List locks: key, holder, fence, TTL left, waiters.
    Status {
        /// Only keys with this prefix.
        #[arg(default_value = "")]
        prefix: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Free keys too: those nobody holds or waits for, kept for a
        /// checkpoint (an election's last value, say) or a lock-delay.
        #[arg(long)]
        all: bool,
    },
    /// Load-test the store: the same closed-loop workload on any backend.
    Bench {
        /// What to measure.
        #[arg(long, value_enum, default_value = "cycle")]
        workload: cmd::bench::Workload,
        /// Concurrent clients, each with its own connection.
        #[arg(long, default_value_t = 50)]
        clients: usize,
        /// How long to run (cycle, contended, renew, sessions, keep).
        #[arg(long, default_value = "10s", value_parser = duration)]
        duration: Duration,
        /// Distinct keys (cycle), leases (renew), sessions (sessions) or locks to hold (hold, keep).
        #[arg(long, default_value_t = 100_000)]
        keys: u64,
        /// Lease TTL.
        #[arg(long, default_value = "30s", value_parser = duration)]
        ttl: Duration,
        /// The server's pid, to report its CPU (with its child processes) and memory.
        #[arg(long)]
        server_pid: Option<u32>,
        /// sessions: when the window ends, every session stops renewing at
        /// once; report how late after its TTL each expired, and any early.
        #[arg(long)]
        stop_renewing: bool,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Demonstrations that start everything they need locally.
    Demo {
        #[command(subcommand)]
        demo: Demo,
    },
    /// Worker A of `demo fencing` (internal).
    #[command(hide = true)]
    DemoWorker {
        key: String,
        account: String,
        deposit: i64,
    },
    /// Inside `leasehold run`: exit 0 and print the token while the lease is
    /// good, 76 once it is lost or past its deadline (even if `leasehold run`
    /// is frozen). `while leasehold check; do write; done`
    Check {
        /// The state file `leasehold run` keeps.
        #[arg(long, env = "LEASEHOLD_STATE")]
        state: Option<std::path::PathBuf>,
    },
    /// A leaseholdd cluster's members: status, add, remove.
    Cluster {
        #[command(subcommand)]
        action: ClusterAction,
    },
    /// Backups: save one from the leader, or show what one holds.
    Snapshot {
        #[command(subcommand)]
        action: SnapshotAction,
    },
    /// Access control: turn it on or off, roles on key prefixes, tokens,
    /// the audit trail.
    Auth {
        #[command(subcommand)]
        action: AuthAction,
    },
    /// Who leads the election NAME (see `elect`): its value and token, or
    /// "(none)"; with --watch, every change as it happens.
    Leader {
        /// The election.
        name: String,
        /// Keep printing each change.
        #[arg(long)]
        watch: bool,
        /// Print JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Print lock events as they happen. The watch goes on at another
    /// endpoint if its node goes, missing nothing; if events were lost all
    /// the same (`watch_behind`), it says so and exits 1.
    Watch {
        /// Only keys with this prefix.
        #[arg(default_value = "")]
        prefix: String,
        /// Print JSON lines (each with its `index` and `seq`).
        #[arg(long)]
        json: bool,
        /// Start just after this event (`INDEX` or `INDEX.SEQ`, from an
        /// earlier watch's JSON): every event since, then on.
        #[arg(long, value_name = "INDEX[.SEQ]", value_parser = parse_position)]
        after: Option<(u64, u32)>,
    },
}

#[derive(Subcommand, Debug)]
enum ClusterAction {
    /// Members, leader, term, each member's replicated index and lag.
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Add node ID at ADDR: it joins as a learner, catches up, then votes.
    /// Start it first with --node-id ID and --peers naming the members and itself.
    Add {
        /// The new node's id.
        id: u64,
        /// Its HOST:PORT.
        addr: String,
    },
    /// Remove node ID (refused if the voters left could not form a quorum).
    Remove {
        /// The node's id.
        id: u64,
    },
    /// Hand leadership to voter ID (or the most caught-up follower), for a
    /// planned restart of the leader. A leader stopped with SIGTERM does
    /// this itself.
    TransferLeader {
        /// The voter to take over.
        id: Option<u64>,
    },
}

#[derive(Subcommand, Debug)]
enum SnapshotAction {
    /// Save a backup of the cluster into FILE: taken online from the leader
    /// (every write acknowledged before it is in it), checked, written
    /// whole or not at all (admin on every key). Restore it with
    /// `leaseholdd restore`.
    Save {
        /// Where to write it.
        file: std::path::PathBuf,
    },
    /// Show what a backup holds (format, log index and term, voters, table),
    /// checking its checksums.
    Status {
        /// The backup.
        file: std::path::PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
enum AuthAction {
    /// Turn auth on. Prints the root token (admin on every key) once: keep it.
    Enable,
    /// Turn auth off: anyone who can connect may do anything again.
    Disable,
    /// Whether auth is on, the roles and the tokens (never their secrets).
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Every change to auth: who made it and when.
    Audit {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Roles: permissions on key prefixes.
    Role {
        #[command(subcommand)]
        action: RoleAction,
    },
    /// Tokens: create one for a role, or revoke one.
    Token {
        #[command(subcommand)]
        action: TokenAction,
    },
}

#[derive(Subcommand, Debug)]
enum RoleAction {
    /// Create role NAME or replace its rules. For a key, the rule with the
    /// longest matching prefix decides; a key no rule covers gets nothing.
    /// An empty prefix ("") covers every key.
    Set {
        /// The role.
        name: String,
        /// Describe, list and watch keys under PREFIX (repeatable).
        #[arg(long = "read", value_name = "PREFIX")]
        read: Vec<String>,
        /// Also acquire, release and checkpoint under PREFIX (repeatable).
        #[arg(long = "lock", value_name = "PREFIX")]
        lock: Vec<String>,
        /// Also revoke others' leases under PREFIX; on "" also membership
        /// and auth changes (repeatable).
        #[arg(long = "admin", value_name = "PREFIX")]
        admin: Vec<String>,
        /// Nothing under PREFIX, carving it out of a wider rule (repeatable).
        #[arg(long = "deny", value_name = "PREFIX")]
        deny: Vec<String>,
    },
    /// Delete role NAME (refused while a token uses it).
    Delete {
        /// The role.
        name: String,
    },
}

#[derive(Subcommand, Debug)]
enum TokenAction {
    /// Create a token for ROLE; prints it once.
    Create {
        /// The role it acts as.
        #[arg(long)]
        role: String,
        /// A name for people (default: the role's).
        #[arg(long)]
        name: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Revoke token ID: every node refuses it from then on.
    Revoke {
        /// The token's id (the number in lh_<id>_...).
        id: u64,
    },
}

#[derive(Subcommand, Debug)]
enum Demo {
    /// A paused holder's stale write: without a fence gate it corrupts the
    /// result, with one it is refused.
    Fencing,
}

/// An event's position as `--after` takes it: `INDEX` (after that whole
/// entry) or `INDEX.SEQ`.
fn parse_position(s: &str) -> Result<(u64, u32), String> {
    let bad = || format!("{s:?} is not INDEX or INDEX.SEQ (an event's index and seq)");
    match s.split_once('.') {
        None => Ok((s.parse().map_err(|_| bad())?, u32::MAX)),
        Some((index, seq)) => Ok((
            index.parse().map_err(|_| bad())?,
            seq.parse().map_err(|_| bad())?,
        )),
    }
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LEASEHOLD_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("leasehold: start runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = runtime.block_on(async move {
        match cmd::dispatch(cli).await {
            Ok(code) => code,
            Err(e) => {
                eprintln!("leasehold: {e:#}");
                1
            }
        }
    });
    // Do not wait for background work (e.g. a best-effort release) to drain.
    runtime.shutdown_timeout(Duration::from_secs(1));
    std::process::exit(code);
}
