//! The standard gRPC health service and server reflection, as Kubernetes'
//! probes and grpcurl use them: a node is SERVING while it leads or follows
//! a leader it hears from, NOT_SERVING without one; reflection lists the
//! services without our .proto file.

use std::time::Duration;

use leasehold_testkit::{wait_until, Cluster, Leaseholdd};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

async fn channel(url: &str) -> Result<tonic::transport::Channel, tonic::Status> {
    let unavailable = |e: tonic::transport::Error| tonic::Status::unavailable(e.to_string());
    tonic::transport::Channel::from_shared(url.to_string())
        .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?
        .connect()
        .await
        .map_err(unavailable)
}

async fn status(url: &str, service: &str) -> Result<ServingStatus, tonic::Status> {
    let mut client = HealthClient::new(channel(url).await?);
    let answer = client
        .check(HealthCheckRequest {
            service: service.to_string(),
        })
        .await?
        .into_inner();
    Ok(ServingStatus::try_from(answer.status).unwrap_or(ServingStatus::Unknown))
}

/// Waits (blocking the thread, in a helper runtime) until `url` says `want`.
fn wait_status(url: &str, want: ServingStatus, what: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    wait_until(Duration::from_secs(20), what, || {
        runtime.block_on(status(url, "")).ok() == Some(want)
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_serves_and_reflection_lists_its_services() {
    let server = Leaseholdd::start();
    let url = server.url();
    tokio::task::block_in_place(|| wait_status(&url, ServingStatus::Serving, "SERVING"));
    assert_eq!(
        status(&url, "leasehold.v1.Leasehold").await.expect("check"),
        ServingStatus::Serving
    );
    let unknown = status(&url, "no.such.Service").await.expect_err("unknown");
    assert_eq!(unknown.code(), tonic::Code::NotFound);

    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    let mut reflection = ServerReflectionClient::new(channel(&url).await.expect("connect"));
    let ask = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection
        .server_reflection_info(futures::stream::iter([ask]))
        .await
        .expect("reflection")
        .into_inner();
    let answer = answers.message().await.expect("an answer").expect("one");
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("not a list: {answer:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.iter().any(|n| n == "leasehold.v1.Leasehold"),
        "{names:?}"
    );
}

#[test]
fn a_follower_without_a_leader_is_not_serving_until_one_is_back() {
    let mut c = Cluster::start(3);
    let leader = c.wait_leader();
    for node in &c.nodes {
        wait_status(&node.url(), ServingStatus::Serving, "every node SERVING");
    }
    // Only one node left: it hears no leader and cannot elect one.
    let survivor = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    c.kill(leader);
    c.kill(other);
    let url = c.nodes[survivor].url();
    wait_status(
        &url,
        ServingStatus::NotServing,
        "NOT_SERVING without a leader",
    );
    c.restart(other);
    wait_status(&url, ServingStatus::Serving, "SERVING with a leader again");
}
