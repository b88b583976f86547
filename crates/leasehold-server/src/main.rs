//! `leaseholdd`: the Leasehold lock server.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{CommandFactory, Parser};
use std::time::Duration;

mod admin;

use admin::{run_admin, Admin};
use leasehold_server::admission::{Quotas, TokenQuota};
use leasehold_server::config_file;
use leasehold_server::net::Limits;
use leasehold_server::raft::storage::dir_lock::{DirLock, DirLockError};
use leasehold_server::raft::{AddressMismatch, RaftOptions};
use leasehold_server::server::{self, ClusterConfig, Config};
use leasehold_server::tls::{Tls, TlsFiles};

/// The Leasehold lock server: leases with fencing tokens over gRPC and HTTP/JSON.
#[derive(Parser, Debug)]
#[command(version, args_override_self = true)]
struct Args {
    /// A TOML file of settings: any flag below by its long name
    /// (`listen = "127.0.0.1:7419"`, `data-dir = "..."`). A flag given on the
    /// command line, or its environment variable, overrides the file.
    #[arg(long, env = "LEASEHOLD_CONFIG")]
    config: Option<PathBuf>,
    /// Print the effective configuration as TOML (file, environment and
    /// flags combined) and exit.
    #[arg(long)]
    print_config: bool,
    /// Address for gRPC and HTTP (one port serves both).
    #[arg(long, env = "LEASEHOLD_LISTEN", default_value = "127.0.0.1:7419")]
    listen: SocketAddr,
    /// Directory for the Raft log, vote and snapshots.
    #[arg(long, env = "LEASEHOLD_DATA_DIR", default_value = "./leasehold-data")]
    data_dir: PathBuf,
    /// Take a snapshot after at least this many applied commands (and purge
    /// the log before it), once their log entries are as large as the last
    /// snapshot.
    #[arg(long, default_value_t = 100_000)]
    snapshot_every: u64,
    /// A snapshot goes to a peer that needs one in chunks of at most this
    /// many bytes (1 KiB to 32 MiB).
    #[arg(long, default_value_t = 3 * 1024 * 1024,
          value_parser = clap::value_parser!(u64).range(1024..=32 * 1024 * 1024))]
    snapshot_chunk_bytes: u64,
    /// Threads serving the API and running consensus. 1 (the default) runs
    /// everything, the log's flushes included, on one thread: on a 2-core machine
    /// that measured ~5% lower latency and ~15% less CPU per request than two
    /// threads, because a request's steps never wait for another thread to wake.
    #[arg(long, env = "LEASEHOLD_THREADS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    threads: u16,
    /// Open client connections at most; more are closed at once (default:
    /// 10,000, or fewer if the open-file limit is lower).
    #[arg(long)]
    max_connections: Option<usize>,
    /// Time a new connection has to send its first byte, and an HTTP/1
    /// request its headers.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    header_timeout: Duration,
    /// A connection with no call in flight for this long is closed (clients
    /// reconnect on their next call).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    idle_timeout: Duration,
    /// This node's id in a cluster (with --peers).
    #[arg(long, env = "LEASEHOLD_NODE_ID", requires = "peers")]
    node_id: Option<u64>,
    /// A cluster's initial voters, this node among them: ID=HOST:PORT,...
    /// (each node's client and peer address). Without it, a single node.
    #[arg(long, env = "LEASEHOLD_PEERS", value_parser = parse_peers, requires = "node_id")]
    peers: Option<BTreeMap<u64, String>>,
    /// The leader's heartbeat to followers.
    #[arg(long, default_value = "50ms", value_parser = humantime::parse_duration)]
    heartbeat: Duration,
    /// A follower that hears no leader for this long (up to twice it, at
    /// random) after its leader's lease (twice this) runs out starts an
    /// election: a dead leader is replaced in about 3 to 4 times this.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    election_timeout: Duration,
    /// Serve on an address that is not loopback without TLS (--tls-cert,
    /// --tls-key), without a way to tell callers apart (client
    /// certificates, --tls-client-ca, or access tokens, --require-auth) or,
    /// in a cluster, without peer TLS: whoever reaches the port could then
    /// take, release or revoke any lock. Only on a network you trust.
    #[arg(long, env = "LEASEHOLD_INSECURE")]
    insecure: bool,
    /// Every caller needs an access token: while auth is not enabled yet
    /// (`leasehold auth enable`), only callers on this machine (connecting
    /// from the address they connect to, e.g. 127.0.0.1) are served.
    #[arg(long, env = "LEASEHOLD_REQUIRE_AUTH")]
    require_auth: bool,
    /// Hash the table after every this many log entries, on every member,
    /// and have the leader compare the hashes (0: never).
    #[arg(long, default_value_t = 100_000)]
    hash_check_every: u64,
    /// Live leases at most; a grant past it is refused with
    /// `resource_exhausted` (keepalives, releases and revokes never are).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    max_leases: Option<u64>,
    /// Keys held at most; an acquire past it is refused.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    max_locks: Option<u64>,
    /// Acquires waiting in queues at most; a wait past it is refused.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    max_waiters: Option<u64>,
    /// Live leases at most per access token (once auth is on); a grant
    /// past it is refused for that token alone.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    max_leases_per_token: Option<u64>,
    /// Keys held at most by the leases of one access token (once auth is
    /// on); an acquire past it is refused for that token alone.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    max_locks_per_token: Option<u64>,
    /// Acquires waiting in queues at most per access token (once auth is
    /// on); a wait past it is refused for that token alone.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    max_waiters_per_token: Option<u64>,
    /// Requests that create (grants, acquires, checkpoints) a second per
    /// access token, with a burst of as many; keepalives, releases and
    /// revokes are never limited. Applies once auth is on.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    rate_limit: Option<u32>,
    /// A role's own limits on each of its tokens,
    /// `ROLE=leases:N,locks:N,waiters:N,rate:M` (any of them), in place of
    /// the four per-token flags for that role's tokens. Repeat it for more
    /// roles.
    #[arg(long, value_parser = TokenQuota::parse)]
    role_quota: Vec<(String, TokenQuota)>,
    /// The certificate (PEM, chain) clients see; with it the port speaks
    /// TLS only (gRPC, HTTP and the framed protocol alike).
    #[arg(long, env = "LEASEHOLD_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "LEASEHOLD_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Clients must present a certificate signed by this CA (PEM).
    #[arg(long, env = "LEASEHOLD_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// This node's peer certificate (PEM), naming it as the DNS name
    /// ID.node.leasehold; peers then talk mutual TLS.
    #[arg(long, env = "LEASEHOLD_PEER_TLS_CERT", requires_all = ["peer_tls_key", "peer_tls_ca"])]
    peer_tls_cert: Option<PathBuf>,
    /// The private key of --peer-tls-cert (PEM).
    #[arg(long, env = "LEASEHOLD_PEER_TLS_KEY", requires = "peer_tls_cert")]
    peer_tls_key: Option<PathBuf>,
    /// The CA that signs every node's peer certificate (PEM); keep it apart
    /// from the clients' CA.
    #[arg(long, env = "LEASEHOLD_PEER_TLS_CA", requires = "peer_tls_cert")]
    peer_tls_ca: Option<PathBuf>,
    #[command(subcommand)]
    admin: Option<Admin>,
}

