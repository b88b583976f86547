//! `leasehold demo fencing`: the classic paused-holder scenario, run for real,
//! once without a fence gate and once with one.
//!
//! Everything runs locally: an embedded leaseholdd, an embedded HTTP account
//! service, and worker A as a real child process that is frozen with SIGSTOP.
//! Nothing is scripted to an outcome; what is printed is what the gate and the
//! timing did. The embedded leaseholdd comes with the `embedded-server`
//! feature (on by default); a build without it says how to get it.

use parking_lot::Mutex;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use leasehold::{Client, LockOptions};
use leasehold_fence::http::{FenceLayer, FENCING_TOKEN};
use leasehold_fence::MemoryGate;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};

const TTL: Duration = Duration::from_secs(1);
const START: i64 = 100;
const A_DEPOSIT: i64 = 50;
const B_DEPOSIT: i64 = 30;

type Balance = Arc<Mutex<i64>>;

fn lock(b: &Balance) -> parking_lot::MutexGuard<'_, i64> {
    b.lock()
}

/// The account service: `/plain/account` has no gate, `/fenced/account` is
/// behind a fence gate. Each has its own balance.
fn account_service(plain: Balance, fenced: Balance) -> Router {
    fn account(balance: Balance) -> Router {
        Router::new()
            .route(
                "/account",
                get(
                    |State(b): State<Balance>| async move { Json(json!({ "balance": *lock(&b) })) },
                )
                .put(
                    |State(b): State<Balance>, Json(body): Json<Value>| async move {
                        let new = body["balance"].as_i64().unwrap_or(0);
                        *lock(&b) = new;
                        Json(json!({ "balance": new }))
                    },
                ),
            )
            .with_state(balance)
    }
    Router::new().nest("/plain", account(plain)).nest(
        "/fenced",
        account(fenced).layer(FenceLayer::new(Arc::new(MemoryGate::new()))),
    )
}

struct Outcome {
    a_fence: u64,
    a_result: String,
    b_fence: u64,
    b_result: String,
    balance: i64,
}

