//! Disaster recovery: a 3-node cluster loses two nodes for good; the
//! survivor's data dir becomes a one-node cluster with everything it held
//! (`leaseholdd force-new-cluster`), which serves, grants tokens above every
//! token seen, and takes members back.

mod common;

use std::process::Command;
use std::time::Duration;

use common::call;
use leasehold_testkit::{wait_until, workspace_bin, Cluster};
use serde_json::json;

#[tokio::test]
async fn a_survivor_becomes_a_one_node_cluster_that_serves_and_grows_again() {
    let mut old = Cluster::start(3);
    let leader = old.wait_leader();
    let a = old.nodes[leader].addr.clone();
    let mut seen = 0;
    let mut kept = None;
    for i in 0..20 {
        let body = json!({ "key": format!("dr/{i}"), "ttl_ms": 600_000 });
        let (status, answer) = call("POST", &a, "/v1/acquire", None, Some(body)).await;
        assert_eq!(status, 200, "{answer}");
        let fence = answer["fence"].as_u64().expect("fence");
        seen = seen.max(fence);
        kept.get_or_insert((answer["lease"].as_u64().expect("lease"), fence));
    }
    let (kept_lease, kept_fence) = kept.expect("a hold");
    // The leader has every acknowledged write in its log: it survives.
    let survivor = old.nodes[leader].data_dir().to_path_buf();
    for i in 0..3 {
        old.kill(i);
    }
    for (i, node) in old.nodes.iter().enumerate() {
        if i != leader {
            std::fs::remove_dir_all(node.data_dir()).expect("lose a node for good");
        }
    }

    let before = files_of(&survivor);
    let mut new = Cluster::start_prepared(1, |id, data, peers| {
        let advertise = peers.split_once('=').expect("ID=ADDR").1.to_string();
        let out = Command::new(workspace_bin("leaseholdd"))
            .args(["force-new-cluster", "--data-dir"])
            .arg(&survivor)
            .arg("--into")
            .arg(data)
            .args(["--node-id", &id.to_string(), "--advertise", &advertise])
            .output()
            .expect("run force-new-cluster");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    let a = new.nodes[0].addr.clone();
    assert!(
        files_of(&survivor) == before,
        "force-new-cluster changed the survivor's data dir"
    );

    // Everything the survivor held is there, and the holder renews.
    let (status, first) = call("GET", &a, "/v1/locks/dr/0", None, None).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["holders"][0]["fence"], kept_fence, "{first}");
    let renew = format!("/v1/leases/{kept_lease}/keepalive");
    let (status, answer) = call("POST", &a, &renew, None, Some(json!({}))).await;
    assert_eq!(status, 200, "{answer}");
    let (status, last) = call("GET", &a, "/v1/locks/dr/19", None, None).await;
    assert_eq!(status, 200, "{last}");
    assert_eq!(last["holders"][0]["fence"], seen, "{last}");
    // Tokens go on above every token seen.
    let body = json!({ "key": "after", "ttl_ms": 10_000 });
    let (status, answer) = call("POST", &a, "/v1/acquire", None, Some(body)).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer["fence"].as_u64().expect("fence") > seen, "{answer}");

    // Members come back: a new node 2, added and caught up.
    let two = new.start_new_node(2);
    let addr2 = new.nodes[two].addr.clone();
    let body = json!({ "id": 2, "addr": addr2 });
    let (status, answer) = call("POST", &a, "/v1/cluster/members", None, Some(body)).await;
    assert_eq!(status, 200, "{answer}");
    wait_until(Duration::from_secs(30), "node 2 to apply the log", || {
        new.nodes[two]
            .health()
            .is_some_and(|h| h.contains("\"leader_id\":1"))
    });
}

