//! The standard gRPC health service (`grpc.health.v1.Health`) and server
//! reflection (`grpc.reflection.v1`), so Kubernetes' gRPC probes and
//! `grpcurl` work with no `.proto` file of ours.
//!
//! A node is `SERVING` while it can serve: it leads, or it follows a leader
//! it knows (and forwards or names it). While it has no leader (an election,
//! a node cut off), once it learned it was removed, and once its Raft has
//! stopped, it is `NOT_SERVING`. The answer is the same for the whole server
//! (`""`) and for `leasehold.v1.Leasehold`. Neither needs a token, as
//! `/health` does not.

use std::time::Duration;

use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::raft::Consensus;

/// The service named in health checks, besides the server as a whole.
const SERVICE: &str = "leasehold.v1.Leasehold";

/// How often the node's state is looked at: a probe learns of a change
/// within this.
const EVERY: Duration = Duration::from_millis(250);

/// The health service, kept up to date from `consensus` by a task that
/// ends when the node's Raft stops.
pub fn service(
    consensus: &Consensus,
) -> tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health> {
    let (reporter, server) = tonic_health::server::health_reporter();
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(track(reporter, consensus.clone()));
    }
    server
}

/// Server reflection over the API's own descriptors; `None` (logged) if
/// they do not load, which a build that compiled them never sees.
pub fn reflection() -> Option<
    tonic_reflection::server::ServerReflectionServer<
        impl tonic_reflection::server::ServerReflection,
    >,
> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(leasehold_proto::FILE_DESCRIPTOR_SET)
        .build_v1()
        .inspect_err(|e| tracing::error!(error = %e, "gRPC reflection is off: the API's descriptors did not load"))
        .ok()
}

/// A follower that has not heard from its leader for this long no longer
/// counts it: past a few heartbeats (50 ms) and an election (300 ms).
const LEADER_HEARD_WITHIN: Duration = Duration::from_secs(1);

async fn track(mut reporter: HealthReporter, consensus: Consensus) {
    let mut last = None;
    let stopped = consensus.stopped();
    tokio::pin!(stopped);
    let mut every = tokio::time::interval(EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut stopped => {
                set(&mut reporter, ServingStatus::NotServing).await;
                return;
            }
            _ = every.tick() => {
                let now = consensus.serving(LEADER_HEARD_WITHIN).await;
                if last != Some(now) {
                    let status = if now { ServingStatus::Serving } else { ServingStatus::NotServing };
                    set(&mut reporter, status).await;
                    last = Some(now);
                }
            }
        }
    }
}

async fn set(reporter: &mut HealthReporter, status: ServingStatus) {
    reporter.set_service_status("", status).await;
    reporter.set_service_status(SERVICE, status).await;
}
