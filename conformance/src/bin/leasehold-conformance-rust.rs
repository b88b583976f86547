//! The Rust client's conformance adapter: commands as JSON lines on stdin,
//! answers as JSON lines on stdout (conformance/README.md), each command
//! run at once on its own task, so a waiting acquire never holds up the
//! next command. Connects to `LEASEHOLD_ENDPOINT` as `LEASEHOLD_HOLDER`;
//! `LEASEHOLD_PLANTED_BUG` plants a bug in the client.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use futures::StreamExt;
use leasehold::{Client, Error, Leadership, Lease, LockOptions};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, Mutex};
use tokio_util::sync::CancellationToken;

type Answer = Result<Value, Value>;

#[derive(Default)]
struct Handles {
    leases: HashMap<String, Arc<Mutex<Option<Lease>>>>,
    leaderships: HashMap<String, Arc<Mutex<Option<Leadership>>>>,
    waits: HashMap<String, CancellationToken>,
    streams: HashMap<String, Arc<Mutex<mpsc::UnboundedReceiver<Answer>>>>,
}

struct Adapter {
    client: Client,
    handles: std::sync::Mutex<Handles>,
}

#[tokio::main]
async fn main() {
    if let Some(bug) = std::env::var("LEASEHOLD_PLANTED_BUG")
        .ok()
        .and_then(|b| leasehold::planted::by_name(&b))
    {
        leasehold::planted::plant(bug);
    }
    let client = match Client::from_env().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("connect: {e}");
            std::process::exit(2);
        }
    };
    let adapter = Arc::new(Adapter {
        client,
        handles: std::sync::Mutex::new(Handles::default()),
    });
    let (out, mut answers) = mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(line) = answers.recv().await {
            if stdout.write_all(line.as_bytes()).await.is_err() || stdout.flush().await.is_err() {
                return;
            }
        }
    });
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(cmd) = serde_json::from_str::<Value>(&line) else {
            eprintln!("not JSON: {line}");
            continue;
        };
        let (adapter, out) = (adapter.clone(), out.clone());
        tokio::spawn(async move {
            let id = cmd["id"].clone();
            let answer = adapter.command(&cmd).await;
            let line = match answer {
                Ok(ok) => json!({"id": id, "ok": ok}),
                Err(error) => json!({"id": id, "error": error}),
            };
            let _ = out.send(format!("{line}\n"));
        });
    }
    drop(out);
    let _ = writer.await;
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The client's error as the suite names it: the code its type stands for.
fn coded(e: &Error) -> Value {
    let (code, details) = match e {
        Error::Held { holder, fence, .. } => ("held", json!({"holder": holder, "fence": fence})),
        Error::LockDelayed { left_ms, .. } => ("lock_delayed", json!({"delay_left_ms": left_ms})),
        Error::Timeout { .. } => ("wait_timeout", json!({})),
        Error::LeaseLost { .. } => ("lease_lost", json!({})),
        Error::StaleFence { .. } => ("stale_fence", json!({})),
        Error::InvalidArgument(_) => ("invalid_argument", json!({})),
        Error::Unauthenticated(_) => ("unauthenticated", json!({})),
        Error::PermissionDenied(_) => ("permission_denied", json!({})),
        Error::Unavailable(_) => ("unavailable", json!({})),
        Error::OutcomeUnknown(_) => ("outcome_unknown", json!({})),
        Error::ResourceExhausted { .. } => ("resource_exhausted", json!({})),
        Error::WatchBehind { .. } => ("watch_behind", json!({})),
        Error::TlsRequired(_) => ("tls_required", json!({})),
        _ => ("other", json!({})),
    };
    json!({"code": code, "message": e.to_string(), "details": details})
}

fn harness(message: String) -> Value {
    json!({"code": "adapter", "message": message, "details": {}})
}

fn arg_ms(args: &Value, name: &str) -> Option<Duration> {
    args.get(name)
        .and_then(Value::as_u64)
        .map(Duration::from_millis)
}

fn text(args: &Value, name: &str) -> Result<String, Value> {
    args.get(name)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| harness(format!("no {name:?}")))
}