pub(crate) fn parse_peers(s: &str) -> Result<BTreeMap<u64, String>, String> {
    let mut peers = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?} is not ID=HOST:PORT"))?;
        let id: u64 = id
            .parse()
            .map_err(|_| format!("{id:?} in {part:?} is not a node id"))?;
        if id == 0 {
            return Err("node ids start at 1".into());
        }
        if !addr.contains(':') {
            return Err(format!("{addr:?} in {part:?} is not HOST:PORT"));
        }
        if peers.insert(id, addr.to_string()).is_some() {
            return Err(format!("node {id} is named twice"));
        }
    }
    if peers.is_empty() {
        return Err("no peers given".into());
    }
    Ok(peers)
}

/// File descriptors kept free of client connections: the log, snapshots,
/// and room to accept and close a connection over the cap.
/// The flags, with a config file's settings placed before the real ones.
fn parse_args() -> anyhow::Result<Args> {
    // Only --config is looked for first: the file may hold what other flags
    // require (--peers for --node-id).
    let mut path = std::env::var_os("LEASEHOLD_CONFIG").map(PathBuf::from);
    let mut given = std::env::args_os().skip(1);
    while let Some(arg) = given.next() {
        let arg = arg.to_string_lossy().into_owned();
        if arg == "--config" {
            path = given.next().map(PathBuf::from);
        } else if let Some(p) = arg.strip_prefix("--config=") {
            path = Some(PathBuf::from(p));
        }
    }
    let Some(path) = path else {
        return Ok(Args::parse());
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("read config file {}", path.display()))?;
    let flags: Vec<config_file::Flag> = Args::command()
        .get_arguments()
        .filter(|a| {
            !matches!(
                a.get_id().as_str(),
                "config" | "print_config" | "help" | "version"
            )
        })
        .filter_map(|a| {
            Some(config_file::Flag {
                name: a.get_long()?.to_string(),
                env: a.get_env().map(|e| e.to_string_lossy().into_owned()),
                takes_value: a.get_action().takes_values(),
                repeats: matches!(a.get_action(), clap::ArgAction::Append),
            })
        })
        .collect();
    let from_file = config_file::to_args(&text, &flags)
        .map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))?;
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().take(1).collect();
    argv.extend(from_file.into_iter().map(Into::into));
    argv.extend(std::env::args_os().skip(1));
    Ok(Args::parse_from(argv))
}

