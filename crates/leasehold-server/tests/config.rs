//! `leaseholdd --config FILE` and `--print-config`.

use std::process::{Command, Stdio};
use std::time::Duration;

use leasehold_testkit::{free_port, http_get, wait_until, workspace_bin};

fn leaseholdd(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(workspace_bin("leaseholdd"))
        .args(args)
        .env_remove("LEASEHOLD_LISTEN")
        .env_remove("LEASEHOLD_DATA_DIR")
        .env_remove("LEASEHOLD_CONFIG")
        .output()
        .expect("run leaseholdd");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn flags_override_the_file_and_print_config_round_trips() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("leasehold.toml");
    std::fs::write(
        &file,
        "listen = \"127.0.0.1:7600\"\nheartbeat = \"20ms\"\nsnapshot_every = 500\n[peers]\n1 = \"127.0.0.1:7600\"\n2 = \"127.0.0.1:7601\"\n",
    )
    .expect("write");
    let path = file.display().to_string();
    let (ok, printed, err) = leaseholdd(&[
        "--config",
        &path,
        "--node-id",
        "1",
        "--heartbeat",
        "30ms",
        "--print-config",
    ]);
    assert!(ok, "{err}");
    for line in [
        "listen = \"127.0.0.1:7600\"",
        "heartbeat = \"30ms\"",
        "snapshot-every = 500",
        "node-id = 1",
        "peers = \"1=127.0.0.1:7600,2=127.0.0.1:7601\"",
        "insecure = false",
    ] {
        assert!(printed.lines().any(|l| l == line), "{line:?} in\n{printed}");
    }
    // What it prints is a config file that means the same.
    let again = dir.path().join("printed.toml");
    std::fs::write(&again, &printed).expect("write");
    let (ok, reprinted, err) =
        leaseholdd(&["--config", &again.display().to_string(), "--print-config"]);
    assert!(ok, "{err}");
    assert_eq!(reprinted, printed);
}

#[test]
fn a_bad_file_is_refused_with_what_is_wrong() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("bad.toml");
    for (text, says) in [
        ("lisen = \"127.0.0.1:1\"", "unknown setting \"lisen\""),
        ("insecure = \"yes\"", "true or false"),
        ("listen = ", "config file"),
        ("threads = 0", "threads"),
    ] {
        std::fs::write(&file, text).expect("write");
        let (ok, _, err) = leaseholdd(&["--config", &file.display().to_string(), "--print-config"]);
        assert!(!ok, "{text:?} was accepted");
        assert!(err.contains(says), "{text:?}: {err}");
    }
    let (ok, _, err) = leaseholdd(&["--config", "/nonexistent/leasehold.toml"]);
    assert!(!ok);
    assert!(err.contains("read config file"), "{err}");
}

#[test]
fn a_server_runs_from_its_config_file_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let addr = format!("127.0.0.1:{}", free_port());
    let file = dir.path().join("leasehold.toml");
    std::fs::write(
        &file,
        format!(
            "listen = \"{addr}\"\ndata-dir = \"{}\"\n",
            dir.path().join("data").display()
        ),
    )
    .expect("write");
    let mut child = Command::new(workspace_bin("leaseholdd"))
        .arg("--config")
        .arg(&file)
        .env_remove("LEASEHOLD_LISTEN")
        .env_remove("LEASEHOLD_DATA_DIR")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    wait_until(Duration::from_secs(20), "leaseholdd to serve", || {
        http_get(&addr, "/health").is_some()
    });
    let _ = child.kill();
    let _ = child.wait();
    assert!(dir.path().join("data").exists());
}