impl Adapter {
    async fn command(&self, cmd: &Value) -> Answer {
        let args = &cmd["args"];
        let handle = cmd["as"].as_str().unwrap_or_default().to_string();
        match cmd["op"].as_str().unwrap_or_default() {
            "acquire" => self.acquire(args, &handle).await,
            "cancel" => {
                let h = text(args, "handle")?;
                if let Some(t) = self
                    .handles
                    .lock()
                    .map_err(|_| harness("poisoned".into()))?
                    .waits
                    .get(&h)
                {
                    t.cancel();
                }
                Ok(json!({}))
            }
            "token" => {
                let lease = self.lease(&text(args, "handle")?)?;
                let guard = lease.lock().await;
                let at_ms = now_ms();
                Ok(match guard.as_ref().map(Lease::token) {
                    Some(Ok(fence)) => json!({"live": true, "fence": fence, "at_ms": at_ms}),
                    Some(Err(e)) => json!({"live": false, "reason": e.to_string(), "at_ms": at_ms}),
                    None => json!({"live": false, "reason": "released", "at_ms": at_ms}),
                })
            }
            "wait_lost" => {
                let lease = self.lease(&text(args, "handle")?)?;
                let lost = lease.lock().await.as_ref().map(Lease::lost);
                let Some(lost) = lost else {
                    return Ok(json!({"lost": true, "reason": "released"}));
                };
                let limit = arg_ms(args, "within_ms").unwrap_or(Duration::from_secs(10));
                let lost = tokio::time::timeout(limit, lost).await.is_ok();
                Ok(json!({"lost": lost}))
            }
            "release" => {
                let lease = self.lease(&text(args, "handle")?)?;
                let taken = lease.lock().await.take();
                match taken {
                    Some(l) => l.release().await.map(|_| json!({})).map_err(|e| coded(&e)),
                    None => Ok(json!({})),
                }
            }
            "save_checkpoint" => {
                let lease = self.lease(&text(args, "handle")?)?;
                let data = text(args, "data")?;
                let guard = lease.lock().await;
                let l = guard.as_ref().ok_or_else(|| harness("released".into()))?;
                l.save_checkpoint(data.as_bytes())
                    .await
                    .map(|_| json!({}))
                    .map_err(|e| coded(&e))
            }
            "release_by_fence" => {
                let key = text(args, "key")?;
                let fence = args["fence"]
                    .as_u64()
                    .ok_or_else(|| harness("fence".into()))?;
                self.client
                    .release_by_fence(&key, fence)
                    .await
                    .map(|_| json!({}))
                    .map_err(|e| coded(&e))
            }
            "campaign" => {
                let election = self.client.election(&text(args, "election")?);
                let opts = LockOptions::default()
                    .ttl(arg_ms(args, "ttl_ms").unwrap_or(Duration::from_secs(15)))
                    .wait(Duration::from_secs(3600));
                let lead = election
                    .campaign(text(args, "value")?.as_bytes(), opts)
                    .await
                    .map_err(|e| coded(&e))?;
                let fence = lead.token().map_err(|e| coded(&e))?;
                self.handles
                    .lock()
                    .map_err(|_| harness("poisoned".into()))?
                    .leaderships
                    .insert(handle, Arc::new(Mutex::new(Some(lead))));
                Ok(json!({"fence": fence}))
            }
            "proclaim" => {
                let lead = self.leadership(&text(args, "handle")?)?;
                let guard = lead.lock().await;
                let l = guard.as_ref().ok_or_else(|| harness("resigned".into()))?;
                l.proclaim(text(args, "value")?.as_bytes())
                    .await
                    .map(|_| json!({}))
                    .map_err(|e| coded(&e))
            }
            "resign" => {
                let lead = self.leadership(&text(args, "handle")?)?;
                let taken = lead.lock().await.take();
                match taken {
                    Some(l) => l.resign().await.map(|_| json!({})).map_err(|e| coded(&e)),
                    None => Ok(json!({})),
                }
            }
            "observe" => {
                let election = self.client.election(&text(args, "election")?);
                let mut stream = election.observe().await.map_err(|e| coded(&e))?;
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(async move {
                    while let Some(item) = stream.next().await {
                        let item = item
                            .map(|l| match l {
                                Some(l) => json!({"value": String::from_utf8_lossy(&l.value), "fence": l.fence, "holder": l.holder}),
                                None => Value::Null,
                            })
                            .map_err(|e| coded(&e));
                        if tx.send(item).is_err() {
                            return;
                        }
                    }
                });
                self.stream_handle(handle, rx)
            }
            "next_leader" => {
                let item = self.next(&text(args, "handle")?, args).await?;
                Ok(json!({"leader": item}))
            }
            "watch" => {
                let mut stream = self
                    .client
                    .watch(&text(args, "prefix")?)
                    .await
                    .map_err(|e| coded(&e))?;
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(async move {
                    while let Some(item) = stream.next().await {
                        let item = item
                            .map(|e| json!({"kind": e.kind, "key": e.key, "fence": e.fence, "index": e.index, "seq": e.seq}))
                            .map_err(|e| coded(&e));
                        if tx.send(item).is_err() {
                            return;
                        }
                    }
                });
                self.stream_handle(handle, rx)
            }
            "next_events" => {
                let h = text(args, "handle")?;
                let count = args["count"].as_u64().unwrap_or(1);
                let mut events = Vec::new();
                for _ in 0..count {
                    events.push(self.next(&h, args).await?);
                }
                Ok(json!({"events": events}))
            }
            "churn" => {
                let prefix = text(args, "prefix")?;
                let opts = LockOptions::default()
                    .ttl(arg_ms(args, "ttl_ms").unwrap_or(Duration::from_secs(5)));
                for i in 0..args["count"].as_u64().unwrap_or(1) {
                    let l = self
                        .client
                        .try_acquire(&format!("{prefix}{i}"), opts.clone())
                        .await
                        .map_err(|e| coded(&e))?;
                    l.release().await.map_err(|e| coded(&e))?;
                }
                Ok(json!({}))
            }
            other => Err(harness(format!("no op {other:?}"))),
        }
    }

