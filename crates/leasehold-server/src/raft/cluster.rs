//! Membership: what the group looks like, and changing it one node at a time.
//!
//! A new member joins as a learner, is caught up (log entries, or a snapshot
//! if the log it needs was purged), and only then becomes a voter, so adding
//! a node never stalls commits on a node that has nothing yet. A change is
//! refused if the voters it leaves could not form a quorum: each remaining
//! voter is asked directly, and fewer than a majority answering means the
//! group would stop.

use std::collections::{BTreeMap, BTreeSet};

use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ServerState};
use serde::Serialize;

use super::{Consensus, ConsensusError, NodeId};
use crate::service::ApiError;

/// One member as the node answering sees it.
#[derive(Debug, Clone, Serialize)]
pub struct MemberStatus {
    /// Its id.
    pub id: NodeId,
    /// Its address.
    pub addr: String,
    /// A voter, or a learner catching up.
    pub voter: bool,
    /// The last log index known to be replicated to it (the leader knows).
    pub matched_index: Option<u64>,
    /// How far it is behind the leader's last log index (the leader knows).
    pub lag: Option<u64>,
}

/// The group as the node answering sees it.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterStatus {
    /// The node answering.
    pub id: NodeId,
    /// `leader`, `follower`, `candidate` or `learner`.
    pub role: &'static str,
    /// The current term.
    pub term: u64,
    /// The leader's id, if known.
    pub leader: Option<NodeId>,
    /// The leader's address, if known.
    pub leader_addr: Option<String>,
    /// The last log index on this node.
    pub last_log_index: u64,
    /// The highest index known committed here: on the leader, the highest
    /// index a majority of voters holds; elsewhere, the last applied (the
    /// commit index is at least that).
    pub commit_index: u64,
    /// The last applied index on this node.
    pub last_applied: u64,
    /// The last log index in this node's snapshot.
    pub snapshot_index: u64,
    /// Every member, voters and learners.
    pub members: Vec<MemberStatus>,
}

fn role(state: ServerState) -> &'static str {
    match state {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    }
}

/// The highest index held by a majority of the voters, as far as the leader
/// knows.
fn quorum_index(members: &[MemberStatus]) -> Option<u64> {
    let mut held: Vec<u64> = members
        .iter()
        .filter(|m| m.voter)
        .map(|m| m.matched_index.unwrap_or(0))
        .collect();
    if held.is_empty() {
        return None;
    }
    held.sort_unstable_by(|a, b| b.cmp(a));
    held.get(held.len() / 2).copied()
}

impl Consensus {
    /// The group as this node sees it (a follower does not know the lag).
    pub fn cluster_status(&self) -> ClusterStatus {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let last = m.last_log_index.unwrap_or(0);
        let matched: BTreeMap<NodeId, Option<u64>> = m
            .replication
            .as_ref()
            .map(|r| r.iter().map(|(id, l)| (*id, l.map(|l| l.index))).collect())
            .unwrap_or_default();
        let members = membership
            .nodes()
            .map(|(id, node)| {
                let matched_index = if *id == m.id && m.state == ServerState::Leader {
                    Some(last)
                } else {
                    matched.get(id).copied().flatten()
                };
                MemberStatus {
                    id: *id,
                    addr: node.addr.clone(),
                    voter: voters.contains(id),
                    matched_index,
                    lag: matched_index.map(|i| last.saturating_sub(i)),
                }
            })
            .collect::<Vec<MemberStatus>>();
        let last_applied = m.last_applied.map_or(0, |l| l.index);
        let commit_index = if m.state == ServerState::Leader {
            quorum_index(&members).unwrap_or(last_applied)
        } else {
            last_applied
        };
        ClusterStatus {
            id: m.id,
            role: role(m.state),
            term: m.current_term,
            leader: m.current_leader,
            leader_addr: m
                .current_leader
                .and_then(|l| membership.get_node(&l).map(|n| n.addr.clone())),
            last_log_index: last,
            commit_index,
            last_applied,
            snapshot_index: m.snapshot.map_or(0, |l| l.index),
            members,
        }
    }

