//! The leader's clock, and following this node's role.
//!
//! Time enters the lock table only as the leader's stamp on each log entry
//! (DESIGN §1 "Time and expiry"). A node measures only durations, on its own
//! monotonic [`Clock`]; its stamps continue from the table time applied when
//! it became leader, so table time runs on across leader changes. Each
//! leadership stamps a higher epoch, and its first command gives every live
//! lease its full TTL again.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Command, Time};
use openraft::async_runtime::WatchReceiver;
use openraft::ServerState;

use super::{Consensus, NodeId};

/// A monotonic clock: time elapsed since a fixed origin. The system's in
/// production; a simulation injects its own.
pub trait Clock: Send + Sync + 'static {
    /// Time since this clock's origin; never goes back.
    fn elapsed(&self) -> Duration;
}

/// The runtime's monotonic clock: the system's, or the paused clock of a
/// test or simulation runtime (tokio's `Instant`). Create it inside the
/// runtime whose clock it should follow.
pub struct SystemClock {
    origin: tokio::time::Instant,
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock {
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Clock for SystemClock {
    fn elapsed(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// The leader's clock: table time when this node became leader, plus the
/// time elapsed on its own clock since.
#[derive(Clone, Copy)]
pub(super) struct LeaderClock {
    pub term: u64,
    pub epoch: u64,
    base: Time,
    started: Duration,
}

impl LeaderClock {
    pub fn now(&self, clock: &dyn Clock) -> Time {
        let elapsed = clock.elapsed().saturating_sub(self.started);
        self.base + elapsed.as_millis() as Time
    }
}

/// How often a node looks, within a lease, whether a quorum still answers
/// it: a leader cut off from every quorum stops serving about this
/// fraction of a lease late (plus the age of openraft's last report of
/// its quorum's answers).
const CHECKS_PER_LEASE: u32 = 8;

/// The epoch a new leadership stamps on its commands: above every epoch
/// applied so far, so its first command gives every lease its full TTL again.
///
/// The term is in the high bits, so a higher term always wins. A restarted
/// single node may lead again in the same term; the low bits count those
/// incarnations.
pub(super) fn leadership_epoch(term: u64, applied_epoch: u64) -> u64 {
    const INCARNATION_BITS: u32 = 24;
    if applied_epoch >> INCARNATION_BITS >= term {
        applied_epoch + 1
    } else {
        term << INCARNATION_BITS
    }
}

impl Consensus {
    /// Keeps the leader clock in step with this node's role: set it (from the
    /// applied table time) once this node leads with an up-to-date state
    /// machine, clear it the moment it stops leading, so that a deposed leader
    /// stamps and proposes nothing more.
    ///
    /// A leader that has heard from no quorum for `lease` (past its followers'
    /// lease on it, after which they may elect another) also stops serving: it
    /// may be cut off from the majority, and a request it takes would only hang.
    /// Clients are told `not_leader` and look elsewhere. If acks come back in
    /// the same term it serves again under the same epoch, so nothing is
    /// restamped.
    ///
    /// It wakes when the role, vote or membership changes (openraft's server
    /// metrics), and [`CHECKS_PER_LEASE`] times a lease to see whether a
    /// quorum still answers. openraft's full metrics change on every append
    /// and apply, and waking on each cost every node a poll per entry; it
    /// wakes on them only when they do not yet show the role the server
    /// metrics show, and while it leads without serving for want of a
    /// quorum, to serve again the moment one answers.
    pub(super) async fn follow_leadership(self, me: NodeId, lease: Duration) {
        let mut server = self.raft.server_metrics();
        let mut metrics = self.raft.metrics();
        let mut last_state = None;
        let mut last_leader = None;
        let mut quorum_acked = None::<Duration>;
        let mut serving = None::<(u64, u64)>; // (term, epoch) last armed
        let mut check = tokio::time::interval(lease / CHECKS_PER_LEASE);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // The server metrics first: openraft sends them just before the
            // full metrics, which may not show the same role yet (below).
            let (server_state, server_leader) = {
                let m = server.borrow_and_update();
                (m.state, m.current_leader)
            };
            let (state, term, leader, since_ack, alone) = {
                let m = metrics.borrow_and_update();
                let voters = m.membership_config.membership().voter_ids().count();
                (
                    m.state,
                    m.current_term,
                    m.current_leader,
                    // An age, which the node's own clock can use; its
                    // replacement is an instant of openraft's runtime.
                    #[allow(deprecated)]
                    m.millis_since_quorum_ack,
                    voters <= 1,
                )
            };
            let now = self.clock.elapsed();
            if let Some(ms) = since_ack {
                quorum_acked = Some(now.saturating_sub(Duration::from_millis(ms)));
            }
            if leader != last_leader {
                if leader.is_some() {
                    self.shared.context.metrics.leader_changed();
                }
                last_leader = leader;
            }
            if last_state != Some(state) {
                if last_state == Some(ServerState::Leader) && state != ServerState::Shutdown {
                    tracing::info!(
                        term,
                        ?leader,
                        ?state,
                        "stepped down: another node leads, or a higher term was seen"
                    );
                }
                last_state = Some(state);
            }
            let leads = state == ServerState::Leader && leader == Some(me);
            // No ack seen yet is no sign of isolation: it just won a vote.
            let fresh = alone || quorum_acked.is_none_or(|at| now.saturating_sub(at) < lease);
            let armed = self.leader_clock().map(|c| c.term);
            if !leads || !fresh {
                if leads && armed.is_some() {
                    tracing::warn!(
                        term,
                        ?lease,
                        "no quorum has answered for a lease: not serving until one does"
                    );
                }
                self.set_leader_clock(None);
            } else if armed != Some(term) {
                // Wait until everything committed before this term is applied,
                // so the clock starts from the latest table time.
                match self
                    .raft
                    .ensure_linearizable(openraft::ReadPolicy::ReadIndex)
                    .await
                {
                    Ok(_) => {
                        let (base, applied_epoch) = self
                            .shared
                            .read_async(|a| (a.table.now(), a.table.epoch()))
                            .await;
                        // Back after a lapse in the same term: the same epoch.
                        let epoch = match serving {
                            Some((t, e)) if t == term => e,
                            _ => leadership_epoch(term, applied_epoch),
                        };
                        tracing::info!(
                            term,
                            epoch,
                            table_time = base,
                            "leading; expiry driver armed"
                        );
                        serving = Some((term, epoch));
                        quorum_acked = Some(self.clock.elapsed());
                        self.set_leader_clock(Some(LeaderClock {
                            term,
                            epoch,
                            base,
                            started: self.clock.elapsed(),
                        }));
                        // The first command of a new epoch restamps every lease.
                        if let Err(e) = self.propose(Command::Tick).await {
                            tracing::debug!(error = %e, "first tick of a leadership");
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "not yet able to lead");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                }
            }
            let lapsed = leads && !fresh;
            let behind = (server_state, server_leader) != (state, leader);
            let stopped = tokio::select! {
                changed = server.changed() => changed.is_err(),
                changed = metrics.changed(), if lapsed || behind => changed.is_err(),
                _ = check.tick() => false,
            };
            if stopped {
                // The Raft core is gone: this node proposes nothing more.
                self.set_leader_clock(None);
                return;
            }
        }
    }

    pub(super) fn leader_clock(&self) -> Option<LeaderClock> {
        *self.leader.lock()
    }

    fn set_leader_clock(&self, clock: Option<LeaderClock>) {
        *self.leader.lock() = clock;
        let armed = clock.is_some();
        self.armed
            .send_if_modified(|was| std::mem::replace(was, armed) != armed);
    }

    /// The leader's current time, if this node leads.
    pub fn now(&self) -> Option<Time> {
        self.leader_clock().map(|c| c.now(self.clock.as_ref()))
    }
}

/// The clock handed to a node when none is injected.
pub fn system_clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock::default())
}

impl Consensus {
    /// Whether this node can serve calls now: it leads with its clock armed,
    /// or it follows a leader it heard from within `within` (openraft
    /// renews a follower's vote with every append and heartbeat, and goes
    /// on naming a leader that died until another is elected). A removed
    /// node serves nothing.
    pub async fn serving(&self, within: Duration) -> bool {
        if self.membership().removed() {
            return false;
        }
        if self.now().is_some() {
            return true;
        }
        let m = self.raft.metrics().borrow_watched().clone();
        if m.current_leader.is_none() || m.current_leader == Some(m.id) {
            return false;
        }
        self.raft
            .with_raft_state(move |st| {
                st.vote_last_modified()
                    .is_some_and(|at| openraft::Instant::elapsed(&at) <= within)
            })
            .await
            .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::leadership_epoch;

    #[test]
    fn every_leadership_gets_a_higher_epoch() {
        let first = leadership_epoch(1, 0);
        let restarted = leadership_epoch(1, first);
        let again = leadership_epoch(1, restarted);
        let new_term = leadership_epoch(2, again);
        assert!(0 < first && first < restarted && restarted < again && again < new_term);
        assert!(leadership_epoch(3, leadership_epoch(2, 5)) > leadership_epoch(2, 5));
    }
}
