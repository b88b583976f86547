//! The checkpoint example, killed mid-way and resumed by a successor.

use std::collections::BTreeMap;
use std::time::Duration;

use leasehold_testkit::{wait_until, workspace_bin, Leaseholdd, Process};

#[test]
fn a_killed_job_resumes_from_its_checkpoint_and_processes_every_item_once() {
    let server = Leaseholdd::start();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let args = |ms: &str| -> Vec<String> {
        [
            server.url().as_str(),
            "jobs/squares",
            out.to_str().unwrap(),
            "60",
            "5",
            ms,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let batches = || {
        std::fs::read_dir(&out)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| !e.file_name().to_string_lossy().contains('.'))
                    .count()
            })
            .unwrap_or(0)
    };

    let mut first = Process::spawn(
        &workspace_bin("examples/checkpoint_job"),
        &args("20"),
        &dir.path().join("first.log"),
    );
    wait_until(Duration::from_secs(20), "a few batches", || batches() >= 3);
    first.kill9();
    let done_before = batches();

    let mut second = Process::spawn(
        &workspace_bin("examples/checkpoint_job"),
        &args("0"),
        &dir.path().join("second.log"),
    );
    wait_until(Duration::from_secs(30), "the successor to finish", || {
        second.output().contains("done")
    });
    let resumed: u64 = second
        .output()
        .lines()
        .find_map(|l| {
            l.strip_prefix("resuming at item ")?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .expect("the successor says where it resumed");
    // A batch's file is written before its checkpoint is saved, so a kill
    // between the two leaves the checkpoint one batch behind the files: the
    // successor redoes that batch (replacing its file), never more.
    assert!(resumed > 0, "restarted from scratch instead of resuming");
    assert!(
        resumed as usize >= (done_before - 1) * 5,
        "resumed at {resumed} with {done_before} batches on disk"
    );
    second.kill9();

    let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
    for entry in std::fs::read_dir(&out).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name().to_string_lossy().contains('.') {
            continue; // the gate's .fence and .lock files
        }
        for line in std::fs::read_to_string(entry.path()).unwrap().lines() {
            let (item, square) = line.split_once(' ').unwrap();
            let item: u64 = item.parse().unwrap();
            assert_eq!(square.parse::<u64>().unwrap(), item * item);
            *seen.entry(item).or_default() += 1;
        }
    }
    assert_eq!(
        seen.keys().copied().collect::<Vec<_>>(),
        (0..60).collect::<Vec<_>>(),
        "items missing"
    );
    assert!(
        seen.values().all(|&n| n == 1),
        "items processed more than once: {seen:?}"
    );
}
