//! Helpers shared by the integration tests: short names for the calls every
//! test makes.
#![allow(dead_code)]

use leasehold_proto::v1 as pb;
use leasehold_testkit::Leaseholdd;
use pb::leasehold_client::LeaseholdClient;
use tonic::transport::Channel;

pub type Grpc = LeaseholdClient<Channel>;

pub async fn grpc(server: &Leaseholdd) -> Grpc {
    LeaseholdClient::connect(server.url())
        .await
        .expect("connect gRPC")
}

/// Grants a lease and returns its id.
pub async fn lease(c: &mut Grpc, ttl_ms: u64, holder: &str) -> u64 {
    c.grant(pb::GrantRequest {
        ttl_ms,
        holder: holder.into(),
    })
    .await
    .expect("grant")
    .into_inner()
    .lease_id
}

/// Takes `key` under `lease` at once and returns the fencing token.
pub async fn take(c: &mut Grpc, lease: u64, key: &str) -> u64 {
    c.acquire(pb::AcquireRequest {
        lease_id: lease,
        key: key.into(),
        ..Default::default()
    })
    .await
    .expect("acquire")
    .into_inner()
    .fence
}

/// The lock as the server describes it.
pub async fn describe(c: &mut Grpc, key: &str) -> pb::LockInfo {
    c.describe_lock(pb::DescribeLockRequest { key: key.into() })
        .await
        .expect("describe")
        .into_inner()
}

/// The code in a status's `leasehold-code` metadata.
pub fn code(status: &tonic::Status) -> String {
    status
        .metadata()
        .get("leasehold-code")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}