/// The effective configuration as a config file would hold it. Nothing in
/// it is secret yet; credentials, once there are any, are shown elided.
fn effective_config(args: &Args) -> String {
    let q = |s: String| toml::Value::String(s).to_string();
    let d = |d: Duration| q(humantime::format_duration(d).to_string());
    let mut out = String::new();
    let mut line = |key: &str, value: String| out.push_str(&format!("{key} = {value}\n"));
    line("listen", q(args.listen.to_string()));
    line("data-dir", q(args.data_dir.display().to_string()));
    line("snapshot-every", args.snapshot_every.to_string());
    line(
        "snapshot-chunk-bytes",
        args.snapshot_chunk_bytes.to_string(),
    );
    line("threads", args.threads.to_string());
    if let Some(max) = args.max_connections {
        line("max-connections", max.to_string());
    }
    line("header-timeout", d(args.header_timeout));
    line("idle-timeout", d(args.idle_timeout));
    if let Some(id) = args.node_id {
        line("node-id", id.to_string());
    }
    if let Some(peers) = &args.peers {
        let list: Vec<String> = peers.iter().map(|(id, a)| format!("{id}={a}")).collect();
        line("peers", q(list.join(",")));
    }
    line("heartbeat", d(args.heartbeat));
    line("election-timeout", d(args.election_timeout));
    line("insecure", args.insecure.to_string());
    line("require-auth", args.require_auth.to_string());
    let limits = [
        ("max-leases", args.max_leases),
        ("max-locks", args.max_locks),
        ("max-waiters", args.max_waiters),
        ("max-leases-per-token", args.max_leases_per_token),
        ("max-locks-per-token", args.max_locks_per_token),
        ("max-waiters-per-token", args.max_waiters_per_token),
        ("rate-limit", args.rate_limit.map(u64::from)),
    ];
    for (name, value) in limits {
        if let Some(value) = value {
            line(name, value.to_string());
        }
    }
    if !args.role_quota.is_empty() {
        let quotas: Vec<String> = args
            .role_quota
            .iter()
            .map(|(role, quota)| {
                let mut limits = Vec::new();
                limits.extend(quota.leases.map(|n| format!("leases:{n}")));
                limits.extend(quota.locks.map(|n| format!("locks:{n}")));
                limits.extend(quota.waiters.map(|n| format!("waiters:{n}")));
                limits.extend(quota.rate.map(|n| format!("rate:{n}")));
                q(format!("{role}={}", limits.join(",")))
            })
            .collect();
        line("role-quota", format!("[{}]", quotas.join(", ")));
    }
    // Paths only: the files' contents (keys) are never printed.
    let paths = [
        ("tls-cert", &args.tls_cert),
        ("tls-key", &args.tls_key),
        ("tls-client-ca", &args.tls_client_ca),
        ("peer-tls-cert", &args.peer_tls_cert),
        ("peer-tls-key", &args.peer_tls_key),
        ("peer-tls-ca", &args.peer_tls_ca),
    ];
    for (key, path) in paths {
        if let Some(p) = path {
            line(key, q(p.display().to_string()));
        }
    }
    out
}

