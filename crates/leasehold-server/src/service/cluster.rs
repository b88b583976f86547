//! Membership: the group as this node sees it, and adding and removing
//! members (admin on every key).

use leasehold_core::auth::Permission;
use leasehold_core::LockError;

use super::{audit, ApiError, LockService};
use crate::raft::{ClusterStatus, NodeId};

impl LockService {
    /// Members, roles, term, leader and lag: for any caller with a live token.
    pub async fn cluster_status(&self) -> Result<ClusterStatus, ApiError> {
        self.caller_here().await?;
        Ok(self.consensus.membership().status())
    }

    /// Adds a member (admin on every key).
    pub async fn add_member(&self, id: NodeId, addr: String) -> Result<ClusterStatus, ApiError> {
        let who = self.admin_here().await?;
        let what = format!("member {id} at {addr} added");
        let status = self.consensus.membership().add(id, addr).await?;
        audit(&who, &what);
        Ok(status)
    }

    /// Removes a member (admin on every key).
    pub async fn remove_member(&self, id: NodeId) -> Result<ClusterStatus, ApiError> {
        let who = self.admin_here().await?;
        let status = self.consensus.membership().remove(id).await?;
        audit(&who, &format!("member {id} removed"));
        Ok(status)
    }

    /// Hands leadership to voter `to`, or to the most caught-up follower
    /// (admin on every key).
    pub async fn transfer_leader(&self, to: Option<NodeId>) -> Result<ClusterStatus, ApiError> {
        let who = self.admin_here().await?;
        let status = self.consensus.membership().transfer_leader(to).await?;
        let leader = status.leader.map_or("?".to_string(), |l| l.to_string());
        audit(&who, &format!("leadership handed to node {leader}"));
        Ok(status)
    }

    /// A backup of everything applied, from the leader (admin on every key).
    pub async fn backup(&self) -> Result<crate::raft::operations::backup::Backup, ApiError> {
        let who = self.admin_here().await?;
        let backup = self.consensus.backup().await?;
        audit(
            &who,
            &format!(
                "backup taken at log index {} ({} bytes)",
                backup.index,
                backup.bytes.len()
            ),
        );
        Ok(backup)
    }

    /// Checks the caller has admin on every key; who it is, for the audit log.
    async fn admin_here(&self) -> Result<String, ApiError> {
        Ok(self
            .consensus
            .read_local(|t| {
                self.allowed(t, "", Permission::Admin)?;
                let who = t.auth().who(self.caller(t.auth())?);
                Ok::<_, LockError>(match &self.certificate {
                    Some(subject) => format!("{who}, certificate {subject:?}"),
                    None => who,
                })
            })
            .await?)
    }
}
