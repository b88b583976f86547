//! Membership: what the group looks like, and changing it one node at a time.
//!
//! A new member joins as a learner, is caught up (log entries, or a snapshot
//! if the log it needs was purged), and only then becomes a voter, so adding
//! a node never stalls commits on a node that has nothing yet. A learner
//! that does not answer within [`ANSWER_WITHIN`], or answers and does not
//! come within [`CAUGHT_UP_LAG`] entries of the leader within
//! [`CATCH_UP_WITHIN`], is removed again and the add fails: a voter that
//! is not there (a typo in its address, a node not started, one cut off)
//! would take a vote from the quorum and the group's fault tolerance with it.
//! A change is refused if the voters it leaves could not form a quorum: each
//! remaining voter is asked directly, and fewer than a majority answering
//! means the group would stop.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::errors::{ClientWriteError, RaftError};
use openraft::{BasicNode, ServerState};
use serde::Serialize;

use crate::raft::{Consensus, ConsensusError, NodeId, NodeSpec, TypeConfig};

/// How long a node being added has to answer the leader.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(10);
/// How long a node that answered has to catch up: a snapshot of a million
/// held locks crosses loopback in a few seconds.
pub const CATCH_UP_WITHIN: Duration = Duration::from_secs(60);
/// A learner at most this many entries behind the leader's last one is
/// caught up: one append's worth (openraft's `max_payload_entries`).
pub const CAUGHT_UP_LAG: u64 = 64;

/// Why a membership change was refused.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    /// This node cannot make it now (not the leader, stopped, or the
    /// outcome is unknown).
    #[error(transparent)]
    Consensus(#[from] ConsensusError),
    /// The change is not allowed: which part of it, and why.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The part: `id`, `addr` or `members`.
        field: &'static str,
        /// Why, and what to do instead.
        reason: String,
    },
    /// A node to add did not answer or catch up; it is not a member.
    #[error("{0}")]
    NotAdded(String),
}

/// How long a leadership transfer may take before it is reported as not
/// done.
const TRANSFER_WITHIN: Duration = Duration::from_secs(3);

impl MembershipError {
    fn invalid(field: &'static str, reason: impl std::fmt::Display) -> MembershipError {
        MembershipError::Invalid {
            field,
            reason: reason.to_string(),
        }
    }
}

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
    /// Milliseconds since it last answered the leader (the leader knows;
    /// `None` there if it never has).
    pub last_heard_ms: Option<u64>,
    /// Whether the leader heard from it lately (the leader knows).
    pub reachable: Option<bool>,
}

/// The group as the node answering sees it.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterStatus {
    /// The node answering.
    pub id: NodeId,
    /// `leader`, `follower`, `candidate`, `learner`, or `removed` (it learned
    /// it is no longer a member).
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
    /// Whether a majority of the voters is reachable (the leader knows).
    pub quorum: Option<bool>,
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

/// A node of a cluster started at another address than its group
/// records for it.
#[derive(Debug, thiserror::Error)]
#[error(
    "the data dir records node {id} at {recorded}, but it was started as {started}: start it with --peers naming it {recorded}, or give it a data dir of its own"
)]
pub struct AddressMismatch {
    /// The node.
    pub id: NodeId,
    /// Where the group has it.
    pub recorded: String,
    /// Where it was started.
    pub started: String,
}

/// The membership of the group, as an operator reads and changes it:
/// status, add, remove, and hand leadership over
/// ([`Consensus::membership`]). Changes are made on the leader only.
#[derive(Clone, Copy)]
pub struct Membership<'a> {
    consensus: &'a Consensus,
}

