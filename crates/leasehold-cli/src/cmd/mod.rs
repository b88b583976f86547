//! One file per group of subcommands.

mod auth;
pub mod bench;
pub mod check;
mod cluster;
mod demo;
mod hold;
mod run;
mod snapshot;
mod status;

use anyhow::Context;
use leasehold::Client;

use crate::{
    AuthAction, Cli, ClusterAction, Command, Demo, RoleAction, SnapshotAction, TokenAction,
};

/// A duration for people: `850ms`, `4.2s`, `9m58s`, `2h05m`.
pub fn human_ms(ms: u64) -> String {
    let s = ms / 1000;
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..=3_599_999 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// Runs a subcommand; returns the process exit code.
pub async fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    let tls = cli.tls();
    let target = cluster::Target {
        url: cli.endpoint.clone(),
        tls: tls.clone(),
        token: cli.token.clone(),
    };
    let mut builder = Client::builder(&cli.endpoint).tls(tls.clone());
    if let Some(t) = &cli.token {
        builder = builder.token(t);
    }
    if let Some(h) = &cli.holder {
        builder = builder.holder(h);
    }
    let connect = |builder: leasehold::ClientBuilder| async {
        builder
            .connect()
            .await
            .with_context(|| format!("connect to {}", cli.endpoint))
    };
    let client = || connect(builder.clone());
    match cli.command {
        Command::Run {
            key,
            ttl,
            wait,
            grace,
            lock_delay,
            permits,
            shared,
            command,
        } => {
            let mode = match (permits, shared) {
                (Some(permits), _) => leasehold::Mode::Permit { permits },
                (None, true) => leasehold::Mode::Shared,
                (None, false) => leasehold::Mode::Exclusive,
            };
            let options = run::Options {
                ttl,
                wait,
                grace,
                lock_delay,
                mode,
                proclaim: None,
                forever: false,
            };
            using(client().await, async |c| {
                run::run(c, &key, options, &command).await
            })
            .await
        }
        Command::Elect {
            name,
            value,
            ttl,
            grace,
            command,
        } => {
            let options = run::Options {
                ttl,
                wait: None,
                grace,
                lock_delay: std::time::Duration::ZERO,
                mode: leasehold::Mode::Exclusive,
                proclaim: Some(value.clone()),
                forever: true,
            };
            let client = connect(builder.clone().holder(value)).await;
            using(client, async |c| {
                run::run(c, &name, options, &command).await
            })
            .await
        }
        Command::Acquire {
            key,
            ttl,
            wait,
            json,
        } => {
            using(client().await, async |c| {
                hold::acquire(c, &key, ttl, wait, json).await
            })
            .await
        }
        Command::Release { key, fence } => {
            using(client().await, async |c| {
                hold::release(c, &key, fence).await
            })
            .await
        }
        Command::Status { prefix, json, all } => {
            using(client().await, async |c| {
                status::status(c, &prefix, json, all).await
            })
            .await
        }
        Command::Leader { name, watch, json } => {
            using(client().await, async |c| {
                status::leader(c, &name, watch, json).await
            })
            .await
        }
        Command::Bench {
            workload,
            clients,
            duration,
            keys,
            ttl,
            server_pid,
            stop_renewing,
            json,
        } => {
            let endpoint = cli.endpoint.clone();
            bench::bench(bench::Args {
                endpoint,
                tls: tls.clone(),
                token: cli.token.clone(),
                workload,
                clients,
                duration,
                keys,
                ttl,
                server_pid,
                stop_renewing,
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
        } => {
            using(client().await, async |c| {
                demo::worker(c, &key, &account, deposit).await
            })
            .await
        }
        Command::Watch {
            prefix,
            json,
            after,
        } => {
            using(client().await, async |c| {
                status::watch(c, &prefix, json, after).await
            })
            .await
        }
        Command::Cluster { action } => match action {
            ClusterAction::Status { json } => cluster::status(&target, json).await,
            ClusterAction::Add { id, addr } => cluster::add(&target, id, &addr).await,
            ClusterAction::Remove { id } => cluster::remove(&target, id).await,
            ClusterAction::TransferLeader { id } => cluster::transfer_leader(&target, id).await,
        },
        Command::Snapshot { action } => match action {
            SnapshotAction::Save { file } => snapshot::save(&target, &file).await,
            SnapshotAction::Status { file, json } => snapshot::status(&file, json),
        },
        Command::Auth { action } => match action {
            AuthAction::Enable => auth::enable(&target).await,
            AuthAction::Disable => auth::disable(&target).await,
            AuthAction::Status { json } => auth::status(&target, json).await,
            AuthAction::Audit { json } => auth::audit(&target, json).await,
            AuthAction::Role {
                action:
                    RoleAction::Set {
                        name,
                        read,
                        lock,
                        admin,
                        deny,
                    },
            } => auth::set_role(&target, &name, [deny, read, lock, admin]).await,
            AuthAction::Role {
                action: RoleAction::Delete { name },
            } => auth::delete_role(&target, &name).await,
            AuthAction::Token {
                action: TokenAction::Create { role, name, json },
            } => auth::create_token(&target, &role, name.as_deref(), json).await,
            AuthAction::Token {
                action: TokenAction::Revoke { id },
            } => auth::revoke_token(&target, id).await,
        },
        // Reads the state file only; connects to nothing.
        Command::Check { state } => check::check(state),
    }
}

/// Runs `command` with `client`, then ends the client's session leases
/// whatever the command returned: an exit 75, an error or a signal leaves
/// no lease behind to live out its TTL.
async fn using(
    client: anyhow::Result<Client>,
    command: impl AsyncFnOnce(&Client) -> anyhow::Result<i32>,
) -> anyhow::Result<i32> {
    let client = client?;
    let result = command(&client).await;
    client.close().await;
    result
}

/// The exit code of a command stopped by signal `sig`, as a shell
/// reports it (130 for SIGINT, 143 for SIGTERM).
pub fn exit_by_signal(sig: i32) -> i32 {
    128 + sig
}

#[cfg(test)]
mod tests {
    use super::human_ms;

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(human_ms(850), "850ms");
        assert_eq!(human_ms(4_240), "4.2s");
        assert_eq!(human_ms(597_800), "9m57s");
        assert_eq!(human_ms(60_000), "1m00s");
        assert_eq!(human_ms(7_500_000), "2h05m");
    }
}
