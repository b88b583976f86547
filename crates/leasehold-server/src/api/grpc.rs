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
    pb::LockInfo {
        key: v.key,
        holder: v.holder.map(|h| pb::Holder {
            lease_id: h.lease,
            holder: h.holder,
            fence: h.fence,
            ttl_left_ms: h.ttl_left_ms,
        }),
        waiters: v
            .waiters
            .into_iter()
            .map(|w| pb::Waiter {
                lease_id: w.lease,
                holder: w.holder,
                wait_left_ms: w.wait_left_ms,
            })
            .collect(),
        has_checkpoint: v.has_checkpoint,
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
            })
            .collect(),
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
    }
}

/// The generated trait's return type, large error and all.
#[allow(clippy::result_large_err)]
fn reply<T>(result: Result<T, ApiError>) -> Result<Response<T>, Status> {
    result.map(Response::new).map_err(Status::from)
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::LockEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Leasehold for Grpc {
    async fn grant(
        &self,
        request: Request<pb::GrantRequest>,
    ) -> Result<Response<pb::GrantResponse>, Status> {
        reply(calls::grant(&self.service, request.into_inner()).await)
    }

    async fn keep_alive(
        &self,
        request: Request<pb::KeepAliveRequest>,
    ) -> Result<Response<pb::KeepAliveResponse>, Status> {
        reply(calls::keep_alive(&self.service, request.into_inner()).await)
    }

    async fn revoke(
        &self,
        request: Request<pb::RevokeRequest>,
    ) -> Result<Response<pb::RevokeResponse>, Status> {
        reply(calls::revoke(&self.service, request.into_inner()).await)
    }

    async fn acquire(
        &self,
        request: Request<pb::AcquireRequest>,
    ) -> Result<Response<pb::AcquireResponse>, Status> {
        reply(calls::acquire(&self.service, request.into_inner()).await)
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        reply(calls::release(&self.service, request.into_inner()).await)
    }

    async fn save_checkpoint(
        &self,
        request: Request<pb::SaveCheckpointRequest>,
    ) -> Result<Response<pb::SaveCheckpointResponse>, Status> {
        reply(calls::save_checkpoint(&self.service, request.into_inner()).await)
    }

    async fn describe_lock(
        &self,
        request: Request<pb::DescribeLockRequest>,
    ) -> Result<Response<pb::LockInfo>, Status> {
        let key = request.into_inner().key;
        let view = self.service.lock(&key).await?;
        Ok(Response::new(lock_info(&key, view)))
    }

    async fn list_locks(
        &self,
        request: Request<pb::ListLocksRequest>,
    ) -> Result<Response<pb::ListLocksResponse>, Status> {
        let r = request.into_inner();
        let page = self
            .service
            .locks(&r.prefix, Some(r.start_after.as_str()), r.limit as usize)
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
        let lease = request.into_inner().lease_id;
        Ok(Response::new(lease_info(self.service.lease(lease).await?)))
    }

    async fn list_leases(
        &self,
        request: Request<pb::ListLeasesRequest>,
    ) -> Result<Response<pb::ListLeasesResponse>, Status> {
        let r = request.into_inner();
        let page = self.service.leases(r.start_after, r.limit as usize).await?;
        Ok(Response::new(pb::ListLeasesResponse {
            leases: page.items.into_iter().map(lease_info).collect(),
            next_start_after: page.next,
        }))
    }

    async fn cluster_status(
        &self,
        _request: Request<pb::ClusterStatusRequest>,
    ) -> Result<Response<pb::ClusterStatusResponse>, Status> {
        Ok(Response::new(cluster_status(
            self.service.consensus().cluster_status(),
        )))
    }

    async fn add_member(
        &self,
        request: Request<pb::AddMemberRequest>,
    ) -> Result<Response<pb::ClusterStatusResponse>, Status> {
        let r = request.into_inner();
        let status = self.service.consensus().add_member(r.id, r.addr).await?;
        Ok(Response::new(cluster_status(status)))
    }

    async fn remove_member(
        &self,
        request: Request<pb::RemoveMemberRequest>,
    ) -> Result<Response<pb::ClusterStatusResponse>, Status> {
        let status = self
            .service
            .consensus()
            .remove_member(request.into_inner().id)
            .await?;
        Ok(Response::new(cluster_status(status)))
    }

    type WatchStream = EventStream;

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let prefix = request.into_inner().prefix;
        let watch = self.service.watch(prefix)?;
        let stream = futures::stream::unfold(Some(watch), |watch| async move {
            let mut watch = watch?;
            match watch.next().await {
                Ok(e) => {
                    let kind = match e.kind {
                        "acquired" => pb::lock_event::Kind::Acquired,
                        "released" => pb::lock_event::Kind::Released,
                        _ => pb::lock_event::Kind::Expired,
                    };
                    let event = pb::LockEvent {
                        kind: kind as i32,
                        key: e.key,
                        fence: e.fence,
                        lease_id: e.lease,
                        holder: e.holder,
                    };
                    Some((Ok(event), Some(watch)))
                }
                Err(e) => Some((Err(Status::from(e)), None)),
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }
}
