//! The gRPC surface (`proto/leasehold.proto`).

use std::pin::Pin;

use futures::Stream;
use leasehold_core::{LeaseView, LockView};
use leasehold_proto::v1 as pb;
use pb::leasehold_server::{Leasehold, LeaseholdServer};
use tonic::{Request, Response, Status};

use super::calls;
use crate::raft::ClusterStatus;
use crate::service::{ApiError, LockService};

/// The tonic service over `service`.
pub fn server(service: LockService) -> LeaseholdServer<Grpc> {
    LeaseholdServer::new(Grpc { service })
}

/// Implements the generated `Leasehold` trait.
pub struct Grpc {
    service: LockService,
}

fn lock_info(key: &str, view: Option<LockView>) -> pb::LockInfo {
    let Some(v) = view else {
        return pb::LockInfo {
            key: key.to_string(),
            ..Default::default()
        };
    };
    let holder = |h: leasehold_core::HolderView| pb::Holder {
        lease_id: h.lease,
        holder: h.holder,
        fence: h.fence,
        ttl_left_ms: h.ttl_left_ms,
        mode: calls::wire_mode(h.mode).into(),
    };
    pb::LockInfo {
        key: v.key,
        holder: v.holder.map(holder),
        holders: v.holders.into_iter().map(holder).collect(),
        permits: v.permits,
        waiters: v
            .waiters
            .into_iter()
            .map(|w| pb::Waiter {
                lease_id: w.lease,
                holder: w.holder,
                wait_left_ms: w.wait_left_ms,
                mode: calls::wire_mode(w.mode).into(),
            })
            .collect(),
        has_checkpoint: v.has_checkpoint,
        checkpoint_fence: v.checkpoint.as_ref().map_or(0, |c| c.fence),
        checkpoint: v.checkpoint.map(|c| c.data.to_vec()),
        delay_left_ms: v.delay_left_ms,
    }
}

fn cluster_status(c: ClusterStatus) -> pb::ClusterStatusResponse {
    pb::ClusterStatusResponse {
        id: c.id,
        role: c.role.to_string(),
        term: c.term,
        leader: c.leader,
        leader_addr: c.leader_addr.unwrap_or_default(),
        last_log_index: c.last_log_index,
        last_applied: c.last_applied,
        commit_index: c.commit_index,
        snapshot_index: c.snapshot_index,
        members: c
            .members
            .into_iter()
            .map(|m| pb::Member {
                id: m.id,
                addr: m.addr,
                voter: m.voter,
                matched_index: m.matched_index,
                lag: m.lag,
                last_heard_ms: m.last_heard_ms,
                reachable: m.reachable,
            })
            .collect(),
        quorum: c.quorum,
    }
}

fn lease_info(v: LeaseView) -> pb::LeaseInfo {
    pb::LeaseInfo {
        lease_id: v.lease,
        holder: v.holder,
        ttl_ms: v.ttl_ms,
        ttl_left_ms: v.ttl_left_ms,
        keys: v.keys,
        key_count: v.key_count as u64,
        waiting_for: v.waiting_for,
        waiting_count: v.waiting_count as u64,
    }
}

