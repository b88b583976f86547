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
    let mut leading = consensus.leading();
    loop {
        leading.borrow_and_update();
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
        // What is applied moves the next deadline only on the leader; a
        // follower waits for leadership alone.
        tokio::select! {
            _ = &mut shutdown => return,
            _ = consensus.hub().applied.notified(), if wait.is_some() => {}
            changed = leading.changed() => if changed.is_err() {
                // Never: `consensus` holds the sender. Were it gone, waiting
                // on it again would spin.
                std::future::pending::<()>().await;
            },
            _ = tokio::time::sleep(wait.unwrap_or(MAX_IDLE)) => {}
        }
    }
}
