//! `leasehold-chaos`: the simulation's checker over real processes.
//!
//! ```text
//! cargo build --release -p leasehold-server -p leasehold-sim
//! ./target/release/leasehold-chaos run --faulty-secs 600
//! ```
//!
//! Starts a 3-node cluster of real `leaseholdd` processes and client
//! processes doing fenced writes, injects `kill -9`, SIGSTOP/SIGCONT of nodes
//! and clients and partitions for `--faulty-secs`, heals, and checks the
//! history (see `leasehold_sim::chaos`). Exits 1 if the checker found a
//! violation.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use leasehold_sim::chaos::{self, ChaosConfig, ClientArgs};

#[derive(Parser)]
#[command(about = "A chaos run on real leaseholdd processes, checked")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs a cluster, clients and faults, and checks the history.
    Run {
        /// Seeds the faults and the clients' choices.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Seconds of faults.
        #[arg(long, default_value_t = 30)]
        faulty_secs: u64,
        /// Seconds the clients run on after the faults heal.
        #[arg(long, default_value_t = 10)]
        healthy_secs: u64,
        /// Client processes.
        #[arg(long, default_value_t = 5)]
        clients: usize,
        /// Keys they contend for.
        #[arg(long, default_value_t = 2)]
        keys: usize,
        /// Lease TTL in milliseconds.
        #[arg(long, default_value_t = 2000)]
        ttl_ms: u64,
        /// Print every event of the history.
        #[arg(long)]
        history: bool,
        /// Only freeze clients, no node faults.
        #[arg(long)]
        clients_only: bool,
        /// Plant a bug: clients write without checking their lease and
        /// believe they hold until they release.
        #[arg(long)]
        blind: bool,
    },
    /// One client process (started by `run`).
    #[command(hide = true)]
    Client {
        #[arg(long)]
        id: usize,
        #[arg(long)]
        endpoints: String,
        #[arg(long)]
        gate: PathBuf,
        #[arg(long)]
        keys: usize,
        #[arg(long)]
        ttl_ms: u64,
        #[arg(long)]
        until: u64,
        #[arg(long)]
        seed: u64,
        #[arg(long)]
        blind: bool,
    },
}

fn main() -> anyhow::Result<()> {
    match Args::parse().command {
        Command::Client {
            id,
            endpoints,
            gate,
            keys,
            ttl_ms,
            until,
            seed,
            blind,
        } => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(chaos::client(ClientArgs {
                id,
                endpoints,
                gate,
                keys: keys.max(1),
                ttl: Duration::from_millis(ttl_ms),
                until,
                seed,
                blind,
            })),
        Command::Run {
            seed,
            faulty_secs,
            healthy_secs,
            clients,
            keys,
            ttl_ms,
            history,
            clients_only,
            blind,
        } => {
            let config = ChaosConfig {
                seed,
                faulty: Duration::from_secs(faulty_secs),
                healthy: Duration::from_secs(healthy_secs),
                clients,
                keys: keys.max(1),
                ttl: Duration::from_millis(ttl_ms),
                clients_only,
                blind,
            };
            let started = Instant::now();
            let report = chaos::run(&config, &std::env::current_exe()?)?;
            if history {
                for r in &report.records {
                    println!("{r}");
                }
            }
            let faults: Vec<String> = report
                .faults
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            println!(
                "chaos run, seed {seed}: {faulty_secs} s of faults, {healthy_secs} s healed, {clients} clients on {keys} keys, TTL {ttl_ms} ms, {:.0} s in all",
                started.elapsed().as_secs_f64()
            );
            println!("faults: {}", faults.join(", "));
            println!(
                "calls answered {}, grants {}, reads {}, writes admitted {} and refused {}",
                report.answers, report.grants, report.reads, report.writes.0, report.writes.1
            );
            println!(
                "longest stretch without a successful call: {} ms",
                report.verdict.longest_unavailable / 1000
            );
            if report.verdict.violations.is_empty() {
                println!("violations: none");
                Ok(())
            } else {
                println!("violations: {}", report.verdict.violations.len());
                if let Some(dir) = &report.kept {
                    println!("history and logs kept in {}", dir.display());
                }
                for v in &report.verdict.violations {
                    println!("  {v}");
                }
                std::process::exit(1)
            }
        }
    }
}