    /// Refuses unless this node leads and is a voter of the latest
    /// membership: a leader that has just removed itself still leads until
    /// that change commits, and must not start another one (openraft 0.9
    /// asserts against it in debug builds).
    fn leader_only(&self) -> Result<(), ApiError> {
        let (state, me) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            (m.state, m.id)
        };
        if state != ServerState::Leader || !self.voters().contains(&me) {
            return Err(self.not_leader().into());
        }
        Ok(())
    }

    /// Refuses a voter set in which fewer than a majority answer now.
    async fn check_quorum(&self, voters: &BTreeSet<NodeId>) -> Result<(), ApiError> {
        let status = self.cluster_status();
        let addr = |id: NodeId| {
            status
                .members
                .iter()
                .find(|m| m.id == id)
                .map(|m| m.addr.clone())
        };
        let mut up = 0;
        for &id in voters {
            let answers = id == self.id
                || match addr(id) {
                    Some(a) => self.probe(id, &a).await.is_some(),
                    None => false,
                };
            up += usize::from(answers);
        }
        if up * 2 <= voters.len() {
            return Err(ApiError::invalid(
                "members",
                format!(
                    "the change leaves voters {voters:?}, of which only {up} answer now: they could not form a quorum; bring members back first"
                ),
            ));
        }
        Ok(())
    }

    fn voters(&self) -> BTreeSet<NodeId> {
        self.raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect()
    }

    /// Adds node `id` at `addr`: as a learner, caught up, then as a voter.
    pub async fn add_member(&self, id: NodeId, addr: String) -> Result<ClusterStatus, ApiError> {
        self.leader_only()?;
        let mut voters = self.voters();
        if voters.contains(&id) {
            return Err(ApiError::invalid(
                "id",
                format!("node {id} is already a voter"),
            ));
        }
        if addr.parse::<std::net::SocketAddr>().is_err() && !addr.contains(':') {
            return Err(ApiError::invalid(
                "addr",
                format!("{addr:?} is not host:port"),
            ));
        }
        self.raft
            .add_learner(id, BasicNode { addr }, true)
            .await
            .map_err(|e| self.change_error(e))?;
        voters.insert(id);
        self.check_quorum(&voters).await?;
        self.raft
            .change_membership(voters, false)
            .await
            .map_err(|e| self.change_error(e))?;
        tracing::info!(id, "added a voter");
        // The leader restarts replication on a membership change; the status
        // answered shows the new voter's progress once it is known again.
        let mut metrics = self.raft.metrics();
        let known = metrics.wait_for(|m| {
            m.replication
                .as_ref()
                .is_some_and(|r| r.get(&id).is_some_and(Option::is_some))
        });
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), known).await;
        Ok(self.cluster_status())
    }

    /// Removes node `id` from the group.
    pub async fn remove_member(&self, id: NodeId) -> Result<ClusterStatus, ApiError> {
        self.leader_only()?;
        let mut voters = self.voters();
        let learner = self
            .cluster_status()
            .members
            .iter()
            .any(|m| m.id == id && !m.voter);
        if !voters.remove(&id) && !learner {
            return Err(ApiError::invalid(
                "id",
                format!("node {id} is not a member"),
            ));
        }
        if voters.is_empty() {
            return Err(ApiError::invalid("id", "the last voter cannot be removed"));
        }
        self.check_quorum(&voters).await?;
        let change = if learner {
            openraft::ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        } else {
            openraft::ChangeMembers::ReplaceAllVoters(voters)
        };
        self.raft
            .change_membership(change, false)
            .await
            .map_err(|e| self.change_error(e))?;
        tracing::info!(id, "removed a member");
        Ok(self.cluster_status())
    }

    fn change_error(&self, e: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>) -> ApiError {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
                ConsensusError::NotLeader {
                    leader: f.leader_node.map(|n| n.addr),
                }
                .into()
            }
            RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
                ApiError::invalid("members", e)
            }
            RaftError::Fatal(e) => ConsensusError::Unknown(e.to_string()).into(),
        }
    }
}