    async fn acquire(&self, args: &Value, handle: &str) -> Answer {
        let mut opts =
            LockOptions::default().ttl(arg_ms(args, "ttl_ms").unwrap_or(Duration::from_secs(15)));
        if let Some(d) = arg_ms(args, "lock_delay_ms") {
            opts = opts.lock_delay(d);
        }
        match (args["mode"].as_str(), args["permits"].as_u64()) {
            (_, Some(p)) => opts = opts.permits(p as u32),
            (Some("shared"), None) => opts = opts.shared(),
            _ => {}
        }
        let wait = arg_ms(args, "wait_ms").filter(|w| !w.is_zero());
        let keys: Vec<String> = args["keys"]
            .as_array()
            .map(|k| {
                k.iter()
                    .filter_map(|k| k.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let key = args["key"].as_str().unwrap_or_default().to_string();
        let cancel = CancellationToken::new();
        self.handles
            .lock()
            .map_err(|_| harness("poisoned".into()))?
            .waits
            .insert(handle.to_string(), cancel.clone());
        let taking = async {
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            match (wait, keys.is_empty()) {
                (None, true) => self.client.try_acquire(&key, opts).await,
                (Some(w), true) => self.client.acquire(&key, opts.wait(w)).await,
                (None, false) => self.client.try_acquire_set(&refs, opts).await,
                (Some(w), false) => self.client.acquire_set(&refs, opts.wait(w)).await,
            }
        };
        let taken = tokio::select! {
            taken = taking => taken,
            _ = cancel.cancelled() => {
                return Err(json!({"code": "cancelled", "message": "the wait was given up", "details": {}}));
            }
        };
        let lease = taken.map_err(|e| coded(&e))?;
        let mut ok = json!({"fence": lease.fence()});
        if let Some(c) = lease.checkpoint() {
            ok["checkpoint"] = json!(String::from_utf8_lossy(c));
            ok["checkpoint_base64"] = json!(base64::engine::general_purpose::STANDARD.encode(c));
        }
        self.handles
            .lock()
            .map_err(|_| harness("poisoned".into()))?
            .leases
            .insert(handle.to_string(), Arc::new(Mutex::new(Some(lease))));
        Ok(ok)
    }

    fn lease(&self, h: &str) -> Result<Arc<Mutex<Option<Lease>>>, Value> {
        self.handles
            .lock()
            .map_err(|_| harness("poisoned".into()))?
            .leases
            .get(h)
            .cloned()
            .ok_or_else(|| harness(format!("no lease {h:?}")))
    }

    fn leadership(&self, h: &str) -> Result<Arc<Mutex<Option<Leadership>>>, Value> {
        self.handles
            .lock()
            .map_err(|_| harness("poisoned".into()))?
            .leaderships
            .get(h)
            .cloned()
            .ok_or_else(|| harness(format!("no leadership {h:?}")))
    }

    fn stream_handle(&self, handle: String, rx: mpsc::UnboundedReceiver<Answer>) -> Answer {
        self.handles
            .lock()
            .map_err(|_| harness("poisoned".into()))?
            .streams
            .insert(handle, Arc::new(Mutex::new(rx)));
        Ok(json!({}))
    }

    /// The next item of a stream, within `within_ms`.
    async fn next(&self, h: &str, args: &Value) -> Answer {
        let rx = self
            .handles
            .lock()
            .map_err(|_| harness("poisoned".into()))?
            .streams
            .get(h)
            .cloned()
            .ok_or_else(|| harness(format!("no stream {h:?}")))?;
        let limit = arg_ms(args, "within_ms").unwrap_or(Duration::from_secs(10));
        let mut rx = rx.lock().await;
        match tokio::time::timeout(limit, rx.recv()).await {
            Ok(Some(item)) => item,
            Ok(None) => Err(harness("the stream ended".into())),
            Err(_) => Err(
                json!({"code": "no_change", "message": format!("nothing within {limit:?}"), "details": {}}),
            ),
        }
    }
}