impl Consensus {
    /// The group's membership: its status, and the changes an operator
    /// makes to it.
    pub fn membership(&self) -> Membership<'_> {
        Membership { consensus: self }
    }

    /// Checks the address the group records for this node against the one
    /// it was started with. A node of a cluster recorded elsewhere is
    /// refused: peers and clients would be sent to an address it does not
    /// answer on. A single node (a group of itself) moved to another
    /// address records the new one once it leads: nobody else reaches it
    /// by the old one.
    pub(in crate::raft) fn check_own_address(&self, spec: &NodeSpec) -> anyhow::Result<()> {
        let m = self.raft.metrics().borrow_watched().clone();
        let membership = m.membership_config.membership();
        let Some(recorded) = membership.get_node(&spec.id).map(|n| n.addr.clone()) else {
            return Ok(());
        };
        if recorded == spec.addr {
            return Ok(());
        }
        let alone = spec.members.len() == 1
            && membership.voter_ids().eq(std::iter::once(spec.id))
            && membership.nodes().count() == 1;
        if !alone {
            return Err(AddressMismatch {
                id: spec.id,
                recorded,
                started: spec.addr.clone(),
            }
            .into());
        }
        tracing::info!(
            id = spec.id,
            from = recorded,
            to = spec.addr,
            "this single node moved: recording its new address once it leads"
        );
        let consensus = self.clone();
        let (id, addr) = (spec.id, spec.addr.clone());
        tokio::spawn(async move {
            let mut leading = consensus.leading();
            if leading.wait_for(|l| *l).await.is_err() {
                return;
            }
            let nodes = BTreeMap::from([(id, BasicNode { addr })]);
            if let Err(e) = consensus
                .raft
                .change_membership(openraft::ChangeMembers::SetNodes(nodes), false)
                .await
            {
                tracing::warn!(error = %e, "could not record this node's new address");
            }
        });
        Ok(())
    }

    pub(in crate::raft) fn voters(&self) -> BTreeSet<NodeId> {
        self.raft
            .metrics()
            .borrow_watched()
            .membership_config
            .membership()
            .voter_ids()
            .collect()
    }

    /// Watches for this node's own removal, which openraft never tells it:
    /// the leader stops replicating to a removed member as soon as it
    /// appends the change, so the member keeps the membership that still
    /// names it and hears from no leader (openraft 0.10 still names the
    /// last leader it knew, and with pre-vote it raises no term). While its
    /// log stands still and it does not lead, it asks the other members for
    /// their membership (after two seconds, then every five); one that
    /// has committed a newer membership without this node proves it was
    /// removed (a committed membership never rolls back). It then stops
    /// campaigning, logs it once and says so in `/health`. A leader that
    /// adds it back replicates a newer membership naming it, which ends it.
    pub(in crate::raft) async fn notice_removal(self) {
        use std::sync::atomic::Ordering;
        // Evidence of the removal: the index of the membership that left it out.
        let mut removed_at: Option<u64> = None;
        let mut still = 0u32;
        let mut last_applied = None;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let m = self.raft.metrics().borrow_watched().clone();
            if m.running_state.is_err() || m.state == ServerState::Shutdown {
                return;
            }
            let own = m.membership_config.log_id().as_ref().map(|l| l.index);
            let named = m
                .membership_config
                .membership()
                .get_node(&self.id)
                .is_some();
            if let Some(at) = removed_at {
                if named && own > Some(at) {
                    removed_at = None;
                    self.removed.store(false, Ordering::SeqCst);
                    self.allow_campaigns();
                    tracing::info!(id = self.id, "this node is a member again");
                }
                continue;
            }
            // Only a member can be removed: a node waiting to be added
            // (its log empty) is named by no membership yet.
            let applied = m.last_applied.as_ref().map(|l| l.index);
            let moved = std::mem::replace(&mut last_applied, applied) != applied;
            still = if named && !moved && m.state != ServerState::Leader {
                still + 1
            } else {
                0
            };
            if still < 2 || (still > 2 && !still.is_multiple_of(5)) {
                continue;
            }
            let peers: Vec<(NodeId, String)> = m
                .membership_config
                .membership()
                .nodes()
                .filter(|(id, _)| **id != self.id)
                .map(|(id, n)| (*id, n.addr.clone()))
                .collect();
            for (peer, addr) in peers {
                let Some(theirs) = self.membership_of(peer, &addr).await else {
                    continue;
                };
                if theirs.committed && theirs.index > own && !theirs.members.contains(&self.id) {
                    let at = theirs.index.unwrap_or(0);
                    removed_at = Some(at);
                    self.removed.store(true, Ordering::SeqCst);
                    self.raft.runtime_config().elect(false);
                    tracing::warn!(
                        id = self.id,
                        peer,
                        members = ?theirs.members,
                        index = at,
                        "this node was removed from the cluster (node {peer} committed a membership without it): it no longer campaigns; stop it and delete its data dir, or add it back with `leasehold cluster add`"
                    );
                    break;
                }
            }
        }
    }
}

