//! Starting and stopping a server: used by `leaseholdd` and by tests.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::context::NodeContext;
use crate::net::{self, Gate, Limits};
use crate::raft::storage::dir_lock::DirLock;
use crate::raft::{Consensus, NodeId, NodeSpec, RaftOptions};
use crate::service::LockService;
use crate::tls::Tls;

/// How long in-flight requests get to finish after a shutdown signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Where a server keeps its data and how it runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Raft log, vote and snapshots.
    pub data_dir: PathBuf,
    /// Raft tuning.
    pub raft: RaftOptions,
    /// Client connection limits.
    pub limits: Limits,
    /// This node's id and the initial voters of its group; `None` for a
    /// single node (id 1, at the listener's address).
    pub cluster: Option<ClusterConfig>,
    /// TLS for clients and peers; `None` for plaintext.
    pub tls: Option<Arc<Tls>>,
    /// Serve only callers on this machine until auth is enabled.
    pub require_auth: bool,
    /// Limits on what callers create, and how fast.
    pub quotas: crate::admission::Quotas,
}

/// A node of a cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// This node's id.
    pub id: NodeId,
    /// The initial voters by id and address, this node among them.
    pub members: BTreeMap<NodeId, String>,
}

/// Serves the API on `listener` until `shutdown` resolves, then stops
/// cleanly. Refused with [`DirLockError::InUse`](crate::raft::storage::dir_lock::DirLockError::InUse)
/// if another process (or another server in this one) has the data dir.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let lock = DirLock::exclusive(&config.data_dir)?;
    run_locked(lock, config, listener, shutdown).await
}

/// [`run`] on a data dir this process has locked already (`leaseholdd`
/// locks it before it binds its port, so a second one takes no port at
/// all). The lock is let go once everything has stopped.
pub async fn run_locked(
    lock: DirLock,
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        lock.dir() == config.data_dir,
        "the lock held is on {}, not on the data dir {}",
        lock.dir().display(),
        config.data_dir.display()
    );
    let addr = listener.local_addr().context("read listener address")?;
    let spec = match &config.cluster {
        None => NodeSpec::single(&addr.to_string()),
        Some(c) => NodeSpec {
            id: c.id,
            addr: c
                .members
                .get(&c.id)
                .cloned()
                .unwrap_or_else(|| addr.to_string()),
            members: c.members.clone(),
            // Peers (and fault proxies in tests) tell nodes apart by it.
            source: Some(addr.ip()).filter(|ip| !ip.is_unspecified()),
        },
    };
    let context = Arc::new(NodeContext {
        admission: crate::admission::Admission::new(config.quotas),
        ..NodeContext::default()
    });
    let consensus = Consensus::start(
        &config.data_dir,
        spec,
        context.clone(),
        config.raft.clone(),
        config.tls.clone(),
    )
    .await
    .context("start consensus")?;
    // The state is loaded: what loading it freed goes back now, and from
    // here on requests reuse what they free (see `allocator`).
    crate::allocator::purge_when_settled();
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut stop_driver = stop_rx.clone();
    let driver = tokio::spawn(crate::expiry::run(consensus.clone(), async move {
        let _ = stop_driver.wait_for(|s| *s).await;
    }));

    let service = LockService::new(consensus.clone(), context).requiring_auth(config.require_auth);
    let peer_certificates = config
        .tls
        .as_ref()
        .is_some_and(|t| t.peers_need_certificates());
    let scheme = if config.tls.as_ref().is_some_and(|t| t.clients_need_tls()) {
        "https"
    } else {
        "http"
    };
    let app = crate::api::router(service.clone(), peer_certificates, scheme);
    let peers = if config.cluster.is_some()
        && config
            .tls
            .as_ref()
            .is_some_and(|t| t.peers_need_certificates())
    {
        " and peers"
    } else {
        ""
    };
    let tls = match &config.tls {
        None => "none".to_string(),
        Some(t) if !t.clients_need_tls() => "peers".to_string(),
        Some(t) if t.clients_need_certificates() => format!("clients (with certificates){peers}"),
        Some(_) => format!("clients{peers}"),
    };
    tracing::info!(%addr, data_dir = %config.data_dir.display(), tls, "serving gRPC, HTTP and frames");
    // Under systemd (Type=notify): the data dir is open, Raft runs and the
    // port is bound, so a call made now is answered. Nothing is sent
    // outside systemd.
    notify_systemd(sd_notify::NotifyState::Ready);
    let (signal_tx, signal_rx) = watch::channel(false);
    let signal_tx = Arc::new(signal_tx);
    let signal = signal_tx.clone();
    let handing_over = consensus.clone();
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutting down");
        notify_systemd(sd_notify::NotifyState::Stopping);
        handing_over.stand_down().await;
        let _ = signal.send(true);
    });

    let gate = Gate::new(config.limits.max_connections);
    let mut connections = JoinSet::new();
    let mut stopping = signal_rx.clone();
    // openraft stops a node's Raft on an internal error it cannot recover
    // from (0.9 could, in a race between a deposed leader's replication to a
    // returning member and its next snapshot for it). The process then
    // serves nothing useful: exit, so its supervisor restarts it, and it
    // rejoins from its data dir.
    let raft_stopped = consensus.stopped();
    tokio::pin!(raft_stopped);
    let mut failed = None;
    loop {
        tokio::select! {
            why = &mut raft_stopped => {
                tracing::error!(%why, "raft stopped: exiting so the node is restarted");
                failed = Some(why);
                let _ = signal_tx.send(true);
                break;
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    // At the cap the stream is dropped here: closed at once.
                    if let Some(admitted) = gate.admit(&service) {
                        connections.spawn(net::serve(
                            stream,
                            app.clone(),
                            service.clone(),
                            config.limits.clone(),
                            config.tls.clone(),
                            signal_rx.clone(),
                            admitted,
                        ));
                    }
                }
                Err(e) => {
                    // E.g. out of file descriptors: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = crate::shutdown::stopped(&mut stopping) => break,
        }
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    // Connections finish what they are doing; open ones (watch streams, idle
    // keep-alive clients) must not keep the process alive past the grace.
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        connections.shutdown().await;
    }
    let _ = stop_tx.send(true);
    let _ = driver.await;
    consensus.shutdown().await;
    drop(lock);
    match failed {
        Some(why) => anyhow::bail!("raft stopped: {why}"),
        None => Ok(()),
    }
}

/// Tells systemd of a change of state, if it started this process.
fn notify_systemd(state: sd_notify::NotifyState<'_>) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(e) = sd_notify::notify(&[state]) {
        tracing::warn!(error = %e, "cannot tell systemd of a change of state (NOTIFY_SOCKET)");
    }
}
