//! `leaseholdd`: the Leasehold lock server.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use leasehold_server::raft::RaftOptions;
use leasehold_server::server::{self, Config};

/// The Leasehold lock server: leases with fencing tokens over gRPC and HTTP/JSON.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Address for gRPC and HTTP (one port serves both).
    #[arg(long, env = "LEASEHOLD_LISTEN", default_value = "127.0.0.1:7419")]
    listen: SocketAddr,
    /// Directory for the Raft log, vote and snapshots.
    #[arg(long, env = "LEASEHOLD_DATA_DIR", default_value = "./leasehold-data")]
    data_dir: PathBuf,
    /// Take a snapshot after this many applied commands (and purge the log before it).
    #[arg(long, default_value_t = 100_000)]
    snapshot_every: u64,
}

/// mimalloc: with a million small allocations (keys, tree nodes) glibc's
/// malloc kept ~270 bytes per held lock resident; see bench/results.md.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,openraft=warn".into()),
        )
        .init();
    let args = Args::parse();
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("bind listener on {}", args.listen))?;
    let config = Config {
        data_dir: args.data_dir,
        raft: RaftOptions {
            snapshot_every: args.snapshot_every,
        },
    };
    server::run(config, listener, shutdown_signal()).await
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