impl Membership<'_> {
    /// The group as this node sees it (a follower does not know the lag).
    pub fn status(self) -> ClusterStatus {
        let m = self.consensus.raft.metrics().borrow_watched().clone();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let last = m.last_log_index.unwrap_or(0);
        let matched: BTreeMap<NodeId, Option<u64>> = m
            .replication
            .as_ref()
            .map(|r| r.iter().map(|(id, l)| (*id, l.map(|l| l.index))).collect())
            .unwrap_or_default();
        let leads = m.state == ServerState::Leader;
        let members = membership
            .nodes()
            .map(|(id, node)| {
                let me = *id == m.id;
                let matched_index = if me && leads {
                    Some(last)
                } else {
                    matched.get(id).copied().flatten()
                };
                let heard = (leads && !me)
                    .then(|| self.consensus.heard.since(*id))
                    .flatten();
                MemberStatus {
                    id: *id,
                    addr: node.addr.clone(),
                    voter: voters.contains(id),
                    matched_index,
                    lag: matched_index.map(|i| last.saturating_sub(i)),
                    last_heard_ms: heard.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                    reachable: leads
                        .then_some(me || heard.is_some_and(|d| d <= self.consensus.heard.within)),
                }
            })
            .collect::<Vec<MemberStatus>>();
        let quorum = leads.then(|| {
            let up = members
                .iter()
                .filter(|m| m.voter && m.reachable == Some(true))
                .count();
            up * 2 > voters.len()
        });
        let last_applied = m.last_applied.map_or(0, |l| l.index);
        let commit_index = if m.state == ServerState::Leader {
            quorum_index(&members).unwrap_or(last_applied)
        } else {
            last_applied
        };
        ClusterStatus {
            id: m.id,
            // openraft never tells a removed member; it still calls itself
            // a follower.
            role: if self.removed() {
                "removed"
            } else {
                role(m.state)
            },
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
            quorum,
        }
    }

    /// Refuses unless this node leads and is a voter of the latest
    /// membership: a leader that has just removed itself still leads until
    /// that change commits, and must not start another one (openraft
    /// asserts against it in debug builds).
    fn leader_only(self) -> Result<(), MembershipError> {
        let (state, me) = {
            let m = self.consensus.raft.metrics();
            let m = m.borrow_watched();
            (m.state, m.id)
        };
        if state != ServerState::Leader || !self.consensus.voters().contains(&me) {
            return Err(self.consensus.not_leader().into());
        }
        Ok(())
    }

    /// Refuses a voter set in which fewer than a majority answer now.
    async fn check_quorum(self, voters: &BTreeSet<NodeId>) -> Result<(), MembershipError> {
        let status = self.status();
        let addr = |id: NodeId| {
            status
                .members
                .iter()
                .find(|m| m.id == id)
                .map(|m| m.addr.clone())
        };
        let mut up = 0;
        for &id in voters {
            let answers = id == self.consensus.id
                || match addr(id) {
                    Some(a) => self.consensus.probe(id, &a).await.is_some(),
                    None => false,
                };
            up += usize::from(answers);
        }
        if up * 2 <= voters.len() {
            return Err(MembershipError::invalid(
                "members",
                format!(
                    "the change leaves voters {voters:?}, of which only {up} answer now: they could not form a quorum; bring members back first"
                ),
            ));
        }
        Ok(())
    }

    /// Adds node `id` at `addr`: as a learner, caught up, then as a voter.
    /// A learner that does not answer or catch up in time is removed again,
    /// and the voters stay as they were.
    pub async fn add(self, id: NodeId, addr: String) -> Result<ClusterStatus, MembershipError> {
        self.leader_only()?;
        let mut voters = self.consensus.voters();
        if voters.contains(&id) {
            return Err(MembershipError::invalid(
                "id",
                format!("node {id} is already a voter"),
            ));
        }
        if id == 0 {
            return Err(MembershipError::invalid("id", "node ids start at 1"));
        }
        if addr.parse::<std::net::SocketAddr>().is_err() && !addr.contains(':') {
            return Err(MembershipError::invalid(
                "addr",
                format!("{addr:?} is not host:port"),
            ));
        }
        // One address, one node: a node listed twice would call itself.
        let m = self.consensus.raft.metrics().borrow_watched().clone();
        let taken = m
            .membership_config
            .membership()
            .nodes()
            .find(|(other, node)| **other != id && node.addr == addr)
            .map(|(other, _)| *other);
        if let Some(other) = taken {
            return Err(MembershipError::invalid(
                "addr",
                format!("{addr} is node {other}'s address: each node needs its own"),
            ));
        }
        self.consensus
            .raft
            .add_learner(id, BasicNode { addr: addr.clone() }, false)
            .await
            .map_err(|e| self.change_error(e))?;
        if let Err(why) = self.catch_up(id, &addr).await {
            let removed = self
                .consensus
                .raft
                .change_membership(
                    openraft::ChangeMembers::RemoveNodes(BTreeSet::from([id])),
                    false,
                )
                .await;
            let why = match removed {
                Ok(_) => format!("{why}; it was not added"),
                Err(e) => format!(
                    "{why}; removing it as a learner failed too ({}): run `leasehold cluster remove {id}`",
                    self.change_error(e)
                ),
            };
            tracing::warn!(id, %addr, "{why}");
            return Err(MembershipError::NotAdded(why));
        }
        voters.insert(id);
        self.check_quorum(&voters).await?;
        self.consensus
            .raft
            .change_membership(voters, false)
            .await
            .map_err(|e| self.change_error(e))?;
        tracing::info!(id, "added a voter");
        // The leader restarts replication on a membership change; the status
        // answered shows the new voter's progress once it is known again.
        let mut metrics = self.consensus.raft.metrics();
        let known = metrics.wait_until(|m| {
            m.replication
                .as_ref()
                .is_some_and(|r| r.get(&id).is_some_and(Option::is_some))
        });
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), known).await;
        Ok(self.status())
    }

    /// Waits until learner `id` has answered the leader and come within
    /// [`CAUGHT_UP_LAG`] entries of its last one; why not, if it does not in
    /// time. A probe counts as an answer too, so a learner busy taking in a
    /// large snapshot (no append answered yet) is given the time to finish.
    async fn catch_up(self, id: NodeId, addr: &str) -> Result<(), String> {
        let start = tokio::time::Instant::now();
        let progress = || {
            let m = self.consensus.raft.metrics().borrow_watched().clone();
            let matched = m
                .replication
                .as_ref()
                .and_then(|r| r.get(&id).copied().flatten())
                .map(|l| l.index);
            (matched, m.last_log_index.unwrap_or(0), m.state)
        };
        loop {
            let (matched, _, state) = progress();
            if state != ServerState::Leader {
                return Err(format!(
                    "this node stopped leading while node {id} caught up"
                ));
            }
            if matched.is_some() || self.consensus.probe(id, addr).await.is_some() {
                break;
            }
            if start.elapsed() >= ANSWER_WITHIN {
                return Err(format!(
                    "node {id} at {addr} did not answer within {} s",
                    ANSWER_WITHIN.as_secs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        loop {
            let (matched, last, state) = progress();
            if state != ServerState::Leader {
                return Err(format!(
                    "this node stopped leading while node {id} caught up"
                ));
            }
            if matched.is_some_and(|i| last.saturating_sub(i) <= CAUGHT_UP_LAG) {
                return Ok(());
            }
            if start.elapsed() >= CATCH_UP_WITHIN {
                let held = matched.map_or("nothing".to_string(), |i| format!("index {i}"));
                return Err(format!(
                    "node {id} at {addr} answered but did not catch up within {} s (it holds {held} of {last})",
                    CATCH_UP_WITHIN.as_secs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Removes node `id` from the group.
    pub async fn remove(self, id: NodeId) -> Result<ClusterStatus, MembershipError> {
        self.leader_only()?;
        let mut voters = self.consensus.voters();
        let learner = self.status().members.iter().any(|m| m.id == id && !m.voter);
        if !voters.remove(&id) && !learner {
            return Err(MembershipError::invalid(
                "id",
                format!("node {id} is not a member"),
            ));
        }
        if voters.is_empty() {
            return Err(MembershipError::invalid(
                "id",
                "the last voter cannot be removed",
            ));
        }
        self.check_quorum(&voters).await?;
        let change = if learner {
            openraft::ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        } else {
            openraft::ChangeMembers::ReplaceAllVoters(voters)
        };
        self.consensus
            .raft
            .change_membership(change, false)
            .await
            .map_err(|e| self.change_error(e))?;
        tracing::info!(id, "removed a member");
        Ok(self.status())
    }

    /// Hands leadership to voter `to`, or to the follower that holds the
    /// most of the log, and waits until another node leads (the one asked,
    /// as a rule). The new leader campaigns
    /// at once, without waiting out an election timeout, so clients see a
    /// pause of about one round trip.
    pub async fn transfer_leader(
        self,
        to: Option<NodeId>,
    ) -> Result<ClusterStatus, MembershipError> {
        self.leader_only()?;
        let to = self.transfer_target(to)?;
        let term = self.consensus.raft.metrics().borrow_watched().current_term;
        self.consensus
            .raft
            .trigger()
            .transfer_leader(to)
            .await
            .map_err(|e| ConsensusError::Stopped(e.to_string()))?;
        let handed = self
            .consensus
            .raft
            .wait(Some(TRANSFER_WITHIN))
            .metrics(
                |m| m.current_term > term && m.current_leader.is_some_and(|l| l != m.id),
                "leadership to move",
            )
            .await;
        if handed.is_err() {
            return Err(ConsensusError::Unknown(format!(
                "node {to} did not take over within {} s; check `leasehold cluster status`",
                TRANSFER_WITHIN.as_secs()
            ))
            .into());
        }
        tracing::info!(to, "handed leadership over");
        Ok(self.status())
    }

    /// The voter to hand leadership to: `to` if it may take it, else the
    /// reachable follower whose log matches the most of this one's (the
    /// lowest id among equals). A node that is unreachable or behind would
    /// drop the hand-over, and the leader would refuse writes until an
    /// election: it is refused here instead.
    fn transfer_target(self, to: Option<NodeId>) -> Result<NodeId, MembershipError> {
        let voters = self.consensus.voters();
        let others: Vec<NodeId> = voters
            .iter()
            .copied()
            .filter(|&v| v != self.consensus.id)
            .collect();
        if others.is_empty() {
            return Err(MembershipError::invalid(
                "to",
                "this node is the only voter: there is no one to hand leadership to",
            ));
        }
        if let Some(to) = to {
            if to == self.consensus.id {
                return Err(MembershipError::invalid(
                    "to",
                    format!("node {to} already leads"),
                ));
            }
            if !voters.contains(&to) {
                return Err(MembershipError::invalid(
                    "to",
                    format!("node {to} is not a voter; voters: {others:?}"),
                ));
            }
        }
        let (matched, last) = {
            let m = self.consensus.raft.metrics();
            let m = m.borrow_watched();
            (
                m.replication.clone().unwrap_or_default(),
                m.last_log_index.unwrap_or(0),
            )
        };
        let index = |id: &NodeId| {
            matched
                .get(id)
                .and_then(|m| m.as_ref().map(|l| l.index))
                .unwrap_or(0)
        };
        let ready = |id: &NodeId| {
            let reachable = self
                .consensus
                .heard
                .since(*id)
                .is_some_and(|ago| ago <= self.consensus.heard.within);
            reachable && last.saturating_sub(index(id)) <= CAUGHT_UP_LAG
        };
        if let Some(to) = to {
            if !ready(&to) {
                return Err(MembershipError::invalid(
                    "to",
                    format!(
                        "node {to} is unreachable or behind (it holds index {} of {last}); see `leasehold cluster status`",
                        index(&to)
                    ),
                ));
            }
            return Ok(to);
        }
        let best = others
            .iter()
            .copied()
            .filter(ready)
            .max_by_key(|id| (index(id), std::cmp::Reverse(*id)));
        best.ok_or_else(|| {
            MembershipError::invalid(
                "to",
                "no follower is reachable and caught up; see `leasehold cluster status`",
            )
        })
    }

    /// Whether this node learned that it was removed from the group.
    pub fn removed(self) -> bool {
        self.consensus
            .removed
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    fn change_error(
        self,
        e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>,
    ) -> MembershipError {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
                ConsensusError::NotLeader {
                    leader: f.leader_node.map(|n| n.addr),
                }
                .into()
            }
            RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
                MembershipError::invalid("members", e)
            }
            // Appended, then cut from the log by a new leader.
            RaftError::APIError(ClientWriteError::LogEntryDiscarded(_)) => ConsensusError::Unknown(
                "the membership change was discarded by a new leader".into(),
            )
            .into(),
            RaftError::APIError(ClientWriteError::PreconditionFailed(e)) => {
                MembershipError::invalid("members", e)
            }
            RaftError::Fatal(e) => ConsensusError::Unknown(e.to_string()).into(),
        }
    }
}
