//! Checks that every member's table is the same.
//!
//! Every member hashes its table (a CRC-32 of its encoding) when it applies
//! an entry whose index is a multiple of `--hash-check-every`: the same log
//! applied to the same table gives the same hash, so members that differ
//! at one index have diverged (a bug, or memory or a disk that changed what
//! it held). The leader asks each member for its latest mark every few
//! seconds and compares those at its own index; a mismatch raises an alarm
//! that stays until the node restarts: a log line at ERROR naming the
//! members, `/health` answering `"status": "degraded"` with the alarm, and
//! the metric `leasehold_table_hash_mismatch` at 1. The members that differ
//! from the leader are rebuilt as a damaged member is (operations.md).
//!
//! Hashing a table costs about what encoding a snapshot does. It is done
//! once the due entry is applied, before the next one: under the read lock
//! (reads go on) and off the runtime thread, as snapshots are. At the
//! default of every 100,000 entries that is a small share of the
//! snapshots' own cost.

use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::ServerState;

use crate::raft::state_machine::marks::Mark;
use crate::raft::transport::{decode, PeerCall};
use crate::raft::{Consensus, NodeId};

/// How often the leader compares marks.
const CHECK_EVERY: Duration = Duration::from_secs(5);

impl Consensus {
    /// The alarm raised when members' tables were found to differ.
    pub fn table_alarm(&self) -> Option<String> {
        self.shared.marks.alarm()
    }

    /// On the leader: asks each member for its mark and compares those at
    /// the leader's own index. Returns the members that differ.
    pub(in crate::raft) async fn compare_marks(&self) -> Vec<NodeId> {
        let Some(ours) = self.shared.marks.latest() else {
            return Vec::new();
        };
        if self.now().is_none() {
            return Vec::new();
        }
        let mut differ = Vec::new();
        for member in self.membership().status().members {
            if member.id == self.id {
                continue;
            }
            let call =
                self.transport
                    .call(member.id, &member.addr, PeerCall::TableMark, Vec::new());
            let Ok(Ok(reply)) = tokio::time::timeout(Duration::from_secs(1), call).await else {
                continue;
            };
            let Ok(Some(theirs)) = decode::<Option<Mark>>(&reply) else {
                continue;
            };
            if theirs.index == ours.index && theirs.hash != ours.hash {
                differ.push(member.id);
            }
        }
        if !differ.is_empty() {
            let alarm = format!(
                "the tables of members {differ:?} differ from the leader's (node {}) at log index \
                 {}: rebuild them from the leader (docs/operations.md, Checking a data dir)",
                self.id, ours.index
            );
            tracing::error!(members = ?differ, index = ours.index, "{alarm}");
            self.shared.marks.raise_alarm(alarm);
        }
        differ
    }

    /// Compares the members' marks every few seconds while this node leads,
    /// until it stops.
    pub(in crate::raft) fn check_tables_periodically(&self) {
        let consensus = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(CHECK_EVERY);
            loop {
                tick.tick().await;
                if !consensus.shared.marks.enabled() {
                    continue;
                }
                if consensus.raft.metrics().borrow_watched().state == ServerState::Shutdown {
                    return;
                }
                consensus.compare_marks().await;
            }
        });
    }
}
