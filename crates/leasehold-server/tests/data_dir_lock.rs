//! One process per data dir: a second `leaseholdd`, a `restore`, a
//! `force-new-cluster` or a `check` on the data dir of a running node is
//! refused in one line naming the dir and the node's pid, with exit code 2,
//! and the running node goes on alone. Two processes on one log would hand
//! out the same fencing token.

mod common;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use common::call;
use leasehold_testkit::{free_port, listening, workspace_bin, Leaseholdd, Process};
use serde_json::json;

fn leaseholdd(args: &[&str]) -> Output {
    std::process::Command::new(workspace_bin("leaseholdd"))
        .args(args)
        .output()
        .expect("run leaseholdd")
}

/// Exit code 2 and one line on stderr naming `dir` and `pid`.
fn assert_refused(what: &str, out: &Output, dir: &Path, pid: u32) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{what}: {out:?}");
    assert_eq!(err.trim().lines().count(), 1, "{what}: one line: {err}");
    assert!(err.contains(&dir.display().to_string()), "{what}: {err}");
    assert!(err.contains(&format!("pid {pid}")), "{what}: {err}");
}

async fn acquire(addr: &str, key: &str) -> u64 {
    let body = json!({ "key": key, "ttl_ms": 60_000 });
    let (status, answer) = call("POST", addr, "/v1/acquire", None, Some(body)).await;
    assert_eq!(status, 200, "{answer}");
    answer["fence"].as_u64().expect("a fence")
}

#[tokio::test]
async fn a_second_server_on_a_data_dir_in_use_is_refused_and_takes_no_port() {
    let mut first = Leaseholdd::start();
    let pid = first.process.pid().expect("running");
    let dir = first.data_dir();
    let before = acquire(&first.addr, "a").await;

    let tmp = tempfile::tempdir().expect("tempdir");
    let second_addr = format!("127.0.0.1:{}", free_port());
    let mut second = Process::spawn(
        &workspace_bin("leaseholdd"),
        &[
            "--listen".to_string(),
            second_addr.clone(),
            "--data-dir".to_string(),
            dir.display().to_string(),
        ],
        &tmp.path().join("second.log"),
    );
    let status = second
        .wait_exit(Duration::from_secs(20))
        .expect("the second server exits by itself");
    let output = second.output();
    assert_eq!(status.code(), Some(2), "{output}");
    assert_eq!(output.trim().lines().count(), 1, "one line: {output}");
    assert!(output.contains(&dir.display().to_string()), "{output}");
    assert!(output.contains(&format!("pid {pid}")), "{output}");
    assert!(
        !listening(&second_addr),
        "the refused server never served on {second_addr}"
    );

    // The first goes on alone, its tokens one sequence.
    let after = acquire(&first.addr, "b").await;
    assert!(after > before, "{after} after {before}");

    // Once the holder is gone (kill -9: nothing cleans up), the lock file
    // it left binds nothing: a new server on the dir serves, above it.
    first.crash_and_restart();
    let restarted = acquire(&first.addr, "c").await;
    assert!(restarted > after, "{restarted} after {after}");
}

#[tokio::test]
async fn offline_commands_refuse_a_data_dir_a_node_runs_on() {
    let server = Leaseholdd::start();
    let pid = server.process.pid().expect("running");
    let dir = server.data_dir();
    let d = dir.display().to_string();
    acquire(&server.addr, "a").await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let into = tmp.path().join("into");
    let into_s = into.display().to_string();

    let out = leaseholdd(&["check", "--data-dir", &d]);
    assert_refused("check", &out, &dir, pid);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("a node is running"),
        "{out:?}"
    );

    let backup =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/snapshot-file-v2-table-v1.bin");
    let out = leaseholdd(&["restore", &backup.display().to_string(), "--data-dir", &d]);
    assert_refused("restore", &out, &dir, pid);

    let survivor = [
        "force-new-cluster",
        "--data-dir",
        &d,
        "--into",
        &into_s,
        "--advertise",
        "127.0.0.1:1",
    ];
    let out = leaseholdd(&survivor);
    assert_refused("force-new-cluster from it", &out, &dir, pid);
    assert!(!into.exists(), "nothing was built");

    // Nor is a running node's dir the target of one, from a stopped survivor.
    let mut stopped = Leaseholdd::start();
    acquire(&stopped.addr, "s").await;
    stopped.process.terminate();
    let out = leaseholdd(&[
        "force-new-cluster",
        "--data-dir",
        &stopped.data_dir().display().to_string(),
        "--into",
        &d,
        "--advertise",
        "127.0.0.1:1",
    ]);
    assert_refused("force-new-cluster into it", &out, &dir, pid);

    // The node served on through all of it.
    acquire(&server.addr, "b").await;
}