const RESERVED_FDS: u64 = 64;

/// mimalloc: with a million small allocations (keys, tree nodes) glibc's
/// malloc kept ~270 bytes per held lock resident; see bench/results.md.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A mistake in the flags, the config file or the files they name: one
/// line and exit code 2, as for a flag clap refuses.
const EXIT_CONFIG: u8 = 2;

fn main() -> std::process::ExitCode {
    use std::io::IsTerminal;
    leasehold_server::allocator::purge_at_once();
    // openraft's own lines are for its developers: a vote that changed
    // under a message at WARN, and at ERROR every call to a peer that is
    // still starting. What an operator must act on leaseholdd logs itself
    // (a peer it cannot reach, with why; a Raft core that stopped, with
    // why). `RUST_LOG=info,openraft=warn` shows them again.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,openraft=off".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let fail = |code: u8, e: anyhow::Error| {
        // `{:#}`, never `{:?}`: the causes on one line, and no backtrace
        // even with RUST_BACKTRACE set.
        eprintln!("leaseholdd: {e:#}");
        std::process::ExitCode::from(code)
    };
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => return fail(EXIT_CONFIG, e),
    };
    if let Some(admin) = args.admin {
        return run_admin(admin);
    }
    if args.print_config {
        print!("{}", effective_config(&args));
        return std::process::ExitCode::SUCCESS;
    }
    let fd_limit = leasehold_server::net::raise_fd_limit();
    let (listen, config) = match settings(args, fd_limit) {
        Ok(s) => s,
        Err(e) => return fail(EXIT_CONFIG, e),
    };
    // Before the data dir is read and the port bound: a second process on
    // this data dir reads nothing and takes nothing.
    let lock = match DirLock::exclusive(&config.0.data_dir) {
        Ok(lock) => lock,
        Err(e @ DirLockError::InUse { .. }) => return fail(EXIT_CONFIG, e.into()),
        Err(e) => return fail(1, e.into()),
    };
    tracing::info!(
        max_connections = config.0.limits.max_connections,
        open_files_limit = fd_limit,
        "connection limits"
    );
    let threads = config.1;
    let runtime = match threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(usize::from(n));
            builder
        }
    }
    .enable_all()
    .build();
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => return fail(1, anyhow::Error::new(e).context("start the async runtime")),
    };
    match runtime.block_on(serve(lock, listen, config.0)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // Started as another node than its data dir holds: as for a flag.
        Err(e) if e.downcast_ref::<AddressMismatch>().is_some() => fail(EXIT_CONFIG, e),
        Err(e) => fail(1, e),
    }
}

fn tls_files(args: &Args) -> TlsFiles {
    TlsFiles {
        cert: args.tls_cert.clone(),
        key: args.tls_key.clone(),
        client_ca: args.tls_client_ca.clone(),
        peer_cert: args.peer_tls_cert.clone(),
        peer_key: args.peer_tls_key.clone(),
        peer_ca: args.peer_tls_ca.clone(),
    }
}

/// Why serving on a non-loopback address would let strangers in, if it would.
fn exposed(args: &Args, files: &TlsFiles) -> Option<&'static str> {
    if args.listen.ip().is_loopback() || args.insecure {
        return None;
    }
    if !files.for_clients() {
        return Some("without TLS (--tls-cert, --tls-key)");
    }
    if files.client_ca.is_none() && !args.require_auth {
        return Some(
            "without client certificates (--tls-client-ca) or access tokens (--require-auth)",
        );
    }
    if args.peers.is_some() && !files.for_peers() {
        return Some("without peer certificates (--peer-tls-cert, --peer-tls-key, --peer-tls-ca)");
    }
    None
}

