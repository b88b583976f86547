//! One file per group of subcommands.

pub mod bench;
pub mod check;
mod cluster;
mod demo;
mod hold;
mod run;
mod status;

use anyhow::Context;
use leasehold::Client;

use crate::{Cli, ClusterAction, Command, Demo};

/// Runs a subcommand; returns the process exit code.
pub async fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    let tls = cli.tls();
    let target = cluster::Target {
        url: cli.endpoint.clone(),
        tls: tls.clone(),
    };
    let mut builder = Client::builder(&cli.endpoint).tls(tls.clone());
    if let Some(h) = &cli.holder {
        builder = builder.holder(h);
    }
    let client = || async {
        builder
            .clone()
            .connect()
            .await
            .with_context(|| format!("connect to {}", cli.endpoint))
    };
    match cli.command {
        Command::Run {
            key,
            ttl,
            wait,
            grace,
            lock_delay,
            command,
        } => {
            run::run(
                &client().await?,
                &key,
                run::Options {
                    ttl,
                    wait,
                    grace,
                    lock_delay,
                    forever: false,
                },
                &command,
            )
            .await
        }
        Command::Elect {
            name,
            value,
            ttl,
            grace,
            command,
        } => {
            let client = Client::builder(&cli.endpoint)
                .tls(tls.clone())
                .holder(value)
                .connect()
                .await
                .with_context(|| format!("connect to {}", cli.endpoint))?;
            let options = run::Options {
                ttl,
                wait: None,
                grace,
                lock_delay: std::time::Duration::ZERO,
                forever: true,
            };
            run::run(&client, &name, options, &command).await
        }
        Command::Acquire {
            key,
            ttl,
            wait,
            json,
        } => hold::acquire(&client().await?, &key, ttl, wait, json).await,
        Command::Release { key, fence } => hold::release(&client().await?, &key, fence).await,
        Command::Status { prefix, json } => status::status(&client().await?, &prefix, json).await,
        Command::Bench {
            workload,
            clients,
            duration,
            keys,
            ttl,
            server_pid,
            json,
        } => {
            let endpoint = cli.endpoint.clone();
            bench::bench(bench::Args {
                endpoint,
                tls: tls.clone(),
                workload,
                clients,
                duration,
                keys,
                ttl,
                server_pid,
                json,
            })
            .await
        }
        Command::Demo {
            demo: Demo::Fencing,
        } => demo::fencing().await,
        Command::DemoWorker {
            key,
            account,
            deposit,
        } => demo::worker(&client().await?, &key, &account, deposit).await,
        Command::Watch { prefix, json } => status::watch(&client().await?, &prefix, json).await,
        Command::Cluster { action } => match action {
            ClusterAction::Status { json } => cluster::status(&target, json).await,
            ClusterAction::Add { id, addr } => cluster::add(&target, id, &addr).await,
            ClusterAction::Remove { id } => cluster::remove(&target, id).await,
        },
        // Reads the state file only; connects to nothing.
        Command::Check { state } => check::check(state),
    }
}
