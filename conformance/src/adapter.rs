//! The clients under test: how each one's adapter is built and started,
//! and one running adapter process, spoken to in JSON lines.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// A client under test: the command that starts its adapter.
#[derive(Debug, Clone)]
pub struct Lang {
    /// `rust`, `python`, `go` or `typescript`.
    pub name: String,
    program: PathBuf,
    args: Vec<String>,
}

/// The repository's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

fn run(what: &str, cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("{what}: cannot run it: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{what}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

impl Lang {
    /// The Rust client's adapter, a binary of this crate.
    pub fn rust(adapter: &Path) -> Lang {
        Lang {
            name: "rust".into(),
            program: adapter.to_path_buf(),
            args: Vec::new(),
        }
    }

    /// The Python client's adapter, run from the source tree by the
    /// virtualenv `scripts/prepare-clients` makes (or `$LEASEHOLD_PYTHON`).
    pub fn python() -> Result<Lang, String> {
        let python = std::env::var_os("LEASEHOLD_PYTHON")
            .map(PathBuf::from)
            .unwrap_or_else(|| root().join("target/python-venv/bin/python"));
        run(
            "the Python client's dependencies (run scripts/prepare-clients)",
            Command::new(&python).args(["-c", "import httpx"]),
        )?;
        Ok(Lang {
            name: "python".into(),
            program: python,
            args: vec![path_arg(
                &root().join("conformance/adapters/python/adapter.py"),
            )],
        })
    }

    /// The Go client's adapter, built into `dir` with the standard library
    /// only (nothing is downloaded).
    pub fn go(dir: &Path) -> Result<Lang, String> {
        let program = dir.join("leasehold-conformance-go");
        run(
            "go build of the Go adapter (is golang-go installed? scripts/prepare-clients installs it)",
            Command::new("go")
                .args(["build", "-o"])
                .arg(&program)
                .arg(".")
                .current_dir(root().join("conformance/adapters/go"))
                .env("GOFLAGS", "-mod=mod")
                .env("GOPROXY", "off"),
        )?;
        Ok(Lang {
            name: "go".into(),
            program,
            args: Vec::new(),
        })
    }

    /// The TypeScript client's adapter, on the client built here (its dev
    /// dependencies from `npm ci`, which scripts/prepare-clients runs).
    pub fn typescript() -> Result<Lang, String> {
        let client = root().join("clients/typescript");
        run(
            "tsc of the TypeScript client (run scripts/prepare-clients for its dev dependencies)",
            Command::new(client.join("node_modules/.bin/tsc"))
                .args(["-p", "."])
                .current_dir(&client),
        )?;
        Ok(Lang {
            name: "typescript".into(),
            program: PathBuf::from("node"),
            args: vec![path_arg(
                &root().join("conformance/adapters/typescript/adapter.mjs"),
            )],
        })
    }
}

fn path_arg(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

#[derive(Default)]
struct Replies {
    by_id: HashMap<u64, Value>,
    closed: bool,
}

/// One running adapter: one client, named `name`.
pub struct Adapter {
    pub name: String,
    child: Child,
    stdin: ChildStdin,
    replies: Arc<(Mutex<Replies>, Condvar)>,
    next_id: u64,
    stderr: PathBuf,
}

impl Adapter {
    /// Starts `lang`'s adapter for client `name`, on `endpoints`, with
    /// `planted` (a bug's name) planted if given.
    pub fn start(
        lang: &Lang,
        name: &str,
        endpoints: &str,
        token: Option<&str>,
        planted: Option<&str>,
        dir: &Path,
    ) -> Result<Adapter, String> {
        let stderr = dir.join(format!("{}-{name}.log", lang.name));
        let log = std::fs::File::create(&stderr).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&lang.program);
        cmd.args(&lang.args)
            .env("LEASEHOLD_ENDPOINT", endpoints)
            .env("LEASEHOLD_HOLDER", name)
            .env_remove("LEASEHOLD_PLANTED_BUG")
            .env_remove("LEASEHOLD_TOKEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log);
        if let Some(bug) = planted {
            cmd.env("LEASEHOLD_PLANTED_BUG", bug);
        }
        if let Some(token) = token {
            cmd.env("LEASEHOLD_TOKEN", token);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("start the {} adapter {:?}: {e}", lang.name, lang.program))?;
        let stdin = child.stdin.take().ok_or("the adapter's stdin")?;
        let stdout = child.stdout.take().ok_or("the adapter's stdout")?;
        let replies = Arc::new((Mutex::new(Replies::default()), Condvar::new()));
        let theirs = replies.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                if let Some(id) = v.get("id").and_then(Value::as_u64) {
                    let (lock, cv) = &*theirs;
                    if let Ok(mut r) = lock.lock() {
                        r.by_id.insert(id, v);
                    }
                    cv.notify_all();
                }
            }
            let (lock, cv) = &*theirs;
            if let Ok(mut r) = lock.lock() {
                r.closed = true;
            }
            cv.notify_all();
        });
        Ok(Adapter {
            name: name.to_string(),
            child,
            stdin,
            replies,
            next_id: 1,
            stderr,
        })
    }

    /// Sends a command; its id, to wait for the answer with.
    pub fn send(&mut self, op: &str, args: Value, handle: Option<&str>) -> Result<u64, String> {
        let id = self.next_id;
        self.next_id += 1;
        let mut cmd = json!({"id": id, "op": op, "args": args});
        if let Some(h) = handle {
            cmd["as"] = json!(h);
        }
        writeln!(self.stdin, "{cmd}")
            .and_then(|_| self.stdin.flush())
            .map_err(|e| {
                format!(
                    "client {}: the adapter is gone ({e}){}",
                    self.name,
                    self.tail()
                )
            })?;
        Ok(id)
    }

    /// The answer to command `id`: `Ok(value)` or `Err(error object)`;
    /// a harness error if none came within `limit`.
    pub fn wait(&self, id: u64, limit: Duration) -> Result<Result<Value, Value>, String> {
        let until = Instant::now() + limit;
        let (lock, cv) = &*self.replies;
        let mut r = lock.lock().map_err(|_| "poisoned")?;
        loop {
            if let Some(v) = r.by_id.remove(&id) {
                if let Some(e) = v.get("error") {
                    return Ok(Err(e.clone()));
                }
                return Ok(Ok(v.get("ok").cloned().unwrap_or(Value::Null)));
            }
            if r.closed {
                drop(r);
                return Err(format!(
                    "client {}: the adapter exited{}",
                    self.name,
                    self.tail()
                ));
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                drop(r);
                return Err(format!(
                    "client {}: no answer to command {id} within {limit:?}{}",
                    self.name,
                    self.tail()
                ));
            }
            r = cv.wait_timeout(r, left).map_err(|_| "poisoned")?.0;
        }
    }

    /// The end of what the adapter printed on stderr.
    pub fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        if lines.is_empty() {
            return String::new();
        }
        format!(
            "; its stderr ends:\n{}",
            lines[lines.len().saturating_sub(15)..].join("\n")
        )
    }
}

impl Drop for Adapter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
