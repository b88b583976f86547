//! A data dir written by an earlier release opens under this build with
//! everything in it.
//!
//! `tests/fixtures/data-dir-VERSION/data` was written by that release (see
//! RELEASES.md) with [`write_the_fixture`]: auth on with a scoped role,
//! exclusive, shared, semaphore and lock-set holds, a checkpoint, a queued
//! waiter, then a snapshot, more writes after it, and `kill -9`. What it holds
//! is in `expected.json` beside it. The log segments are committed without
//! their preallocated zeros, which a reader treats as the end of the records
//! either way (and 0.2.0's without a record torn by the `kill -9`).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::call;
use leasehold_testkit::{wait_until, Leaseholdd};
use serde_json::{json, Value};

/// The fixture folder of `release`.
fn fixture(release: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(format!("data-dir-{release}"))
}

/// A call that must succeed: its answer.
async fn ok(method: &str, addr: &str, path: &str, token: &str, body: Option<Value>) -> Value {
    let (status, answer) = call(method, addr, path, Some(token), body).await;
    assert_eq!(status, 200, "{method} {path}: {answer}");
    answer
}

/// Grants a lease of a day to `holder`: its id.
async fn lease(addr: &str, token: &str, holder: &str) -> u64 {
    let body = json!({ "ttl_ms": 86_400_000, "holder": holder });
    ok("POST", addr, "/v1/leases", token, Some(body)).await["lease"]
        .as_u64()
        .expect("lease id")
}

/// Acquires with `body` (a lease and a key or keys): the fence.
async fn acquire(addr: &str, token: &str, body: Value) -> u64 {
    ok("POST", addr, "/v1/acquire", token, Some(body)).await["fence"]
        .as_u64()
        .expect("fence")
}

