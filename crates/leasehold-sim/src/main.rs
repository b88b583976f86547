//! `leasehold-sim`: runs seeds and prints what the checker found.
//!
//! ```text
//! cargo run -p leasehold-sim --release -- --seeds 10000
//! cargo run -p leasehold-sim --release -- --seed 42 --history
//! cargo run -p leasehold-sim --release -- --seeds 200 --bug blind-release
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clap::Parser;
use leasehold_sim::{run, Bug, Config};

#[derive(Parser)]
#[command(about = "Deterministic simulation of leaseholdd clusters under faults")]
struct Args {
    /// Run this one seed.
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// Run this many seeds, from --first.
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// The first seed of a sweep.
    #[arg(long, default_value_t = 0)]
    first: u64,
    /// Voters: 3 or 5.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Client hosts.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Seconds of faults before everything heals.
    #[arg(long, default_value_t = 12)]
    faulty_secs: u64,
    /// Plant a bug: ack-before-fsync, blind-release, deadline-from-reply,
    /// stale-read, lost-checkpoint, lifo-queue, no-lock-delay,
    /// forget-renewals.
    #[arg(long)]
    bug: Option<Bug>,
    /// Print the whole history of a single seed.
    #[arg(long)]
    history: bool,
}

fn main() {
    let args = Args::parse();
    // The nodes' own logs, for looking into a seed: RUST_LOG=leasehold=debug.
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_default_env() {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    }
    let config = |seed| Config {
        seed,
        nodes: args.nodes,
        clients: args.clients,
        faulty: Duration::from_secs(args.faulty_secs),
        bug: args.bug,
    };
    let seeds: Vec<u64> = match args.seed {
        Some(seed) => vec![seed],
        None => (args.first..args.first + args.seeds).collect(),
    };
    let started = Instant::now();
    let (mut ops, mut failed, mut longest, mut lost) = (0u64, Vec::new(), (0u64, 0u64), 0u64);
    let mut exits = Vec::new();
    let (mut queue_grants, mut delays, mut gaps) = (0u64, 0u64, 0u64);
    let (mut histories, mut linearized_ops, mut expiries) = (0u64, 0u64, 0u64);
    let mut faults: BTreeMap<&'static str, u64> = BTreeMap::new();
    for (i, &seed) in seeds.iter().enumerate() {
        if i > 0 && i % 1000 == 0 {
            eprintln!(
                "{i} seeds, {} failing, {:.0} s",
                failed.len(),
                started.elapsed().as_secs_f64()
            );
        }
        let report = run(&config(seed));
        if args.history {
            for r in &report.history {
                println!("{r}");
            }
        }
        ops += report.operations;
        queue_grants += report.applied.queue_grants;
        delays += report.applied.delays;
        gaps += u64::from(report.applied.gap_at.is_some());
        lost += report.lost_writes;
        if let Some(checked) = &report.linearized {
            histories += checked.keys;
            linearized_ops += checked.operations;
            expiries += checked.expiries;
        }
        if report.exits > 0 {
            exits.push(seed);
        }
        for (kind, n) in &report.faults {
            *faults.entry(kind).or_default() += n;
        }
        if report.verdict.longest_unavailable > longest.0 {
            longest = (report.verdict.longest_unavailable, seed);
        }
        if !report.passed() {
            println!(
                "seed {seed}: {} violation(s)",
                report.verdict.violations.len()
            );
            for v in report.verdict.violations.iter().take(5) {
                println!("  {v}");
            }
            println!("  replay: {}", report.config.replay_command());
            failed.push(seed);
        }
    }
    println!(
        "seeds {}  operations {ops}  violations in {} seed(s)  longest unavailability {} ms (seed {})  in {:.1} s",
        seeds.len(),
        failed.len(),
        longest.0 / 1000,
        longest.1,
        started.elapsed().as_secs_f64()
    );
    let kinds: Vec<String> = faults.iter().map(|(k, n)| format!("{k} {n}")).collect();
    println!("faults injected: {}", kinds.join(", "));
    println!("unsynced log writes dropped or torn by crashes: {lost}");
    println!(
        "followed for FIFO and lock-delay: {queue_grants} grants from queues, {delays} lock-delays; runs cut short by an index no node applied: {gaps}"
    );
    println!(
        "checked for linearizability: {histories} lock histories of {linearized_ops} operations; lease expiries held to the TTL after their last acknowledged renewal: {expiries}"
    );
    println!(
        "seeds in which a node's raft stopped and the node was restarted: {} {:?}",
        exits.len(),
        &exits[..exits.len().min(20)]
    );
    if !failed.is_empty() {
        println!("failing seeds: {failed:?}");
        std::process::exit(1);
    }
}
