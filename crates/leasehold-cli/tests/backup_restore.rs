//! Backups and restores end to end: `leasehold snapshot save` under load,
//! the old cluster killed, `leaseholdd restore` into a new one; every
//! token after the restore is above every token a client ever saw, the
//! grants after the backup included. And bad input changes nothing.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use leasehold_testkit::{copy_dir, workspace_bin, Cluster};
use serde_json::{json, Value};

fn leasehold(endpoints: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .env("LEASEHOLD_ENDPOINT", endpoints)
        .args(args)
        .output()
        .expect("run leasehold")
}

fn leaseholdd(args: &[&str]) -> Output {
    Command::new(workspace_bin("leaseholdd"))
        .args(args)
        .output()
        .expect("run leaseholdd")
}

fn said(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// A call to the cluster, following the leader.
async fn call(http: &reqwest::Client, base: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let request = match body {
        Some(body) => http.post(format!("{base}{path}")).json(&body),
        None => http.get(format!("{base}{path}")),
    };
    match request.header("Leasehold-Follow-Leader", "1").send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            (status, r.json().await.unwrap_or(Value::Null))
        }
        Err(e) => (0, json!({ "error": e.to_string() })),
    }
}

/// Acquires `key` on a new lease: its lease and token.
async fn acquire(http: &reqwest::Client, base: &str, key: &str, ttl_ms: u64) -> Option<(u64, u64)> {
    let body = json!({ "key": key, "ttl_ms": ttl_ms });
    let (status, answer) = call(http, base, "/v1/acquire", Some(body)).await;
    (status == 200).then(|| {
        (
            answer["lease"].as_u64().expect("lease"),
            answer["fence"].as_u64().expect("fence"),
        )
    })
}

