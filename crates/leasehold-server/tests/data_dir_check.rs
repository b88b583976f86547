//! `leaseholdd check --data-dir DIR` verifies a data dir offline and
//! changes nothing; a flipped byte in a log segment or a snapshot is named
//! by file and byte, by the check and by a start, which refuses.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::call;
use leasehold_testkit::{copy_dir, workspace_bin, Leaseholdd};
use serde_json::json;

fn check(dir: &Path) -> (bool, String) {
    let out: Output = std::process::Command::new(workspace_bin("leaseholdd"))
        .args(["check", "--data-dir"])
        .arg(dir)
        .output()
        .expect("run leaseholdd check");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// Every file under `dir`, with its bytes.
fn contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            out.extend(contents(&path));
        } else {
            let bytes = std::fs::read(&path).expect("read");
            out.push((path, bytes));
        }
    }
    out.sort();
    out
}

/// A data dir of a stopped server with a snapshot and log records after it.
async fn written_data_dir(into: &Path) {
    let mut server = Leaseholdd::start_with(&["--snapshot-every", "20"]);
    let a = server.addr.clone();
    for i in 0..60 {
        let body = json!({ "key": format!("k/{i}"), "ttl_ms": 600_000 });
        let (status, answer) = call("POST", &a, "/v1/acquire", None, Some(body)).await;
        assert_eq!(status, 200, "{answer}");
    }
    server.process.kill9();
    copy_dir(&server.data_dir(), into);
}

fn segment_of(dir: &Path) -> PathBuf {
    let mut segments: Vec<PathBuf> = std::fs::read_dir(dir.join("log"))
        .expect("log dir")
        .map(|e| e.expect("entry").path())
        .collect();
    segments.sort();
    segments.pop().expect("a segment")
}

/// Where the `n`th record of a segment starts.
fn record_start(bytes: &[u8], n: usize) -> usize {
    let mut at = 0;
    for _ in 0..n {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        assert!(len > 0, "fewer than {n} records");
        at += 8 + len;
    }
    at
}

#[tokio::test]
async fn check_passes_a_good_data_dir_and_names_each_damaged_file_and_byte() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let good = tmp.path().join("good");
    written_data_dir(&good).await;
    let before = contents(&good);
    let (ok, text) = check(&good);
    assert!(ok, "{text}");
    assert!(
        text.contains("snapshot: up to log index")
            && text.contains("checksums and table good")
            && text.contains("format: data dir format 1"),
        "{text}"
    );
    assert_eq!(contents(&good), before, "the check changed the data dir");

    // A flipped byte in the middle of the log, intact records after it.
    let bad_log = tmp.path().join("bad-log");
    copy_dir(&good, &bad_log);
    let segment = segment_of(&bad_log);
    let mut bytes = std::fs::read(&segment).expect("segment");
    let third = record_start(&bytes, 2);
    bytes[third + 12] ^= 0x40;
    std::fs::write(&segment, &bytes).expect("write");
    let name = segment.file_name().and_then(|n| n.to_str()).expect("name");
    let (ok, text) = check(&bad_log);
    assert!(!ok, "{text}");
    assert!(
        text.contains(name) && text.contains(&format!("damaged record at byte {third}")),
        "{text}"
    );
    let mut server = leasehold_testkit::Process::spawn(
        &workspace_bin("leaseholdd"),
        &[
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--data-dir".into(),
            bad_log.display().to_string(),
        ],
        &tmp.path().join("bad-log.out"),
    );
    let status = server
        .wait_exit(std::time::Duration::from_secs(20))
        .expect("a start on a damaged log exits");
    assert!(!status.success());
    let output = server.output();
    assert!(
        output.contains(name) && output.contains(&format!("byte {third}")),
        "{output}"
    );
    assert_eq!(
        std::fs::read(&segment).expect("segment"),
        bytes,
        "the start cut the log"
    );

    // A flipped byte in the snapshot's table.
    let bad_snapshot = tmp.path().join("bad-snapshot");
    copy_dir(&good, &bad_snapshot);
    let path = bad_snapshot.join("snapshot");
    let mut bytes = std::fs::read(&path).expect("snapshot");
    let at = bytes.len() - 10;
    bytes[at] ^= 0x01;
    std::fs::write(&path, &bytes).expect("write");
    let (ok, text) = check(&bad_snapshot);
    assert!(!ok, "{text}");
    assert!(
        text.contains(&path.display().to_string())
            && text.contains("the lock table at byte")
            && text.contains("fails its checksum"),
        "{text}"
    );

    // A log whose first segments are gone no longer joins the snapshot.
    let gap = tmp.path().join("gap");
    copy_dir(&good, &gap);
    std::fs::remove_file(gap.join("snapshot")).expect("remove snapshot");
    let (ok, text) = check(&gap);
    assert!(!ok, "{text}");
    assert!(text.contains("in neither the snapshot"), "{text}");
}

#[test]
fn check_reads_a_data_dir_of_release_0_1_0() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/data-dir-0.1.0/data");
    let (ok, text) = check(&fixture);
    assert!(ok, "{text}");
    assert!(text.contains("written by 0.1.0"), "{text}");
}
