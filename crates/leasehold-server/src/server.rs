//! Starting and stopping a server: used by `leaseholdd` and by tests.

use std::future::Future;
use std::path::PathBuf;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::hub::Hub;
use crate::raft::{Consensus, RaftOptions};
use crate::service::LockService;

/// How long in-flight requests get to finish after a shutdown signal.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Where a server keeps its data and how it runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Raft log, vote and snapshots.
    pub data_dir: PathBuf,
    /// Raft tuning.
    pub raft: RaftOptions,
}

/// Serves the API on `listener` until `shutdown` resolves, then stops cleanly.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let addr = listener.local_addr().context("read listener address")?;
    let consensus = Consensus::start(
        &config.data_dir,
        &addr.to_string(),
        std::sync::Arc::new(Hub::default()),
        config.raft,
    )
    .await
    .context("start consensus")?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut stop_driver = stop_rx.clone();
    let driver = tokio::spawn(crate::expiry::run(consensus.clone(), async move {
        let _ = stop_driver.wait_for(|s| *s).await;
    }));

    let app = crate::api::router(LockService::new(consensus.clone()));
    tracing::info!(%addr, data_dir = %config.data_dir.display(), "serving gRPC and HTTP");
    let (signal_tx, mut signal_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutting down");
        let _ = signal_tx.send(true);
    });
    let mut graceful = signal_rx.clone();
    // Small request/response frames: without TCP_NODELAY, Nagle's algorithm can
    // hold a response back until the client's delayed ACK.
    let serve = axum::serve(listener, app)
        .tcp_nodelay(true)
        .with_graceful_shutdown(async move {
            let _ = graceful.wait_for(|s| *s).await;
        });
    // Open connections (watch streams, idle keep-alive clients) must not keep
    // the process alive: after a grace period, stop serving regardless.
    let result = tokio::select! {
        r = serve => r.context("serve"),
        _ = async {
            let _ = signal_rx.wait_for(|s| *s).await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => Ok(()),
    };
    let _ = stop_tx.send(true);
    let _ = driver.await;
    consensus.shutdown().await;
    result
}