/// Writes the fixture into `$LEASEHOLD_FIXTURE_OUT` (a new folder) with the
/// build at hand. Run once per release whose format a later build must read:
/// `LEASEHOLD_FIXTURE_OUT=crates/leasehold-server/tests/fixtures/data-dir-X.Y.Z
/// cargo test -p leasehold-server --test data_dir_format -- --ignored`.
#[tokio::test]
#[ignore = "writes a fixture; run by hand for a release"]
async fn write_the_fixture() {
    let out = PathBuf::from(std::env::var("LEASEHOLD_FIXTURE_OUT").expect("LEASEHOLD_FIXTURE_OUT"));
    let mut server = Leaseholdd::start_with(&["--snapshot-every", "20"]);
    let addr = server.addr.clone();
    let a = addr.as_str();

    let (status, enabled) = call("POST", a, "/v1/auth/enable", None, None).await;
    assert_eq!(status, 200, "{enabled}");
    let root = enabled["token"].as_str().expect("root token").to_string();
    let rules = json!({ "rules": [{ "prefix": "jobs/", "permission": "lock" }] });
    ok("PUT", a, "/v1/auth/roles/jobs", &root, Some(rules)).await;
    let made = json!({ "name": "jobs", "role": "jobs" });
    let jobs = ok("POST", a, "/v1/auth/tokens", &root, Some(made)).await["token"]
        .as_str()
        .expect("jobs token")
        .to_string();

    let owner = lease(a, &root, "host-a").await;
    let orders = acquire(a, &root, json!({ "key": "orders/1", "lease": owner })).await;
    let saved = json!({ "key": "orders/1", "fence": orders, "data": "item 40" });
    ok("POST", a, "/v1/checkpoint", &root, Some(saved)).await;
    let mut readers = Vec::new();
    for holder in ["reader-1", "reader-2"] {
        let l = lease(a, &root, holder).await;
        let body = json!({ "key": "config", "lease": l, "mode": "shared" });
        readers.push((l, acquire(a, &root, body).await));
    }
    let mut permits = Vec::new();
    for holder in ["worker-1", "worker-2"] {
        let l = lease(a, &root, holder).await;
        let body = json!({ "key": "pool", "lease": l, "mode": "permit", "permits": 3 });
        permits.push((l, acquire(a, &root, body).await));
    }
    let mover = lease(a, &root, "mover").await;
    let body = json!({ "keys": ["acct/42", "acct/17"], "lease": mover });
    let set = acquire(a, &root, body).await;
    let nightly = acquire(
        a,
        &jobs,
        json!({ "key": "jobs/nightly", "ttl_ms": 86_400_000, "holder": "cron" }),
    )
    .await;
    // Enough churn for a snapshot; each fence is spent, the last is the highest.
    let churn = lease(a, &root, "churn").await;
    let mut highest = 0;
    for i in 0..30 {
        let key = format!("churn/{i}");
        let fence = acquire(a, &root, json!({ "key": key, "lease": churn })).await;
        let release = json!({ "key": key, "fence": fence });
        ok("POST", a, "/v1/release", &root, Some(release)).await;
        highest = fence;
    }
    let snapshot = server.data_dir().join("snapshot");
    wait_until(Duration::from_secs(20), "a snapshot", || snapshot.exists());

    // After the snapshot, only in the log: a hold and a waiter.
    let late = acquire(a, &root, json!({ "key": "after-snapshot", "lease": owner })).await;
    let waiter = lease(a, &root, "host-w").await;
    let (wait_addr, wait_root) = (addr.clone(), root.clone());
    let waiting = tokio::spawn(async move {
        let body = json!({ "key": "orders/1", "lease": waiter, "wait_ms": 3_600_000 });
        call(
            "POST",
            &wait_addr,
            "/v1/acquire",
            Some(&wait_root),
            Some(body),
        )
        .await
    });
    let queued = |info: &Value| info["waiters"][0]["lease"].as_u64() == Some(waiter);
    for _ in 0..200 {
        if queued(&ok("GET", a, "/v1/locks/orders/1", &root, None).await) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(queued(
        &ok("GET", a, "/v1/locks/orders/1", &root, None).await
    ));
    server.process.kill9();
    waiting.abort();

    let expected = json!({
        "root_token": root,
        "jobs_token": jobs,
        "owner": owner, "orders_fence": orders,
        "readers": readers, "permits": permits,
        "mover": mover, "set_fence": set,
        "nightly_fence": nightly,
        "highest_fence": highest.max(late),
        "late_fence": late,
        "waiter": waiter,
    });
    let data = out.join("data");
    leasehold_testkit::copy_dir(&server.data_dir(), &data);
    strip_preallocated_zeros(&data.join("log"));
    let text = serde_json::to_string_pretty(&expected).expect("json");
    std::fs::write(out.join("expected.json"), text + "\n").expect("write expected.json");
}

/// Cuts every log segment in `dir` after its last whole record (the
/// preallocated zeros, and a record a `kill -9` left torn, which a reader
/// cuts too).
fn strip_preallocated_zeros(dir: &Path) {
    for entry in std::fs::read_dir(dir).expect("log folder") {
        let path = entry.expect("entry").path();
        let bytes = std::fs::read(&path).expect("segment");
        let mut end = 0;
        while let Some(head) = bytes.get(end..end + 8) {
            let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
            let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
            match bytes.get(end + 8..end + 8 + len) {
                Some(payload) if len > 0 && crc32fast::hash(payload) == crc => end += 8 + len,
                _ => break,
            }
        }
        std::fs::write(&path, &bytes[..end]).expect("write segment");
    }
}

/// The fences of every holder of `info`, by lease.
fn holders(info: &Value) -> Vec<(u64, u64)> {
    info["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .map(|h| {
            (
                h["lease"].as_u64().unwrap_or(0),
                h["fence"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

/// Pairs `[[lease, fence], ...]` as written in `expected.json`.
fn pairs(v: &Value) -> Vec<(u64, u64)> {
    v.as_array()
        .expect("pairs")
        .iter()
        .map(|p| (p[0].as_u64().expect("lease"), p[1].as_u64().expect("fence")))
        .collect()
}

#[tokio::test]
async fn a_data_dir_of_release_0_1_0_opens_with_every_lock_lease_wait_and_token() {
    opens_with_everything_in_it("0.1.0").await;
}

#[tokio::test]
async fn a_data_dir_of_release_0_2_0_opens_with_every_lock_lease_wait_and_token() {
    opens_with_everything_in_it("0.2.0").await;
}

/// Opens the fixture data dir of `release` and checks every item in it.
async fn opens_with_everything_in_it(release: &str) {
    let dir = fixture(release);
    let text = std::fs::read_to_string(dir.join("expected.json")).expect("expected.json");
    let want: Value = serde_json::from_str(&text).expect("expected.json is JSON");
    let server = Leaseholdd::start_from(&dir.join("data"), &[]);
    let a = server.addr.as_str();
    let root = want["root_token"].as_str().expect("root token");
    let jobs = want["jobs_token"].as_str().expect("jobs token");
    let n = |k: &str| want[k].as_u64().expect(k);

    // Auth: still on, the scoped token still scoped.
    let (status, _) = call("GET", a, "/v1/locks", None, None).await;
    assert_eq!(status, 401, "auth is off after the upgrade");
    let (status, _) = call("GET", a, "/v1/locks/orders/1", Some(jobs), None).await;
    assert_eq!(status, 403, "the jobs token sees outside jobs/");
    let nightly = ok("GET", a, "/v1/locks/jobs/nightly", jobs, None).await;
    assert_eq!(holders(&nightly)[0].1, n("nightly_fence"));
    assert_eq!(nightly["holder"]["holder"], "cron");

    // The exclusive hold, its checkpoint and its queued waiter.
    let orders = ok("GET", a, "/v1/locks/orders/1", root, None).await;
    assert_eq!(holders(&orders), vec![(n("owner"), n("orders_fence"))]);
    assert_eq!(orders["checkpoint_base64"], "aXRlbSA0MA==");
    assert_eq!(orders["checkpoint_fence"], n("orders_fence"));
    assert_eq!(orders["waiters"][0]["lease"], n("waiter"), "{orders}");

    // Shared holds, semaphore permits and a lock set.
    let config = ok("GET", a, "/v1/locks/config", root, None).await;
    assert_eq!(holders(&config), pairs(&want["readers"]));
    assert_eq!(config["holder"]["mode"], "shared");
    let pool = ok("GET", a, "/v1/locks/pool", root, None).await;
    assert_eq!(holders(&pool), pairs(&want["permits"]));
    assert_eq!(pool["permits"], 3);
    for key in ["acct/17", "acct/42"] {
        let info = ok("GET", a, &format!("/v1/locks/{key}"), root, None).await;
        assert_eq!(holders(&info), vec![(n("mover"), n("set_fence"))]);
    }
    // Written after the snapshot, so read back from the log.
    let late = ok("GET", a, "/v1/locks/after-snapshot", root, None).await;
    assert_eq!(holders(&late), vec![(n("owner"), n("late_fence"))]);

    // Every lease, with its holder name and keys.
    let owner = ok("GET", a, &format!("/v1/leases/{}", n("owner")), root, None).await;
    assert_eq!(owner["holder"], "host-a");
    assert_eq!(owner["keys"], json!(["after-snapshot", "orders/1"]));
    let waiter = ok("GET", a, &format!("/v1/leases/{}", n("waiter")), root, None).await;
    assert_eq!(waiter["waiting_for"], json!(["orders/1"]));

    // Released keys are gone, and the next fence is above every fence granted.
    let churn = ok("GET", a, "/v1/locks?prefix=churn/&held=true", root, None).await;
    assert_eq!(churn["locks"], json!([]));
    let body = json!({ "key": "after-upgrade", "ttl_ms": 10_000 });
    let next = acquire(a, root, body).await;
    assert!(
        next > n("highest_fence"),
        "fence {next} after the upgrade is not above {}",
        n("highest_fence")
    );

    // Marked with this build's data dir format (0.1.0 wrote no mark).
    let mark = std::fs::read_to_string(server.data_dir().join("format")).expect("format file");
    assert!(mark.starts_with("format 1\n"), "{mark}");
}

#[test]
fn a_data_dir_of_a_newer_format_is_refused_at_start_and_left_as_it_is() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("log")).expect("mkdir");
    let mark = "format 99\nwritten-by 9.9.0\n";
    std::fs::write(data.join("format"), mark).expect("write format");
    let out = std::process::Command::new(leasehold_testkit::workspace_bin("leaseholdd"))
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .output()
        .expect("run leaseholdd");
    assert!(!out.status.success(), "a newer data dir was opened");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("data dir format 99")
            && stderr.contains("9.9.0")
            && stderr.contains("reads formats up to 1"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(data.join("format")).expect("format"),
        mark
    );
    assert_eq!(std::fs::read_dir(data.join("log")).expect("log").count(), 0);
}
