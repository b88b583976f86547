//! Real processes for tests: `leaseholdd`, `redis-server`, `etcd`.
//!
//! Each runs on a free loopback port with its own temporary directory and is
//! killed when its handle drops, so a failing test leaves nothing behind.
//! Faults are real: [`Process::kill9`], [`Process::pause`] (SIGSTOP) and
//! [`Process::resume`] (SIGCONT), and [`FaultProxy`] between a client and
//! a server (a lost reply, one source's connections refused).

mod cluster;
pub mod pki;
mod proxy;

pub use cluster::{Cluster, ClusterNode};
pub use proxy::FaultProxy;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A port nobody listens on right now, below the kernel's range for the
/// local ports of outgoing connections.
///
/// A port the kernel hands out (bind to port 0) is in that range, so while
/// a test's server is down (a restart, or the moment between choosing the
/// port and the server's bind) any outgoing connection on the machine may
/// take it as its local port, and the server then fails to start with
/// "address in use". Ports below the range are taken only by listeners.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    // Where this process walks from: apart from another test process's.
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    const FLOOR: u32 = 10_000;
    let below = ephemeral_low().unwrap_or(32_768);
    if below > FLOOR + 1_000 {
        let span = below - FLOOR;
        let _ = NEXT.compare_exchange(
            u32::MAX,
            std::process::id().wrapping_mul(7_919) % span,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        for _ in 0..span {
            let port = FLOOR + NEXT.fetch_add(1, Ordering::Relaxed) % span;
            if let Ok(port) = u16::try_from(port) {
                if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                    return port;
                }
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral port")
}

/// The lowest local port the kernel gives outgoing connections.
fn ephemeral_low() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The path of a binary built from this workspace (`target/<profile>/NAME`),
/// from a test binary (in `target/<profile>/deps/`) or from another binary
/// beside it.
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let beside = exe.parent().map(|d| d.join(name));
    let path = match beside {
        Some(path) if path.exists() => path,
        _ => exe
            .parent()
            .and_then(Path::parent)
            .expect("target dir")
            .join(name),
    };
    assert!(
        path.exists(),
        "{} is not built; run the tests with `cargo test --workspace`",
        path.display()
    );
    path
}

/// A child process that is killed when dropped.
pub struct Process {
    child: Option<Child>,
    program: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    /// Whether it leads a process group of its own, killed with it.
    group: bool,
}

impl Process {
    /// Starts `program` with `args`, its output going to `log`.
    pub fn spawn(program: &Path, args: &[String], log: &Path) -> Process {
        Process::spawn_as(program, args, log, false)
    }

    /// Starts `program` as [`Process::spawn`] does, in a process group of
    /// its own: what it starts in turn (a browser under its driver) is
    /// killed with it, not left running.
    pub fn spawn_group(program: &Path, args: &[String], log: &Path) -> Process {
        Process::spawn_as(program, args, log, true)
    }

    fn spawn_as(program: &Path, args: &[String], log: &Path, group: bool) -> Process {
        let mut p = Process {
            child: None,
            program: program.to_path_buf(),
            args: args.to_vec(),
            log: log.to_path_buf(),
            group,
        };
        p.start();
        p
    }

    fn start(&mut self) {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open log");
        let err = out.try_clone().expect("clone log");
        let mut command = Command::new(&self.program);
        if self.group {
            use std::os::unix::process::CommandExt;
            command.process_group(0);
        }
        let child = command
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", self.program.display()));
        self.child = Some(child);
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn signal(&self, sig: i32) {
        if let Some(pid) = self.pid() {
            // SAFETY: kill(2) with a pid we spawned and still own.
            unsafe {
                libc::kill(pid as i32, sig);
            }
        }
    }

    /// SIGKILL, and reap it (with its process group, if it leads one).
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            if self.group {
                // SAFETY: kill(2) of the process group this child leads.
                unsafe {
                    libc::kill(-(child.id() as i32), libc::SIGKILL);
                }
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, and wait for it to exit (then SIGKILL to what is left of
    /// its process group, if it leads one).
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        self.signal(libc::SIGTERM);
        let mut child = self.child.take()?;
        let status = child.wait().ok();
        if self.group {
            // SAFETY: kill(2) of the process group this child led; its id is
            // still reserved while the group has members.
            unsafe {
                libc::kill(-(child.id() as i32), libc::SIGKILL);
            }
        }
        status
    }

    /// SIGSTOP: the process is frozen, as by a long GC pause or a stalled VM.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    /// Starts the same command again (after a kill).
    pub fn restart(&mut self) {
        self.kill9();
        self.start();
    }

    /// Waits up to `limit` for the process to exit by itself; its status,
    /// or `None` if it is still running (or was never started).
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        loop {
            let child = self.child.as_mut()?;
            match child.try_wait() {
                Ok(Some(status)) => {
                    self.child = None;
                    return Some(status);
                }
                Ok(None) if start.elapsed() < limit => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => return None,
            }
        }
    }

    /// What the process printed so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.resume();
        self.kill9();
    }
}

/// Sends a bare HTTP/1.1 GET and returns the body, if the server answered 200.
pub fn http_get(addr: &str, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    s.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}

/// Sends a bare HTTP/1.1 request with a JSON body (or none), and an access
/// token if given, and returns the status and the body; `None` if nothing
/// answered within 5 s.
pub fn http_call(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    token: Option<&str>,
) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let body = body.unwrap_or("");
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{auth}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut response = String::new();
    s.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// An unlabelled metric's value in OpenMetrics text; 0 if it is not there.
pub fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Waits until `ready` says yes, or panics after `limit`.
pub fn wait_until(limit: Duration, what: &str, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until a process just started says it is `ready`, or panics after
/// `limit` with the end of what it printed (why it did not start).
fn wait_for_start(
    process: &mut Process,
    limit: Duration,
    what: &str,
    mut ready: impl FnMut() -> bool,
) {
    let start = Instant::now();
    while !ready() {
        let why = if let Some(status) = process.wait_exit(Duration::ZERO) {
            format!("it exited ({status}) while waiting for {what}")
        } else if start.elapsed() >= limit {
            format!("timed out after {limit:?} waiting for {what}")
        } else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        let output = process.output();
        let lines: Vec<&str> = output.lines().collect();
        panic!(
            "{why}; the end of its log:\n{}",
            lines[lines.len().saturating_sub(30)..].join("\n")
        );
    }
}

/// A `leaseholdd` process on a free port with a temporary data directory.
pub struct Leaseholdd {
    /// The process.
    pub process: Process,
    /// `127.0.0.1:PORT`, serving gRPC and HTTP.
    pub addr: String,
    dir: tempfile::TempDir,
}

impl Leaseholdd {
    /// Starts one and waits until it leads.
    pub fn start() -> Leaseholdd {
        Self::start_with(&[])
    }

    /// Starts one with extra flags and waits until it leads.
    ///
    /// The free port is found by binding and closing it, so something else
    /// (another test's server, say) may take it before this server binds
    /// it: a server that exits because its address is in use is started
    /// again on another port.
    pub fn start_with(extra: &[&str]) -> Leaseholdd {
        let start = Instant::now();
        loop {
            let mut server = Self::spawn_with(extra);
            loop {
                if http_get(&server.addr, "/health").is_some_and(|b| b.contains("\"leader\":true"))
                {
                    return server;
                }
                if let Some(status) = server.process.wait_exit(Duration::ZERO) {
                    let output = server.process.output();
                    assert!(
                        output.contains("in use"),
                        "leaseholdd exited ({status}) before it led:\n{output}"
                    );
                    break;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "timed out after 20s waiting for leaseholdd to lead:\n{}",
                    server.process.output()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Starts one with extra flags, without waiting (for a server that
    /// does not answer plain HTTP, such as one with TLS).
    pub fn spawn_with(extra: &[&str]) -> Leaseholdd {
        Self::spawn_in(tempfile::tempdir().expect("tempdir"), extra)
    }

    /// Starts one on a copy of the data dir `from` and waits until it leads.
    pub fn start_from(from: &Path, extra: &[&str]) -> Leaseholdd {
        let dir = tempfile::tempdir().expect("tempdir");
        copy_dir(from, &dir.path().join("data"));
        let server = Self::spawn_in(dir, extra);
        server.wait_ready();
        server
    }

    /// Starts one on the data dir `dir/data`, logging to `dir`.
    fn spawn_in(dir: tempfile::TempDir, extra: &[&str]) -> Leaseholdd {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut args = vec![
            "--listen".to_string(),
            addr.clone(),
            "--data-dir".to_string(),
            dir.path().join("data").display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let process = Process::spawn(
            &workspace_bin("leaseholdd"),
            &args,
            &dir.path().join("leaseholdd.log"),
        );
        Leaseholdd { process, addr, dir }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Waits until the server answers and leads.
    pub fn wait_ready(&self) {
        wait_until(Duration::from_secs(20), "leaseholdd to lead", || {
            http_get(&self.addr, "/health").is_some_and(|b| b.contains("\"leader\":true"))
        });
    }

    /// `kill -9`, start again on the same port and data, and wait until it leads.
    pub fn crash_and_restart(&mut self) {
        self.process.restart();
        self.wait_ready();
    }
}

/// Copies the directory `from` to `to`, files and folders alike.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the copy's folder");
    for entry in std::fs::read_dir(from).expect("read the folder to copy") {
        let entry = entry.expect("read a folder entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy a file");
        }
    }
}

/// Whether something accepts TCP connections at `addr`.
pub fn listening(addr: &str) -> bool {
    TcpStream::connect(addr).is_ok()
}

/// A `redis-server` of our own, without persistence, on a free port.
pub struct RedisServer {
    /// The process.
    pub process: Process,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    _dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts one and waits until it answers.
    pub fn start() -> RedisServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut process = Process::spawn(
            Path::new("redis-server"),
            &args,
            &dir.path().join("redis.log"),
        );
        let addr = format!("127.0.0.1:{port}");
        wait_for_start(
            &mut process,
            Duration::from_secs(10),
            "redis-server to listen",
            || listening(&addr),
        );
        RedisServer {
            process,
            addr,
            _dir: dir,
        }
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }
}

/// An `etcd` of our own, with a temporary data directory, on free ports.
pub struct EtcdServer {
    /// The process.
    pub process: Process,
    /// `127.0.0.1:PORT` for clients.
    pub addr: String,
    _dir: tempfile::TempDir,
}

impl EtcdServer {
    /// Starts one and waits until it answers.
    pub fn start() -> EtcdServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let (client, peer) = (free_port(), free_port());
        let addr = format!("127.0.0.1:{client}");
        let args: Vec<String> = vec![
            "--name".into(),
            "test".into(),
            "--data-dir".into(),
            dir.path().join("data").display().to_string(),
            "--listen-client-urls".into(),
            format!("http://{addr}"),
            "--advertise-client-urls".into(),
            format!("http://{addr}"),
            "--listen-peer-urls".into(),
            format!("http://127.0.0.1:{peer}"),
            "--initial-advertise-peer-urls".into(),
            format!("http://127.0.0.1:{peer}"),
            "--initial-cluster".into(),
            format!("test=http://127.0.0.1:{peer}"),
        ];
        let mut process = Process::spawn(Path::new("etcd"), &args, &dir.path().join("etcd.log"));
        wait_for_start(
            &mut process,
            Duration::from_secs(30),
            "etcd to answer",
            || http_get(&addr, "/health").is_some_and(|b| b.contains("true")),
        );
        EtcdServer {
            process,
            addr,
            _dir: dir,
        }
    }

    /// `etcd://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_that_exits_before_it_is_ready_is_reported_at_once_with_its_log() {
        let dir = tempfile::tempdir().expect("temp dir");
        let args = vec!["-c".to_string(), "echo cannot bind; exit 3".to_string()];
        let mut process = Process::spawn(Path::new("sh"), &args, &dir.path().join("sh.log"));
        let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_for_start(
                &mut process,
                Duration::from_secs(600),
                "it to listen",
                || false,
            )
        }));
        let panic = waited.expect_err("a process that exited is never ready");
        let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(message.contains("exited"), "{message}");
        assert!(message.contains("cannot bind"), "{message}");
    }
}
