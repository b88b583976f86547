//! The expiry driver: on the leader, proposes a tick whenever something in the
//! table is due (a lease expiry, a wait timeout, the end of a lock-delay).
//!
//! Expiry is decided only here, by the leader, through the log: followers and
//! restarted nodes never expire anything on their own clocks.

use std::time::Duration;

use leasehold_core::Command;

use crate::raft::Consensus;

/// Longest sleep between looks at the table, as a backstop.
const MAX_IDLE: Duration = Duration::from_millis(500);

/// Runs until `shutdown` resolves.
pub async fn run(consensus: Consensus, shutdown: impl std::future::Future<Output = ()>) {
    tokio::pin!(shutdown);
    loop {
        let wait = match consensus.now() {
            None => None,
            Some(now) => match consensus.read_local(|t| t.next_deadline()).await {
                Some(due) if due <= now => {
                    if let Err(e) = consensus.propose(Command::Tick).await {
                        tracing::debug!(error = %e, "tick not proposed");
                        Some(Duration::from_millis(10))
                    } else {
                        continue;
                    }
                }
                Some(due) => Some(Duration::from_millis(due - now).min(MAX_IDLE)),
                None => Some(MAX_IDLE),
            },
        };
        tokio::select! {
            _ = &mut shutdown => return,
            _ = consensus.hub().applied.notified() => {}
            _ = consensus.role_changed(), if wait.is_none() => {}
            _ = tokio::time::sleep(wait.unwrap_or(MAX_IDLE)) => {}
        }
    }
}