/// Checks the flags and loads the files they name: the listen address, the
/// server's configuration and the runtime's thread count. Every error here
/// is the operator's to fix.
fn settings(args: Args, fd_limit: Option<u64>) -> anyhow::Result<(SocketAddr, (Config, u16))> {
    let files = tls_files(&args);
    if let Some(why) = exposed(&args, &files) {
        anyhow::bail!(
            "refusing to listen on {}, which is not loopback, {why}: whoever reaches the port could take, release or revoke any lock; add them, or pass --insecure on a network you trust",
            args.listen
        );
    }
    anyhow::ensure!(
        args.peers.is_none() || !files.for_clients() || files.for_peers(),
        "with --tls-cert a cluster's nodes need peer certificates too (--peer-tls-cert, --peer-tls-key, --peer-tls-ca): the port refuses plaintext, peers' calls included"
    );
    let tls = Tls::load(files).context("load TLS files")?;
    let cluster = match (args.node_id, args.peers.clone()) {
        (Some(id), Some(members)) => {
            anyhow::ensure!(
                members.contains_key(&id),
                "--node-id {id} is not among --peers ({})",
                members
                    .keys()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            Some(ClusterConfig { id, members })
        }
        _ => None,
    };
    anyhow::ensure!(
        args.heartbeat < args.election_timeout,
        "--heartbeat ({:?}) must be shorter than --election-timeout ({:?})",
        args.heartbeat,
        args.election_timeout
    );
    let default = Limits::default();
    let fit = fd_limit.map_or(default.max_connections, |fds| {
        usize::try_from(fds.saturating_sub(RESERVED_FDS)).unwrap_or(usize::MAX)
    });
    let max_connections = args
        .max_connections
        .unwrap_or(default.max_connections.min(fit));
    let config = Config {
        data_dir: args.data_dir,
        raft: RaftOptions {
            snapshot_every: args.snapshot_every,
            snapshot_chunk_bytes: args.snapshot_chunk_bytes,
            heartbeat: args.heartbeat,
            election_timeout: (args.election_timeout, args.election_timeout * 2),
            hash_check_every: args.hash_check_every,
        },
        limits: Limits {
            max_connections,
            header_timeout: args.header_timeout,
            idle_timeout: args.idle_timeout,
        },
        cluster,
        tls: tls.clone(),
        require_auth: args.require_auth,
        quotas: Quotas {
            max_leases: args.max_leases.map(size),
            max_locks: args.max_locks.map(size),
            max_waiters: args.max_waiters.map(size),
            per_token: TokenQuota {
                leases: args.max_leases_per_token.map(size),
                locks: args.max_locks_per_token.map(size),
                waiters: args.max_waiters_per_token.map(size),
                rate: args.rate_limit,
            },
            per_role: args.role_quota.iter().cloned().collect(),
        },
    };
    Ok((args.listen, (config, args.threads)))
}

/// A size limit from its flag (a u64 past `usize` is no limit at all).
fn size(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

async fn serve(lock: DirLock, listen: SocketAddr, config: Config) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("bind listener on {listen}"))?;
    if let Some(tls) = config.tls.clone() {
        tokio::spawn(reload_on_hangup(tls));
    }
    server::run_locked(lock, config, listener, shutdown_signal()).await
}

/// Reads the TLS files again on each SIGHUP (renewed certificates); open
/// connections and every lock stay.
async fn reload_on_hangup(tls: std::sync::Arc<Tls>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangups = match signal(SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP: TLS files are not reloaded");
                return;
            }
        };
        while hangups.recv().await.is_some() {
            match tls.reload() {
                Ok(()) => tracing::info!("TLS certificates reloaded"),
                Err(e) => tracing::error!(
                    error = format!("{e:#}"),
                    "TLS reload failed: the certificates loaded before stay in force"
                ),
            }
        }
    }
    #[cfg(not(unix))]
    let _ = tls;
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for SIGTERM");
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
