//! The server's shutdown signal, as connections wait for it.

use tokio::sync::watch;

/// Resolves once the shutdown signal is up (at once if it already is).
pub(crate) async fn stopped(signal: &mut watch::Receiver<bool>) {
    let _ = signal.wait_for(|s| *s).await;
}
