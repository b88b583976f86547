//! Mutual TLS between the nodes of a real cluster: it forms and fails over
//! over TLS, a node whose certificate names another node id is refused, a
//! Raft call without a peer certificate is refused, and the flags that must
//! go together are checked at start.

mod common;

use std::time::Duration;

use leasehold_proto::raft::raft_peer_client::RaftPeerClient;
use leasehold_proto::raft::PeerMessage;
use leasehold_testkit::pki::{Ca, Issued};
use leasehold_testkit::{http_get, metric, wait_until, workspace_bin, Cluster};
use openraft::raft::{AppendEntriesRequest, VoteRequest};
use openraft::Vote;
use serde_json::{json, Value};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// The peer flags for a node with `cert`.
fn peer_flags(ca: &Ca, cert: &Issued) -> Vec<String> {
    let path = |p: &std::path::Path| p.display().to_string();
    vec![
        "--peer-tls-cert".into(),
        path(&cert.cert),
        "--peer-tls-key".into(),
        path(&cert.key),
        "--peer-tls-ca".into(),
        path(&ca.cert),
    ]
}

fn cluster_view(addr: &str) -> Value {
    http_get(addr, "/v1/cluster")
        .and_then(|b| serde_json::from_str(&b).ok())
        .unwrap_or(Value::Null)
}

#[tokio::test]
async fn a_cluster_forms_replicates_and_fails_over_over_mutual_tls() {
    let _one = common::serial().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "peers");
    let certs = ca.node_certs(3);
    let mut c = Cluster::start_each(3, move |id| peer_flags(&ca, &certs[id as usize - 1]));
    let leader = c.wait_leader();
    let (s, r) = common::post(
        &c.nodes[leader].addr,
        "/v1/acquire",
        json!({"key": "tls/k", "ttl_ms": 60_000}),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    let fence = r["fence"].as_u64().unwrap();

    // Every member has the entry: replication crossed TLS.
    wait_until(Duration::from_secs(10), "every member to match", || {
        let view = cluster_view(&c.nodes[leader].addr);
        let members = view["members"].as_array().cloned().unwrap_or_default();
        members.len() == 3 && members.iter().all(|m| m["lag"].as_u64() == Some(0))
    });
    // With peer certificates, appends go over gRPC's mutual TLS, never
    // framed in plaintext.
    let metrics = http_get(&c.nodes[leader].addr, "/metrics").unwrap_or_default();
    let streams = |transport: &str| {
        let name = format!("leasehold_raft_append_streams_total{{transport=\"{transport}\"}}");
        metric(&metrics, &name)
    };
    assert!(streams("grpc") >= 2, "{metrics}");
    assert_eq!(streams("framed"), 0, "{metrics}");

    // The leader dies; the others elect one over TLS, and it holds the lock.
    c.kill(leader);
    let next = c.wait_leader();
    assert_ne!(next, leader);
    let (s, r) = common::post(
        &c.nodes[next].addr,
        "/v1/acquire",
        json!({"key": "tls/k", "ttl_ms": 60_000}),
    )
    .await;
    assert_eq!(s, 409, "{r}");
    assert_eq!(r["error"]["fence"].as_u64(), Some(fence), "{r}");
}

#[tokio::test]
async fn a_node_with_another_nodes_certificate_is_refused() {
    let _one = common::serial().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "peers");
    let one = ca.issue("node1", &["1.node.leasehold"]);
    let two = ca.issue("node2", &["2.node.leasehold"]);
    // Node 3 is given node 2's certificate.
    let c = Cluster::start_each(3, move |id| match id {
        1 => peer_flags(&ca, &one),
        _ => peer_flags(&ca, &two),
    });
    let leader = c.wait_leader();
    assert_ne!(c.nodes[leader].id, 3);
    // Node 3 cannot pass for itself: the leader will not talk to a node
    // whose certificate names another, and says why.
    wait_until(
        Duration::from_secs(20),
        "the leader to refuse node 3",
        || {
            let log = c.nodes[leader].output();
            log.contains("cannot reach peer")
                && log.contains("not valid for name \"3.node.leasehold\"")
        },
    );
    let view = cluster_view(&c.nodes[leader].addr);
    let three = view["members"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["id"] == 3).cloned())
        .unwrap_or(Value::Null);
    assert!(three["matched_index"].is_null(), "{view}");
    assert!(!c.nodes[2].leads());
    // The two real nodes serve.
    let (s, r) = common::post(
        &c.nodes[leader].addr,
        "/v1/acquire",
        json!({"key": "k", "ttl_ms": 5_000}),
    )
    .await;
    assert_eq!(s, 200, "{r}");
}

/// A peer call naming the cluster `cluster`, as members send them.
fn of_cluster<T>(cluster: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("leasehold-cluster", cluster.parse().unwrap());
    request
}

