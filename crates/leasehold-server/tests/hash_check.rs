//! Members' tables are hashed at the same log indexes and compared by the
//! leader: a healthy cluster raises no alarm; a member whose log was
//! changed on disk (a change its checksums cannot see) is named.

mod common;

use std::time::Duration;

use common::call;
use leasehold_testkit::{http_get, wait_until, Cluster};
use serde_json::json;

/// Changes `from` to `to` (as long) inside the record of `segment` that
/// holds it, and writes the record's checksum again: damage the log's own
/// checks cannot see, as a fault in memory before the write would be.
fn rewrite_record(segment: &std::path::Path, from: &[u8], to: &[u8]) {
    assert_eq!(from.len(), to.len());
    let mut bytes = std::fs::read(segment).expect("segment");
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("the text in the log");
    let mut start = 0;
    loop {
        let len = u32::from_le_bytes(bytes[start..start + 4].try_into().expect("4")) as usize;
        assert!(len > 0, "no record holds byte {at}");
        if at < start + 8 + len {
            bytes[at..at + to.len()].copy_from_slice(to);
            let crc = crc32fast::hash(&bytes[start + 8..start + 8 + len]);
            bytes[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
            break;
        }
        start += 8 + len;
    }
    std::fs::write(segment, bytes).expect("write segment");
}

fn segment_of(data: &std::path::Path) -> std::path::PathBuf {
    let mut segments: Vec<_> = std::fs::read_dir(data.join("log"))
        .expect("log")
        .map(|e| e.expect("entry").path())
        .collect();
    segments.sort();
    segments.remove(0)
}

#[tokio::test]
async fn the_leader_names_a_member_whose_table_differs() {
    let mut cluster = Cluster::start_with(3, &["--hash-check-every", "10"]);
    let leader = cluster.wait_leader();
    let a = cluster.nodes[leader].addr.clone();
    for i in 0..15 {
        let body =
            json!({ "key": format!("h/{i}"), "ttl_ms": 600_000, "holder": format!("victim-{i}") });
        let (status, answer) = call("POST", &a, "/v1/acquire", None, Some(body)).await;
        assert_eq!(status, 200, "{answer}");
    }
    // Healthy: a comparison runs every 5 s and finds nothing.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let health = http_get(&a, "/health").expect("health");
    assert!(health.contains("\"status\":\"ok\""), "{health}");

    let follower = (0..3).find(|&i| i != leader).expect("a follower");
    let id = cluster.nodes[follower].id;
    cluster.kill(follower);
    let segment = segment_of(cluster.nodes[follower].data_dir());
    rewrite_record(&segment, b"victim-3", b"victiM-3");
    cluster.restart(follower);

    wait_until(
        Duration::from_secs(60),
        "the leader to raise the alarm",
        || {
            http_get(&a, "/health").is_some_and(|h| {
                h.contains("\"status\":\"degraded\"") && h.contains(&format!("members [{id}]"))
            })
        },
    );
    let metrics = http_get(&a, "/metrics").expect("metrics");
    assert!(
        metrics.contains("leasehold_table_hash_mismatch 1"),
        "{metrics}"
    );
}