/// Acquires `key` as [`acquire`] does, trying again for up to 20 s while
/// the cluster has no leader (after its leader was killed, say).
async fn acquire_within_20s(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    ttl_ms: u64,
) -> Option<(u64, u64)> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let acquired = acquire(http, base, key, ttl_ms).await;
        if acquired.is_some() || std::time::Instant::now() >= deadline {
            return acquired;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Acquires and releases keys until `stop`, keeping the highest token seen.
async fn load(base: String, highest: Arc<AtomicU64>, stop: Arc<AtomicBool>) {
    let http = reqwest::Client::new();
    let mut i = 0u64;
    while !stop.load(Ordering::SeqCst) {
        i += 1;
        let key = format!("load/{}", i % 50);
        if let Some((lease, fence)) = acquire(&http, &base, &key, 60_000).await {
            highest.fetch_max(fence, Ordering::SeqCst);
            let path = format!("/v1/leases/{lease}");
            let _ = http
                .delete(format!("{base}{path}"))
                .header("Leasehold-Follow-Leader", "1")
                .send()
                .await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_cluster_grants_tokens_above_every_token_any_client_saw() {
    let mut old = Cluster::start(3);
    let endpoints = old.endpoints();
    let base = old.nodes[0].url();
    let http = reqwest::Client::new();
    let (kept_lease, kept_fence) = acquire(&http, &base, "kept", 60_000)
        .await
        .expect("hold a key across the backup");

    let highest = Arc::new(AtomicU64::new(kept_fence));
    let stop = Arc::new(AtomicBool::new(false));
    let loader = tokio::spawn(load(base.clone(), highest.clone(), stop.clone()));
    while highest.load(Ordering::SeqCst) < kept_fence + 50 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let backup = dir.path().join("backup.snap");
    let backup_arg = backup.display().to_string();
    let ends = endpoints.clone();
    let saved =
        tokio::task::spawn_blocking(move || leasehold(&ends, &["snapshot", "save", &backup_arg]))
            .await
            .expect("save");
    assert!(saved.status.success(), "{}", said(&saved));
    // Grants after the backup: lost to the restore, but seen by clients.
    let at_backup = highest.load(Ordering::SeqCst);
    while highest.load(Ordering::SeqCst) < at_backup + 100 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::SeqCst);
    loader.await.expect("load");
    let seen = highest.load(Ordering::SeqCst);
    for i in 0..3 {
        old.kill(i);
    }

    let status = leasehold(
        &endpoints,
        &["snapshot", "status", &backup.display().to_string()],
    );
    assert!(status.status.success(), "{}", said(&status));
    assert!(
        said(&status).contains("checksums   good"),
        "{}",
        said(&status)
    );

    let backup_path = backup.clone();
    let new = Cluster::start_prepared(3, move |id, data, peers| {
        let out = leaseholdd(&[
            "restore",
            &backup_path.display().to_string(),
            "--data-dir",
            &data.display().to_string(),
            "--node-id",
            &id.to_string(),
            "--peers",
            peers,
        ]);
        assert!(out.status.success(), "{}", said(&out));
    });
    let base = new.nodes[0].url();

    // The hold taken before the backup is back, and its holder renews.
    let (status, lock) = call(&http, &base, "/v1/locks/kept", None).await;
    assert_eq!(status, 200, "{lock}");
    assert_eq!(lock["holders"][0]["fence"], kept_fence, "{lock}");
    let renew = format!("/v1/leases/{kept_lease}/keepalive");
    let (status, answer) = call(&http, &base, &renew, Some(json!({}))).await;
    assert_eq!(status, 200, "{answer}");

    // Every new token is above every token seen, those after the backup too.
    for i in 0..20 {
        let (_, fence) = acquire(&http, &base, &format!("after/{i}"), 10_000)
            .await
            .expect("acquire on the restored cluster");
        assert!(
            fence > seen,
            "token {fence} after the restore is not above {seen}"
        );
    }

    // A member of the old cluster started in the place of a new one (its
    // data dir where node 3's is) is refused: at start, since its data dir
    // records it at the old cluster's address, or by the new cluster's
    // members, for its cluster id. It never gets the new cluster's
    // entries, and the new cluster goes on without it (after an election,
    // if node 3 led).
    let mut new = new;
    new.kill(2);
    let place = new.nodes[2].data_dir().to_path_buf();
    std::fs::remove_dir_all(&place).expect("remove node 3's data dir");
    copy_dir(old.nodes[2].data_dir(), &place);
    new.restart(2);
    let (_, fence) = acquire_within_20s(&http, &base, "after/old-member", 10_000)
        .await
        .expect("the new cluster serves beside a member of the old one");
    assert!(fence > seen);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let refused =
        |out: String| out.contains("another cluster") || out.contains("records node 3 at");
    while !refused(new.nodes[2].output()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the old member was not refused: {}",
            new.nodes[2].output()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let old_member = new.nodes[2].url();
    let (status, lock) = call(&http, &old_member, "/v1/locks/after/old-member", None).await;
    assert!(
        status != 200 || lock["holders"].as_array().is_none_or(|h| h.is_empty()),
        "the old member holds the new cluster's entries: {lock}"
    );
}

#[test]
fn bad_input_to_restore_and_status_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("missing.snap");
    let out = leasehold(
        "http://127.0.0.1:1",
        &["snapshot", "status", &missing.display().to_string()],
    );
    assert!(!out.status.success());
    assert!(said(&out).contains("missing.snap"), "{}", said(&out));

    // A truncated backup: a valid one cut short.
    let good = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../leasehold-server/tests/golden/snapshot-file-v2-table-v1.bin");
    let bytes = std::fs::read(&good).expect("golden snapshot");
    let cut = dir.path().join("cut.snap");
    std::fs::write(&cut, &bytes[..bytes.len() - 7]).expect("write");
    let cut_arg = cut.display().to_string();
    let out = leasehold("http://127.0.0.1:1", &["snapshot", "status", &cut_arg]);
    assert!(
        !out.status.success() && said(&out).contains("cut.snap"),
        "{}",
        said(&out)
    );
    let data = dir.path().join("data");
    let data_arg = data.display().to_string();
    let out = leaseholdd(&["restore", &cut_arg, "--data-dir", &data_arg]);
    assert!(!out.status.success(), "{}", said(&out));
    assert!(!data.exists(), "a failed restore left {}", data.display());

    // A good one into a data dir that is not empty.
    let good_arg = good.display().to_string();
    std::fs::create_dir_all(&data).expect("mkdir");
    std::fs::write(data.join("keep"), b"x").expect("write");
    let out = leaseholdd(&["restore", &good_arg, "--data-dir", &data_arg]);
    assert!(
        !out.status.success() && said(&out).contains("is not empty"),
        "{}",
        said(&out)
    );
    assert_eq!(std::fs::read_dir(&data).expect("dir").count(), 1);

    // A node id that is not among the peers.
    let empty = dir.path().join("empty").display().to_string();
    let out = leaseholdd(&[
        "restore",
        &good_arg,
        "--data-dir",
        &empty,
        "--node-id",
        "4",
        "--peers",
        "1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003",
    ]);
    assert!(
        !out.status.success() && said(&out).contains("not among the members"),
        "{}",
        said(&out)
    );

    // And the good one restores a single node.
    let out = leaseholdd(&["restore", &good_arg, "--data-dir", &empty]);
    assert!(out.status.success(), "{}", said(&out));
    let check = leaseholdd(&["check", "--data-dir", &empty]);
    assert!(check.status.success(), "{}", said(&check));
}
