//! The unary calls that change state, on the protobuf messages of
//! `proto/leasehold.proto`: one implementation for gRPC and the framed
//! protocol.

use leasehold_proto::v1 as pb;

use crate::service::{AcquireArgs, ApiError, LeaseSpec, LockService};

type Result<T> = std::result::Result<T, ApiError>;

pub async fn grant(s: &LockService, r: pb::GrantRequest) -> Result<pb::GrantResponse> {
    let (lease_id, ttl_ms) = s.grant(r.ttl_ms, r.holder, r.request_id).await?;
    Ok(pb::GrantResponse { lease_id, ttl_ms })
}

pub async fn keep_alive(s: &LockService, r: pb::KeepAliveRequest) -> Result<pb::KeepAliveResponse> {
    let (ttl_ms, key_count) = s.keep_alive(r.lease_id).await?;
    Ok(pb::KeepAliveResponse {
        ttl_ms,
        key_count: Some(key_count),
    })
}

pub async fn keep_alive_many(
    s: &LockService,
    r: pb::KeepAliveManyRequest,
) -> Result<pb::KeepAliveManyResponse> {
    let renewals = s.keep_alive_many(r.lease_ids).await?;
    Ok(pb::KeepAliveManyResponse {
        renewals: renewals
            .into_iter()
            .map(|r| match r.answer {
                Ok((ttl_ms, key_count)) => pb::LeaseRenewal {
                    lease_id: r.lease,
                    renewed: Some(pb::KeepAliveResponse {
                        ttl_ms,
                        key_count: Some(key_count),
                    }),
                    error: None,
                },
                Err(refused) => pb::LeaseRenewal {
                    lease_id: r.lease,
                    renewed: None,
                    error: Some(ApiError::from(refused).into()),
                },
            })
            .collect(),
    })
}

pub async fn revoke(s: &LockService, r: pb::RevokeRequest) -> Result<pb::RevokeResponse> {
    let released = s.revoke(r.lease_id).await?;
    Ok(pb::RevokeResponse { released })
}

pub async fn acquire(s: &LockService, r: pb::AcquireRequest) -> Result<pb::AcquireResponse> {
    let mode = mode(r.mode, r.permits)?;
    let grant = s
        .acquire(AcquireArgs {
            lease: match r.lease_id {
                0 => LeaseSpec::New {
                    ttl_ms: r.ttl_ms,
                    holder: r.holder,
                },
                lease => LeaseSpec::Existing(lease),
            },
            key: r.key,
            wait_ms: r.wait_ms,
            lock_delay_ms: r.lock_delay_ms,
            request_id: r.request_id,
            mode,
            set: r.keys,
        })
        .await?;
    Ok(pb::AcquireResponse {
        lease_id: grant.lease,
        fence: grant.fence,
        checkpoint_fence: grant.checkpoint.as_ref().map_or(0, |c| c.fence),
        checkpoint: grant.checkpoint.map(|c| c.data.to_vec()),
    })
}

/// The table's mode for a request's `mode` and `permits`.
pub fn mode(mode: i32, permits: u32) -> Result<leasehold_core::Mode> {
    use leasehold_core::Mode;
    let mode = pb::Mode::try_from(mode)
        .map_err(|_| ApiError::invalid("mode", format!("{mode} is not a mode")))?;
    match (mode, permits) {
        (pb::Mode::Exclusive, 0) => Ok(Mode::Exclusive),
        (pb::Mode::Shared, 0) => Ok(Mode::Shared),
        (pb::Mode::Permit, permits) => {
            let mode = Mode::Permit { permits };
            leasehold_core::limits::validate_mode(mode)?;
            Ok(mode)
        }
        (_, _) => Err(ApiError::invalid(
            "permits",
            "is only for mode PERMIT (a semaphore)",
        )),
    }
}

/// The wire form of a table's mode name.
pub fn wire_mode(name: &str) -> pb::Mode {
    match name {
        "shared" => pb::Mode::Shared,
        "permit" => pb::Mode::Permit,
        _ => pb::Mode::Exclusive,
    }
}

pub async fn release(s: &LockService, r: pb::ReleaseRequest) -> Result<pb::ReleaseResponse> {
    s.release(r.key, r.fence, r.request_id).await?;
    Ok(pb::ReleaseResponse {})
}

pub async fn save_checkpoint(
    s: &LockService,
    r: pb::SaveCheckpointRequest,
) -> Result<pb::SaveCheckpointResponse> {
    s.save_checkpoint(r.key, r.fence, r.data).await?;
    Ok(pb::SaveCheckpointResponse {})
}
