//! `deploy/`: the systemd unit verifies, and leaseholdd tells systemd it is
//! ready only once it answers, and when it stops.

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::{Duration, Instant};

use leasehold_testkit::{free_port, http_get, workspace_bin};

fn deploy_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

#[test]
fn the_systemd_unit_verifies_without_a_warning() {
    let Ok(version) = std::process::Command::new("systemd-analyze")
        .arg("--version")
        .output()
    else {
        eprintln!("systemd-analyze is not installed: the unit is not verified here");
        return;
    };
    assert!(version.status.success());
    let unit = std::fs::read_to_string(deploy_dir().join("leaseholdd.service")).expect("unit");
    assert!(
        unit.contains("ExecStart=/usr/local/bin/leaseholdd "),
        "{unit}"
    );
    // Verified against the binary just built, where the unit would find it.
    let dir = tempfile::tempdir().expect("tempdir");
    let here = unit.replace(
        "/usr/local/bin/leaseholdd",
        &workspace_bin("leaseholdd").display().to_string(),
    );
    let path = dir.path().join("leaseholdd.service");
    std::fs::write(&path, here).expect("write unit");
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("run systemd-analyze verify");
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.trim().is_empty(), "{said}");
}

#[test]
fn the_example_settings_are_read_by_leaseholdd() {
    let out = std::process::Command::new(workspace_bin("leaseholdd"))
        .arg("--config")
        .arg(deploy_dir().join("leaseholdd.toml"))
        .arg("--print-config")
        .output()
        .expect("run leaseholdd --print-config");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("/var/lib/leasehold/data"), "{said}");
}

/// The next notification within `limit`.
fn next_notification(socket: &UnixDatagram, limit: Duration) -> String {
    socket
        .set_read_timeout(Some(limit))
        .expect("set a read timeout");
    let mut buf = [0u8; 4096];
    let n = socket.recv(&mut buf).expect("a notification in time");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn ready_comes_once_the_node_answers_and_stopping_when_it_stops() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket_path = dir.path().join("notify");
    let socket = UnixDatagram::bind(&socket_path).expect("bind the notify socket");
    let addr = format!("127.0.0.1:{}", free_port());
    let mut child = std::process::Command::new(workspace_bin("leaseholdd"))
        .args(["--listen", &addr, "--data-dir"])
        .arg(dir.path().join("data"))
        .env("NOTIFY_SOCKET", &socket_path)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start leaseholdd");
    let started = Instant::now();
    let ready = next_notification(&socket, Duration::from_secs(20));
    assert!(ready.contains("READY=1"), "{ready:?}");
    // Ready means served: the first call made on hearing it is answered.
    let health = http_get(&addr, "/health");
    assert!(
        health.is_some(),
        "READY=1 after {:?}, but /health does not answer",
        started.elapsed()
    );

    // SIGTERM: STOPPING=1, then a clean exit.
    let pid = i32::try_from(child.id()).expect("pid");
    // SAFETY: kill only reads its arguments; the pid is our child's.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let stopping = next_notification(&socket, Duration::from_secs(20));
    assert!(stopping.contains("STOPPING=1"), "{stopping:?}");
    let status = child.wait().expect("wait for leaseholdd");
    assert!(status.success(), "{status}");
}