pub async fn fencing() -> anyhow::Result<i32> {
    let server = embedded::Leaseholdd::start().await?;
    let endpoint = server.endpoint().to_string();

    let (plain, fenced) = (Balance::default(), Balance::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("bind the account service")?;
    let service = format!("http://{}", listener.local_addr()?);
    let app = account_service(plain.clone(), fenced.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let b = wait_for_client(&endpoint).await?;
    println!("The scenario: worker A takes the lock, reads the balance ({START}) and checks its lease, then");
    println!("freezes (a real SIGSTOP, like a long GC pause) before writing +{A_DEPOSIT}. Its {}s lease expires.", TTL.as_secs());
    println!("Worker B takes the lock with a higher token, reads and writes +{B_DEPOSIT}. Then A wakes and writes.");
    println!(
        "Correct result: {} (B's deposit kept; A told its write failed and free to retry).\n",
        START + B_DEPOSIT
    );

    let without = scenario(
        &endpoint,
        &b,
        &format!("{service}/plain/account"),
        &plain,
        "demo/plain",
    )
    .await?;
    let with = scenario(
        &endpoint,
        &b,
        &format!("{service}/fenced/account"),
        &fenced,
        "demo/fenced",
    )
    .await?;

    let row = |label: &str, l: String, r: String| println!("{label:<16}{l:<38}{r}");
    row(
        "",
        "without a fence gate".into(),
        "with a fence gate".into(),
    );
    row(
        "A",
        format!("fence {}: {}", without.a_fence, without.a_result),
        format!("fence {}: {}", with.a_fence, with.a_result),
    );
    row(
        "B",
        format!("fence {}: {}", without.b_fence, without.b_result),
        format!("fence {}: {}", with.b_fence, with.b_result),
    );
    row(
        "final balance",
        without.balance.to_string(),
        with.balance.to_string(),
    );
    let verdict = |o: &Outcome| {
        if o.balance == START + B_DEPOSIT {
            "correct".to_string()
        } else {
            format!("CORRUPT: B's +{B_DEPOSIT} was overwritten")
        }
    };
    row("", verdict(&without), verdict(&with));

    server.stop().await;
    Ok(0)
}

/// leaseholdd inside this process, on a free port with a throwaway data dir.
#[cfg(feature = "embedded-server")]
mod embedded {
    use anyhow::Context;

    /// A running leaseholdd; stopped by [`Leaseholdd::stop`], or with the process.
    pub struct Leaseholdd {
        endpoint: String,
        stop: tokio::sync::oneshot::Sender<()>,
        server: tokio::task::JoinHandle<anyhow::Result<()>>,
        /// Removed when dropped, after the server stopped.
        _data: tempfile::TempDir,
    }

    impl Leaseholdd {
        /// Starts one: a single node, without auth or TLS, that answers
        /// once it has elected itself (`wait_for_client` waits for that).
        pub async fn start() -> anyhow::Result<Leaseholdd> {
            let data = tempfile::tempdir().context("make a temporary data dir")?;
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .context("bind leaseholdd")?;
            let endpoint = format!("http://{}", listener.local_addr()?);
            let config = leasehold_server::server::Config {
                data_dir: data.path().to_path_buf(),
                raft: Default::default(),
                limits: Default::default(),
                cluster: None,
                tls: None,
                require_auth: false,
                quotas: Default::default(),
            };
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let server = tokio::spawn(leasehold_server::server::run(
                config,
                listener,
                async move {
                    let _ = stopped.await;
                },
            ));
            Ok(Leaseholdd {
                endpoint,
                stop,
                server,
                _data: data,
            })
        }

        /// `http://127.0.0.1:PORT`.
        pub fn endpoint(&self) -> &str {
            &self.endpoint
        }

        /// Stops it, waits until it has, and removes its data dir.
        pub async fn stop(self) {
            let _ = self.stop.send(());
            let _ = self.server.await;
        }
    }
}

/// A build without the `embedded-server` feature has no leaseholdd to
/// embed: starting one fails with how to get it, so none is ever made.
#[cfg(not(feature = "embedded-server"))]
mod embedded {
    /// Never made: there is no embedded leaseholdd in this build.
    pub enum Leaseholdd {}

    impl Leaseholdd {
        /// Fails, saying how to build a leasehold that has one.
        pub async fn start() -> anyhow::Result<Leaseholdd> {
            anyhow::bail!(
                "this leasehold was built without the embedded leaseholdd the demo runs: build it with `cargo build -p leasehold-cli --features embedded-server`"
            )
        }

        pub fn endpoint(&self) -> &str {
            match *self {}
        }

        pub async fn stop(self) {
            match self {}
        }
    }
}

async fn wait_for_client(endpoint: &str) -> anyhow::Result<Client> {
    for _ in 0..100 {
        if let Ok(c) = Client::builder(endpoint).holder("worker-B").connect().await {
            if c.status("").await.is_ok() {
                return Ok(c);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("the embedded leaseholdd did not start")
}

async fn scenario(
    endpoint: &str,
    b: &Client,
    account: &str,
    balance: &Balance,
    key: &str,
) -> anyhow::Result<Outcome> {
    *lock(balance) = START;
    let exe = std::env::current_exe().context("find the leasehold binary")?;
    let mut a = tokio::process::Command::new(exe)
        .args([
            "--endpoint",
            endpoint,
            "--holder",
            "worker-A",
            "demo-worker",
            key,
            account,
        ])
        .arg(A_DEPOSIT.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .context("start worker A")?;
    let mut lines = BufReader::new(a.stdout.take().context("worker A's output")?).lines();
    let ready = lines.next_line().await?.context("worker A said nothing")?;
    let a_fence: u64 = ready
        .strip_prefix("checked ")
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("worker A: {ready}"))?;
    let pid = a.id().context("worker A's pid")? as i32;
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };

    let lease = b
        .acquire(
            key,
            LockOptions::default()
                .ttl(Duration::from_secs(10))
                .wait(Duration::from_secs(10)),
        )
        .await
        .context("worker B acquires")?;
    let b_fence = lease.token()?;
    let http = reqwest::Client::new();
    let read: Value = http.get(account).send().await?.json().await?;
    let new = read["balance"].as_i64().unwrap_or(0) + B_DEPOSIT;
    let r = http
        .put(account)
        .header(FENCING_TOKEN, b_fence.to_string())
        .json(&json!({ "balance": new }))
        .send()
        .await?;
    let b_result = describe(r).await;
    lease.release().await?;

    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let a_result = lines
        .next_line()
        .await?
        .unwrap_or_else(|| "no answer".into());
    let _ = a.wait().await;
    Ok(Outcome {
        a_fence,
        a_result,
        b_fence,
        b_result,
        balance: *lock(balance),
    })
}

async fn describe(r: reqwest::Response) -> String {
    let status = r.status();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    if status.is_success() {
        format!("wrote {}", body["balance"])
    } else {
        format!(
            "refused: {}",
            body["error"]["message"].as_str().unwrap_or("?")
        )
    }
}

/// Worker A: take the lock, read, check the lease, then write after a pause
/// window. The parent freezes it in that window: the pause lands between the
/// check and the write, where no client-side check can help.
pub async fn worker(
    client: &Client,
    key: &str,
    account: &str,
    deposit: i64,
) -> anyhow::Result<i32> {
    let lease = client
        .try_acquire(key, LockOptions::default().ttl(TTL))
        .await
        .context("acquire")?;
    let http = reqwest::Client::new();
    let read: Value = http.get(account).send().await?.json().await?;
    let fence = lease.token().context("the lease is live")?;
    println!("checked {fence}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = http
        .put(account)
        .header(FENCING_TOKEN, fence.to_string())
        .json(&json!({ "balance": read["balance"].as_i64().unwrap_or(0) + deposit }))
        .send()
        .await?;
    println!("{}", describe(r).await);
    drop(lease);
    Ok(0)
}
