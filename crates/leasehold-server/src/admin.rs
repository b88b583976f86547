//! `leaseholdd`'s subcommands on a data dir: check, restore, and
//! force-new-cluster.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;

use leasehold_server::raft::operations::backup::{force_new_cluster, restore, Restored};
use leasehold_server::raft::storage::dir_lock::{DirLock, DirLockError};

use crate::parse_peers;

/// Work on a data dir instead of serving.
#[derive(clap::Subcommand, Debug)]
pub enum Admin {
    /// Verify a data dir offline, changing nothing: its format, vote,
    /// snapshot (checksums and table) and every log record, and that the
    /// log joins the snapshot. Exits 1 on a problem, naming the file and
    /// the byte. Run it on a stopped node's data dir, or on a copy: while a
    /// node runs on it, it is refused (exit 2).
    Check {
        /// The data dir.
        #[arg(long, env = "LEASEHOLD_DATA_DIR")]
        data_dir: PathBuf,
    },
    /// Build the data dir of one member of a new cluster from a backup
    /// (`leasehold snapshot save`); run it for every member, from the same
    /// file. Tokens and lease ids move up by at least 2^48, above any the
    /// old cluster handed out after the backup (see
    /// docs/operations.md, Backup and restore).
    Restore {
        /// The backup file.
        file: PathBuf,
        /// The new data dir (absent or empty).
        #[arg(long)]
        data_dir: PathBuf,
        /// This member's id in the new cluster.
        #[arg(long, default_value_t = 1)]
        node_id: u64,
        /// The new cluster's voters, `ID=HOST:PORT,...`, the same for every
        /// member. Without it: a single node, at --advertise.
        #[arg(long, value_parser = parse_peers, conflicts_with_all = ["listen", "advertise"])]
        peers: Option<BTreeMap<u64, String>>,
        /// A single node's address, as clients reach it (default: --listen).
        #[arg(long, value_name = "HOST:PORT")]
        advertise: Option<String>,
        /// The address the single node will listen on (leaseholdd's
        /// --listen; its default, 127.0.0.1:7419, if neither is given).
        #[arg(long, default_value = "127.0.0.1:7419")]
        listen: std::net::SocketAddr,
        /// The lowest token and lease id the new cluster may hand out, if
        /// higher than the rule above gives (above the highest token and
        /// lease id any client saw, say).
        #[arg(long, default_value_t = 0)]
        fence_floor: u64,
    },
    /// Disaster recovery, when a majority of the members is gone for good:
    /// build from a survivor's data dir a one-node cluster holding all it
    /// had (its log included, committed or not), then add members back with
    /// `leasehold cluster add`. Acknowledged writes that only the lost
    /// members had are lost; tokens move up as in a restore.
    ForceNewCluster {
        /// The survivor's data dir (stopped); read, not changed.
        #[arg(long)]
        data_dir: PathBuf,
        /// The new data dir (absent or empty) to start the node on.
        #[arg(long)]
        into: PathBuf,
        /// The node's id in the new cluster.
        #[arg(long, default_value_t = 1)]
        node_id: u64,
        /// The node's HOST:PORT, as members and clients reach it.
        #[arg(long)]
        advertise: String,
        /// The lowest token and lease id the new cluster may hand out, if
        /// higher.
        #[arg(long, default_value_t = 0)]
        fence_floor: u64,
    },
}

/// Runs an admin subcommand: its exit code.
pub fn run_admin(admin: Admin) -> std::process::ExitCode {
    match admin {
        Admin::Restore {
            file,
            data_dir,
            node_id,
            peers,
            advertise,
            listen,
            fence_floor,
        } => {
            let members = peers.unwrap_or_else(|| {
                BTreeMap::from([(node_id, advertise.unwrap_or_else(|| listen.to_string()))])
            });
            let what = format!("{} into {}", file.display(), data_dir.display());
            let done = block_on(restore(&file, &data_dir, node_id, &members, fence_floor));
            report("restore", &what, node_id, &members, done)
        }
        Admin::ForceNewCluster {
            data_dir,
            into,
            node_id,
            advertise,
            fence_floor,
        } => {
            let members = BTreeMap::from([(node_id, advertise.clone())]);
            let what = format!("{} into {}", data_dir.display(), into.display());
            let done = block_on(force_new_cluster(
                &data_dir,
                &into,
                node_id,
                &advertise,
                fence_floor,
            ));
            report("force-new-cluster", &what, node_id, &members, done)
        }
        Admin::Check { data_dir } => {
            // A log being written reads as damage: only a stopped node's.
            let _reading = match DirLock::shared(&data_dir) {
                Ok(lock) => lock,
                Err(DirLockError::InUse { pid, .. }) => {
                    let by = pid.map_or(String::new(), |p| format!(" (pid {p})"));
                    eprintln!(
                        "leaseholdd check: a node is running on {}{by}: check a stopped node's data dir, or a copy of it",
                        data_dir.display()
                    );
                    return std::process::ExitCode::from(crate::EXIT_CONFIG);
                }
                Err(e) => {
                    eprintln!("leaseholdd check: {e}");
                    return std::process::ExitCode::FAILURE;
                }
            };
            let report = leasehold_server::raft::storage::check::check_data_dir(&data_dir);
            println!("checking {}", data_dir.display());
            for line in &report.lines {
                println!("  {line}");
            }
            for problem in &report.problems {
                println!("  problem: {problem}");
            }
            if report.problems.is_empty() {
                println!("ok");
                std::process::ExitCode::SUCCESS
            } else {
                println!("{} problem(s) found", report.problems.len());
                std::process::ExitCode::FAILURE
            }
        }
    }
}

/// Runs `work` on a runtime of its own.
fn block_on<T>(work: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::new)?
        .block_on(work)
}

/// Prints what a restore or a forced new cluster did: its exit code.
fn report(
    command: &str,
    what: &str,
    node_id: u64,
    members: &BTreeMap<u64, String>,
    done: anyhow::Result<Restored>,
) -> std::process::ExitCode {
    match done {
        Ok(r) => {
            println!(
                "{command}: {what}, node {node_id} of {:?}: the log up to index {}; the next \
                 token is {}, the next lease id {}; cluster {:016x}",
                members.keys().collect::<Vec<_>>(),
                r.index,
                r.next_fence,
                r.next_lease,
                r.cluster
            );
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("leaseholdd {command}: {e:#}");
            // Refused as a second process on a data dir: as for a flag.
            match e.downcast_ref::<DirLockError>() {
                Some(DirLockError::InUse { .. }) => {
                    std::process::ExitCode::from(crate::EXIT_CONFIG)
                }
                _ => std::process::ExitCode::FAILURE,
            }
        }
    }
}