/// The generated trait's return type, large error and all.
#[allow(clippy::result_large_err)]
fn reply<T>(result: Result<T, ApiError>) -> Result<Response<T>, Status> {
    result.map(Response::new).map_err(Status::from)
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::LockEvent, Status>> + Send>>;

impl Grpc {
    /// The service acting for the request's bearer token (metadata
    /// `authorization: Bearer <token>`), and the message.
    #[allow(clippy::result_large_err)]
    fn caller<T>(&self, request: Request<T>) -> Result<(LockService, T), Status> {
        let service = super::caller_service(
            &self.service,
            request
                .metadata()
                .get("authorization")
                .map(|v| v.to_str().ok()),
            request.extensions().get(),
            request.extensions().get(),
        )?;
        Ok((service, request.into_inner()))
    }
}

#[tonic::async_trait]
impl Leasehold for Grpc {
    async fn grant(
        &self,
        request: Request<pb::GrantRequest>,
    ) -> Result<Response<pb::GrantResponse>, Status> {
        let (s, r) = self.caller(request)?;
        reply(calls::grant(&s, r).await)
    }

    async fn keep_alive(
        &self,
        request: Request<pb::KeepAliveRequest>,
    ) -> Result<Response<pb::KeepAliveResponse>, Status> {
        let (s, r) = self.caller(request)?;
        reply(calls::keep_alive(&s, r).await)
    }

    async fn keep_alive_many(
        &self,
        request: Request<pb::KeepAliveManyRequest>,
    ) -> Result<Response<pb::KeepAliveManyResponse>, Status> {
        let (s, r) = self.caller(request)?;
        reply(calls::keep_alive_many(&s, r).await)
    }

    async fn revoke(
        &self,
        request: Request<pb::RevokeRequest>,
    ) -> Result<Response<pb::RevokeResponse>, Status> {
        let (s, r) = self.caller(request)?;
        reply(calls::revoke(&s, r).await)
    }

    async fn acquire(
        &self,
        request: Request<pb::AcquireRequest>,
    ) -> Result<Response<pb::AcquireResponse>, Status> {
        let (s, r) = self.caller(request)?;
        reply(calls::acquire(&s, r).await)
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let (s, r) = self.caller(request)?;
        reply(calls::release(&s, r).await)
    }

    async fn save_checkpoint(
        &self,
        request: Request<pb::SaveCheckpointRequest>,
    ) -> Result<Response<pb::SaveCheckpointResponse>, Status> {
        let (s, r) = self.caller(request)?;
        reply(calls::save_checkpoint(&s, r).await)
    }

    async fn describe_lock(
        &self,
        request: Request<pb::DescribeLockRequest>,
    ) -> Result<Response<pb::LockInfo>, Status> {
        let (s, r) = self.caller(request)?;
        let key = r.key;
        let view = s.lock(&key).await?;
        Ok(Response::new(lock_info(&key, view)))
    }

    async fn list_locks(
        &self,
        request: Request<pb::ListLocksRequest>,
    ) -> Result<Response<pb::ListLocksResponse>, Status> {
        let (s, r) = self.caller(request)?;
        let page = s
            .locks(
                &r.prefix,
                Some(r.start_after.as_str()),
                r.limit as usize,
                r.held_only,
            )
            .await?;
        Ok(Response::new(pb::ListLocksResponse {
            locks: page
                .items
                .into_iter()
                .map(|v| lock_info("", Some(v)))
                .collect(),
            next_start_after: page.next,
        }))
    }

    async fn describe_lease(
        &self,
        request: Request<pb::DescribeLeaseRequest>,
    ) -> Result<Response<pb::LeaseInfo>, Status> {
        let (s, r) = self.caller(request)?;
        Ok(Response::new(lease_info(s.lease(r.lease_id).await?)))
    }

    async fn list_leases(
        &self,
        request: Request<pb::ListLeasesRequest>,
    ) -> Result<Response<pb::ListLeasesResponse>, Status> {
        let (s, r) = self.caller(request)?;
        let page = s.leases(r.start_after, r.limit as usize).await?;
        Ok(Response::new(pb::ListLeasesResponse {
            leases: page.items.into_iter().map(lease_info).collect(),
            next_start_after: page.next,
        }))
    }

    async fn cluster_status(
        &self,
        request: Request<pb::ClusterStatusRequest>,
    ) -> Result<Response<pb::ClusterStatusResponse>, Status> {
        let (s, _) = self.caller(request)?;
        Ok(Response::new(cluster_status(s.cluster_status().await?)))
    }

    async fn add_member(
        &self,
        request: Request<pb::AddMemberRequest>,
    ) -> Result<Response<pb::ClusterStatusResponse>, Status> {
        let (s, r) = self.caller(request)?;
        let status = s.add_member(r.id, r.addr).await?;
        Ok(Response::new(cluster_status(status)))
    }

    async fn remove_member(
        &self,
        request: Request<pb::RemoveMemberRequest>,
    ) -> Result<Response<pb::ClusterStatusResponse>, Status> {
        let (s, r) = self.caller(request)?;
        let status = s.remove_member(r.id).await?;
        Ok(Response::new(cluster_status(status)))
    }

    async fn transfer_leader(
        &self,
        request: Request<pb::TransferLeaderRequest>,
    ) -> Result<Response<pb::ClusterStatusResponse>, Status> {
        let (s, r) = self.caller(request)?;
        let status = s.transfer_leader(r.to).await?;
        Ok(Response::new(cluster_status(status)))
    }

    type WatchStream = EventStream;

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let (s, r) = self.caller(request)?;
        let after = crate::service::resume_point(r.after_index, r.after_seq)?;
        let watch = s.watch(r.prefix, after).await?;
        let stream = futures::stream::unfold(Some(watch), |watch| async move {
            let mut watch = watch?;
            match watch.next().await {
                Ok(e) => {
                    let kind = match e.kind {
                        "acquired" => pb::lock_event::Kind::Acquired,
                        "released" => pb::lock_event::Kind::Released,
                        "checkpoint" => pb::lock_event::Kind::Checkpoint,
                        _ => pb::lock_event::Kind::Expired,
                    };
                    let event = pb::LockEvent {
                        kind: kind as i32,
                        key: e.key,
                        fence: e.fence,
                        lease_id: e.lease,
                        holder: e.holder,
                        data: e.data.unwrap_or_default(),
                        index: e.index,
                        seq: e.seq,
                    };
                    Some((Ok(event), Some(watch)))
                }
                Err(e) => Some((Err(Status::from(e)), None)),
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }
}