#[test]
fn force_new_cluster_refuses_bad_input_and_creates_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |args: &[&str]| {
        Command::new(workspace_bin("leaseholdd"))
            .arg("force-new-cluster")
            .args(args)
            .output()
            .expect("run")
    };
    let into = dir.path().join("into");
    let into_arg = into.display().to_string();
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).expect("mkdir");
    let empty_arg = empty.display().to_string();
    let out = run(&[
        "--data-dir",
        &empty_arg,
        "--into",
        &into_arg,
        "--advertise",
        "127.0.0.1:7419",
    ]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("holds no data dir"),
        "{said}"
    );
    assert!(!into.exists());
}

/// Every file under `dir`, with its bytes.
fn files_of(dir: &std::path::Path) -> std::collections::BTreeMap<std::path::PathBuf, Vec<u8>> {
    let mut files = std::collections::BTreeMap::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(at) = dirs.pop() {
        for item in std::fs::read_dir(&at).expect("read dir") {
            let path = item.expect("dir entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let bytes = std::fs::read(&path).expect("read file");
                files.insert(path, bytes);
            }
        }
    }
    files
}

/// A single node restored without `--peers` is recorded at the address it
/// was restored for (`--listen`), not at the default port; started again on
/// another address it records that one. A cluster member started as
/// another address than its data dir records is refused in one line.
#[test]
fn a_restored_node_is_recorded_where_it_answers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backup = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/snapshot-file-v2-table-v1.bin");
    let data = dir.path().join("single");
    let addr = format!("127.0.0.1:{}", leasehold_testkit::free_port());
    let out = Command::new(workspace_bin("leaseholdd"))
        .arg("restore")
        .arg(&backup)
        .arg("--data-dir")
        .arg(&data)
        .args(["--listen", &addr])
        .output()
        .expect("restore");
    assert!(out.status.success(), "{out:?}");
    let recorded = |addr: &str| -> Option<String> {
        let cluster = leasehold_testkit::http_get(addr, "/v1/cluster")?;
        let cluster: serde_json::Value = serde_json::from_str(&cluster).ok()?;
        cluster["members"][0]["addr"].as_str().map(str::to_string)
    };
    let serve = |addr: &str, log: &str| {
        leasehold_testkit::Process::spawn(
            &workspace_bin("leaseholdd"),
            &[
                "--listen".to_string(),
                addr.to_string(),
                "--data-dir".to_string(),
                data.display().to_string(),
            ],
            &dir.path().join(log),
        )
    };
    let mut node = serve(&addr, "first.log");
    wait_until(
        Duration::from_secs(20),
        "the restored node to lead at its address",
        || {
            leasehold_testkit::http_get(&addr, "/health")
                .is_some_and(|h| h.contains(&format!("\"leader_addr\":\"{addr}\"")))
        },
    );
    assert_eq!(recorded(&addr).as_deref(), Some(addr.as_str()));
    node.kill9();

    let moved = format!("127.0.0.1:{}", leasehold_testkit::free_port());
    let _node = serve(&moved, "second.log");
    wait_until(Duration::from_secs(20), "the new address recorded", || {
        recorded(&moved).as_deref() == Some(moved.as_str())
    });

    // A member of a cluster: refused, naming both addresses.
    let member = dir.path().join("member");
    let (a, b) = ("127.0.0.1:1", "127.0.0.1:2");
    let peers = format!("1={a},2={b}");
    let out = Command::new(workspace_bin("leaseholdd"))
        .arg("restore")
        .arg(&backup)
        .arg("--data-dir")
        .arg(&member)
        .args(["--peers", &peers])
        .output()
        .expect("restore");
    assert!(out.status.success(), "{out:?}");
    let elsewhere = format!("127.0.0.1:{}", leasehold_testkit::free_port());
    let out = Command::new(workspace_bin("leaseholdd"))
        .args(["--node-id", "1", "--listen", &elsewhere])
        .args(["--peers", &format!("1={elsewhere},2={b}")])
        .arg("--data-dir")
        .arg(&member)
        .output()
        .expect("start");
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.trim().lines().last().unwrap_or("");
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        last.contains(&format!("records node 1 at {a}")) && last.contains(&elsewhere),
        "{err}"
    );
}