#[tokio::test]
async fn raft_calls_without_a_peer_certificate_are_refused() {
    let _one = common::serial().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "peers");
    let certs = ca.node_certs(3);
    let two = certs[1].clone();
    let ca_pem = std::fs::read(&ca.cert).unwrap();
    let c = Cluster::start_each(3, move |id| peer_flags(&ca, &certs[id as usize - 1]));

    // With node 2's certificate, a vote from node 2 is heard and one that
    // claims to come from node 3 is refused.
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&ca_pem))
        .identity(Identity::from_pem(
            std::fs::read(&two.cert).unwrap(),
            std::fs::read(&two.key).unwrap(),
        ))
        .domain_name("1.node.leasehold");
    let channel = Channel::from_shared(format!("https://{}", c.nodes[0].addr))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut as_two = RaftPeerClient::new(channel);
    // Members name their cluster on every Raft call (the id node 1 made
    // when it formed the group).
    let cluster = std::fs::read_to_string(c.nodes[0].data_dir().join("cluster")).unwrap();
    let cluster = cluster.trim().trim_start_matches("cluster ").to_string();
    let vote = |from: u64| {
        // A stale term: heard and turned down, so nothing changes.
        let request: VoteRequest<leasehold_server::raft::TypeConfig> =
            VoteRequest::new(Vote::new(0, from), None);
        PeerMessage {
            bincode: leasehold_server::raft::transport::encode(&request).unwrap(),
        }
    };
    as_two
        .vote(of_cluster(&cluster, vote(2)))
        .await
        .expect("node 2's own vote is heard");
    // Naming another cluster, or none, it is refused with both ids.
    let status = as_two
        .vote(of_cluster("00000000000000aa", vote(2)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(
        status.message().contains(&cluster) && status.message().contains("00000000000000aa"),
        "{status:?}"
    );
    let status = as_two.vote(vote(2)).await.unwrap_err();
    assert!(status.message().contains("names none"), "{status:?}");
    let status = as_two
        .vote(of_cluster(&cluster, vote(3)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains("does not name node 3"),
        "{status:?}"
    );
    // So does a stream of appends: one that claims to come from node 3 ends
    // with the refusal, and nothing of it reaches the Raft.
    let append = |from: u64| {
        let request: AppendEntriesRequest<leasehold_server::raft::TypeConfig> =
            AppendEntriesRequest {
                vote: Vote::new(0, from),
                prev_log_id: None,
                leader_commit: None,
                entries: vec![],
            };
        PeerMessage {
            bincode: leasehold_server::raft::transport::encode(&request).unwrap(),
        }
    };
    let mut answers = as_two
        .append_stream(of_cluster(&cluster, tokio_stream::iter(vec![append(3)])))
        .await
        .expect("the stream opens")
        .into_inner();
    let status = match answers.message().await {
        Ok(Some(_)) => panic!("an append that claims to come from node 3 was answered"),
        Ok(None) => panic!("the stream ended without refusing"),
        Err(status) => status,
    };
    assert!(
        status.message().contains("does not name node 3"),
        "{status:?}"
    );

    // Without a certificate, nothing is heard.
    let mut raw = RaftPeerClient::connect(format!("http://{}", c.nodes[0].addr))
        .await
        .unwrap();
    let status = raw
        .probe(PeerMessage { bincode: vec![] })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    let status = raw
        .vote(PeerMessage {
            bincode: vec![0; 64],
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    let status = raw
        .append_stream(tokio_stream::iter(vec![append(2)]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
}

#[test]
fn tls_flags_that_go_together_are_checked_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "ca");
    let cert = ca.issue("server", &["127.0.0.1"]);
    let run = |args: &[&str]| {
        std::process::Command::new(workspace_bin("leaseholdd"))
            .args(["--data-dir", dir.path().join("d").to_str().unwrap()])
            .args(args)
            .output()
            .unwrap()
    };
    let c = cert.cert.to_str().unwrap();
    let k = cert.key.to_str().unwrap();
    let a = ca.cert.to_str().unwrap();
    // Without the rest of its set; a key that is not the certificate's; a
    // cluster whose clients speak TLS but whose peers could not.
    let other = ca.issue("other", &["127.0.0.1"]);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--tls-cert", c], "--tls-key"),
        (
            vec!["--peer-tls-cert", c, "--peer-tls-key", k],
            "--peer-tls-ca",
        ),
        (
            vec!["--tls-cert", c, "--tls-key", other.key.to_str().unwrap()],
            "is not the key of",
        ),
        (
            vec!["--tls-cert", a, "--tls-key", "/nonexistent/key.pem"],
            "key",
        ),
        (
            vec![
                "--tls-cert",
                c,
                "--tls-key",
                k,
                "--node-id",
                "1",
                "--peers",
                "1=127.0.0.1:1,2=127.0.0.1:2",
            ],
            "peer certificates",
        ),
        (
            vec!["--listen", "0.0.0.0:0", "--tls-cert", c, "--tls-key", k],
            "client certificates",
        ),
    ];
    for (args, says) in cases {
        let out = run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} started");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
