//! Runs one scenario against one client: starts its servers and its
//! clients' adapters, then interprets its steps. The first step that does
//! not go as written fails the scenario, with the step and the transcript.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use leasehold_testkit::{http_call, Cluster, FaultProxy, Leaseholdd};
use serde_json::{json, Map, Value};

use crate::adapter::{Adapter, Lang};
use crate::scenario::Scenario;

/// Where a scenario runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// One node.
    Single,
    /// Three nodes forming one group.
    Cluster,
}

impl Topology {
    /// `single` or `cluster`.
    pub fn name(self) -> &'static str {
        match self {
            Topology::Single => "single",
            Topology::Cluster => "cluster",
        }
    }
}

/// How a scenario went.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The scenario's name.
    pub scenario: String,
    /// Whether every step went as written.
    pub passed: bool,
    /// Why not: the step, what happened, and the transcript.
    pub detail: String,
    /// How long it took.
    pub took: Duration,
}

/// How long a client step's answer is waited for unless it says.
const ANSWER_LIMIT: Duration = Duration::from_secs(30);

enum Servers {
    Single {
        node: Leaseholdd,
        proxy: Option<FaultProxy>,
    },
    Cluster(Cluster),
}

struct Pending {
    client: String,
    id: u64,
    sent_ms: u64,
}

struct Ctx<'a> {
    lang: &'a Lang,
    scenario: &'a Scenario,
    planted: Option<&'a str>,
    servers: Servers,
    adapters: HashMap<String, Adapter>,
    vars: HashMap<String, Value>,
    pending: HashMap<String, Pending>,
    /// The root token once auth is on: the harness's own calls carry it.
    root: Option<String>,
    dir: tempfile::TempDir,
    transcript: Vec<String>,
}

/// Runs `scenario` against `lang` on `topology`, with the bug `planted`
/// (by its name) planted in the client if given.
pub fn run(lang: &Lang, scenario: &Scenario, topology: Topology, planted: Option<&str>) -> Outcome {
    let started = Instant::now();
    let args: Vec<&str> = scenario.node_args.iter().map(String::as_str).collect();
    let servers = match topology {
        Topology::Single => {
            let node = Leaseholdd::start_with(&args);
            let proxied = scenario
                .clients
                .values()
                .any(|o| o.get("proxy").and_then(Value::as_bool) == Some(true));
            let proxy = proxied.then(|| FaultProxy::start(&node.addr));
            Servers::Single { node, proxy }
        }
        Topology::Cluster => Servers::Cluster(Cluster::start_with(3, &args)),
    };
    let mut ctx = Ctx {
        lang,
        scenario,
        planted,
        servers,
        adapters: HashMap::new(),
        vars: HashMap::new(),
        pending: HashMap::new(),
        root: None,
        dir: tempfile::TempDir::new().expect("a temporary directory"),
        transcript: Vec::new(),
    };
    let mut result = Ok(());
    for (i, step) in scenario.steps.iter().enumerate() {
        ctx.transcript.push(format!(
            "{:>6} ms  step {}: {step}",
            started.elapsed().as_millis(),
            i + 1
        ));
        if let Err(why) = ctx.step(step) {
            result = Err(format!("step {} {step}: {why}", i + 1));
            break;
        }
    }
    let detail = match &result {
        Ok(()) => String::new(),
        Err(why) => {
            let lines = &ctx.transcript[ctx.transcript.len().saturating_sub(25)..];
            format!(
                "{why}\n  transcript (last steps and answers):\n    {}",
                lines.join("\n    ")
            )
        }
    };
    Outcome {
        scenario: scenario.name.clone(),
        passed: result.is_ok(),
        detail,
        took: started.elapsed(),
    }
}

/// Milliseconds since the epoch, the clock the adapters' `at_ms` use.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn field<'v>(step: &'v Value, name: &str) -> Result<&'v Value, String> {
    step.get(name)
        .ok_or_else(|| format!("the step has no {name:?}"))
}

fn text<'v>(step: &'v Value, name: &str) -> Result<&'v str, String> {
    field(step, name)?
        .as_str()
        .ok_or_else(|| format!("{name:?} is not a string"))
}

fn millis(step: &Value, name: &str, default: u64) -> Duration {
    Duration::from_millis(step.get(name).and_then(Value::as_u64).unwrap_or(default))
}

/// Whether `actual` has everything `expected` names, equal (numbers by
/// value, objects by their named fields).
fn matches(expected: &Value, actual: &Value) -> bool {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => e
            .iter()
            .all(|(k, v)| a.get(k).is_some_and(|x| matches(v, x))),
        (Value::Number(e), Value::Number(a)) => e.as_f64() == a.as_f64(),
        (e, a) => e == a,
    }
}

impl Ctx<'_> {
    fn step(&mut self, step: &Value) -> Result<(), String> {
        let Value::Object(fields) = step else {
            return Err("a step is an object".into());
        };
        if let Some(client) = fields
            .keys()
            .find(|k| self.scenario.clients.contains_key(*k))
        {
            let client = client.clone();
            return self.client_step(&client, step);
        }
        if let Some(ms) = step.get("sleep_ms").and_then(Value::as_u64) {
            std::thread::sleep(Duration::from_millis(ms));
            return Ok(());
        }
        if let Some(handle) = step.get("await").and_then(Value::as_str) {
            return self.await_step(handle, step);
        }
        if let Some(cond) = step.get("until") {
            let limit = millis(step, "within_ms", 10_000);
            let until = Instant::now() + limit;
            loop {
                match self.holds(cond) {
                    Ok(()) => return Ok(()),
                    Err(why) if Instant::now() >= until => {
                        return Err(format!("not so within {limit:?}: {why}"))
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
        if let Some(cond) = step.get("check") {
            return self.holds(cond);
        }
        if let Some(op) = step.get("server").and_then(Value::as_str) {
            return self.server_step(op, step);
        }
        if let Some(op) = step.get("proxy").and_then(Value::as_str) {
            return self.proxy_step(op, step);
        }
        if let Some(client) = step.get("poll").and_then(Value::as_str) {
            return self.poll(client, step);
        }
        if let Some(name) = step.get("check_beliefs").and_then(Value::as_str) {
            return self.check_beliefs(name, step);
        }
        if let Some(Value::Array(refs)) = step.get("check_increasing") {
            let values: Vec<Value> = refs
                .iter()
                .map(|r| self.resolve(r))
                .collect::<Result<_, _>>()?;
            let numbers: Vec<u64> = values.iter().filter_map(Value::as_u64).collect();
            if numbers.len() != values.len() || numbers.windows(2).any(|w| w[0] >= w[1]) {
                return Err(format!("not strictly increasing: {values:?}"));
            }
            return Ok(());
        }
        if let Some(Value::Array(names)) = step.get("check_events") {
            return self.check_events(names, text(step, "prefix")?);
        }
        Err("no such step".into())
    }

    /// `$name` or `$name.field.field`, from what earlier steps saved;
    /// anything else is itself (objects and lists resolved inside).
    fn resolve(&self, v: &Value) -> Result<Value, String> {
        match v {
            Value::String(s) if s.starts_with('$') => {
                let mut parts = s[1..].split('.');
                let name = parts.next().unwrap_or_default();
                let mut at = self
                    .vars
                    .get(name)
                    .ok_or_else(|| format!("{s}: nothing saved as {name:?}"))?;
                for p in parts {
                    at = at.get(p).ok_or_else(|| format!("{s}: no {p:?} in {at}"))?;
                }
                Ok(at.clone())
            }
            Value::Object(m) => {
                let mut out = Map::new();
                for (k, v) in m {
                    out.insert(k.clone(), self.resolve(v)?);
                }
                Ok(Value::Object(out))
            }
            Value::Array(items) => Ok(Value::Array(
                items
                    .iter()
                    .map(|i| self.resolve(i))
                    .collect::<Result<_, _>>()?,
            )),
            other => Ok(other.clone()),
        }
    }

    /// What the scenario says of `client` (endpoints, token, ...).
    fn client_options(&self, client: &str) -> Value {
        self.scenario
            .clients
            .get(client)
            .cloned()
            .unwrap_or_default()
    }

    fn adapter(&mut self, client: &str) -> Result<&mut Adapter, String> {
        if !self.adapters.contains_key(client) {
            let options = self.client_options(client);
            let endpoints = self.endpoints_for(&options)?;
            let token = match options.get("token") {
                Some(t) => Some(
                    self.resolve(t)?
                        .as_str()
                        .ok_or("a client's token is a string")?
                        .to_string(),
                ),
                None => None,
            };
            let planted = self.planted.filter(|_| options.get("plain").is_none());
            let adapter = Adapter::start(
                self.lang,
                client,
                &endpoints,
                token.as_deref(),
                planted,
                self.dir.path(),
            )?;
            self.adapters.insert(client.to_string(), adapter);
        }
        self.adapters
            .get_mut(client)
            .ok_or_else(|| format!("no client {client}"))
    }

    fn endpoints_for(&self, options: &Value) -> Result<String, String> {
        match &self.servers {
            Servers::Single { node, proxy } => {
                if options.get("proxy").and_then(Value::as_bool) == Some(true) {
                    let proxy = proxy.as_ref().ok_or("no proxy")?;
                    return Ok(proxy.url());
                }
                Ok(node.url())
            }
            Servers::Cluster(cluster) => match options.get("endpoints").and_then(Value::as_str) {
                Some("follower_first") => {
                    let leader = cluster.wait_leader();
                    Ok(cluster.endpoints_from((leader + 1) % cluster.nodes.len()))
                }
                _ => Ok(cluster.endpoints()),
            },
        }
    }

    fn client_step(&mut self, client: &str, step: &Value) -> Result<(), String> {
        let op = text(step, client)?.to_string();
        let mut args = Map::new();
        for (k, v) in step.as_object().into_iter().flatten() {
            if ![client, "as", "expect", "async", "answer_within_ms"].contains(&k.as_str()) {
                args.insert(k.clone(), self.resolve(v)?);
            }
        }
        let handle = step.get("as").and_then(Value::as_str);
        let limit = millis(step, "answer_within_ms", ANSWER_LIMIT.as_millis() as u64);
        let sent_ms = now_ms();
        let adapter = self.adapter(client)?;
        let id = adapter.send(&op, Value::Object(args), handle)?;
        if step.get("async").and_then(Value::as_bool) == Some(true) {
            let handle = handle.ok_or("an async step needs \"as\"")?;
            let pending = Pending {
                client: client.to_string(),
                id,
                sent_ms,
            };
            self.pending.insert(handle.to_string(), pending);
            return Ok(());
        }
        let answer = adapter.wait(id, limit)?;
        self.settle(step, handle, answer, sent_ms)
    }

    fn await_step(&mut self, handle: &str, step: &Value) -> Result<(), String> {
        let p = self
            .pending
            .remove(handle)
            .ok_or_else(|| format!("nothing pending as {handle:?}"))?;
        let limit = millis(step, "within_ms", ANSWER_LIMIT.as_millis() as u64);
        let answer = self
            .adapters
            .get(&p.client)
            .ok_or("no such client")?
            .wait(p.id, limit)?;
        self.settle(step, Some(handle), answer, p.sent_ms)
    }

    /// Checks an answer against the step's `expect`, and saves it.
    fn settle(
        &mut self,
        step: &Value,
        handle: Option<&str>,
        answer: Result<Value, Value>,
        sent_ms: u64,
    ) -> Result<(), String> {
        self.transcript
            .push(format!("          answer: {answer:?}"));
        let expect = match step.get("expect") {
            Some(e) => self.resolve(e)?,
            None => json!({}),
        };
        match (&answer, expect.get("error")) {
            (Err(e), Some(codes)) => {
                let code = e.get("code").and_then(Value::as_str).unwrap_or_default();
                let allowed = match codes {
                    Value::Array(list) => list.iter().any(|c| c.as_str() == Some(code)),
                    one => one.as_str() == Some(code),
                };
                if !allowed {
                    return Err(format!("wanted the error {codes}, got {e}"));
                }
                if let Some(details) = expect.get("details") {
                    let got = e.get("details").cloned().unwrap_or_default();
                    if !matches(details, &got) {
                        return Err(format!("wanted details {details}, got {e}"));
                    }
                }
            }
            (Err(e), None) => return Err(format!("failed: {e}")),
            (Ok(v), Some(codes)) => return Err(format!("wanted the error {codes}, got {v}")),
            (Ok(v), None) => {
                if let Some(want) = expect.get("ok") {
                    if !matches(want, v) {
                        return Err(format!("wanted {want}, got {v}"));
                    }
                }
            }
        }
        if let (Some(h), Ok(v)) = (handle, &answer) {
            let mut saved = v.clone();
            if let Value::Object(m) = &mut saved {
                m.insert("sent_ms".into(), json!(sent_ms));
            }
            self.vars.insert(h.to_string(), saved);
        }
        Ok(())
    }

    /// The HTTP address the harness's own calls go to: the node, or the
    /// cluster's leader now.
    fn api_addr(&self) -> Result<String, String> {
        match &self.servers {
            Servers::Single { node, .. } => Ok(node.addr.clone()),
            Servers::Cluster(cluster) => {
                let until = Instant::now() + Duration::from_secs(20);
                loop {
                    let alive = cluster.nodes.iter().filter(|n| n.process.is_some());
                    if let Some(n) = alive.clone().find(|n| n.leads()) {
                        return Ok(n.addr.clone());
                    }
                    if Instant::now() >= until {
                        return Err("no node leads".into());
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }

    /// A call to the HTTP API as an operator (the root token once auth is on).
    fn api(&self, method: &str, path: &str, body: Option<Value>) -> Result<(u16, Value), String> {
        let addr = self.api_addr()?;
        let body = body.map(|b| b.to_string());
        let (status, text) = http_call(&addr, method, path, body.as_deref(), self.root.as_deref())
            .ok_or_else(|| format!("{method} {path}: no answer from {addr}"))?;
        let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok((status, v))
    }

    fn lock(&self, key: &str) -> Result<Value, String> {
        let (status, v) = self.api("GET", &format!("/v1/locks/{key}"), None)?;
        if status != 200 {
            return Err(format!("describe {key}: {status} {v}"));
        }
        Ok(v)
    }

    /// A condition on the servers' state; why not, if it does not hold.
    fn holds(&self, cond: &Value) -> Result<(), String> {
        let cond = self.resolve(cond)?;
        if let Some(holder) = cond.get("leases_of").and_then(Value::as_str) {
            let (_, v) = self.api("GET", "/v1/leases?limit=10000", None)?;
            let count = v["leases"]
                .as_array()
                .map_or(0, |l| l.iter().filter(|l| l["holder"] == holder).count());
            let want = cond["count"].as_u64().unwrap_or(0) as usize;
            if count != want {
                return Err(format!("{holder} has {count} leases, not {want}: {v}"));
            }
            return Ok(());
        }
        if let Some(n) = cond.get("proxy_dropped_at_least").and_then(Value::as_u64) {
            let Servers::Single { proxy: Some(p), .. } = &self.servers else {
                return Err("no proxy".into());
            };
            if (p.dropped() as u64) < n {
                return Err(format!(
                    "the proxy dropped {} replies, not {n}",
                    p.dropped()
                ));
            }
            return Ok(());
        }
        let key = text(&cond, "key")?;
        let lock = self.lock(key)?;
        let holders = lock["holders"].as_array().map_or(0, Vec::len);
        let waiters = lock["waiters"].as_array().map_or(0, Vec::len);
        if let Some(n) = cond.get("waiters").and_then(Value::as_u64) {
            if waiters as u64 != n {
                return Err(format!("{key} has {waiters} waiters, not {n}: {lock}"));
            }
        }
        if let Some(n) = cond.get("holders").and_then(Value::as_u64) {
            if holders as u64 != n {
                return Err(format!("{key} has {holders} holders, not {n}: {lock}"));
            }
        }
        if cond.get("free").and_then(Value::as_bool) == Some(true) && holders != 0 {
            return Err(format!("{key} is held: {lock}"));
        }
        if let Some(fence) = cond.get("holder_fence") {
            if !matches(fence, &lock["holder"]["fence"]) {
                return Err(format!("{key} is not held by fence {fence}: {lock}"));
            }
        }
        Ok(())
    }

    fn server_step(&mut self, op: &str, step: &Value) -> Result<(), String> {
        let step = self.resolve(step)?;
        let expect_ok = |what: &str, (status, v): (u16, Value)| -> Result<Value, String> {
            if (200..300).contains(&status) {
                Ok(v)
            } else {
                Err(format!("{what}: {status} {v}"))
            }
        };
        match op {
            "revoke" | "revoke_holder" | "revoke_waiter" => {
                // A lease by its id, or the one holding (or waiting at
                // `position` in) a key's queue.
                let lease = if op == "revoke" {
                    field(&step, "lease")?.clone()
                } else {
                    let key = text(&step, "key")?;
                    let (list, at) = match op {
                        "revoke_holder" => ("holders", 0),
                        _ => ("waiters", step["position"].as_u64().unwrap_or(0) as usize),
                    };
                    let lock = self.lock(key)?;
                    let lease = lock[list][at]["lease"].clone();
                    if !lease.is_u64() {
                        return Err(format!("{key} has no {list} {at}: {lock}"));
                    }
                    lease
                };
                let path = format!("/v1/leases/{lease}");
                expect_ok("revoke", self.api("DELETE", &path, None)?)?;
            }
            "release_by_fence" => {
                let body = json!({"key": text(&step, "key")?, "fence": field(&step, "fence")?,
                                  "request_id": rand_id()});
                expect_ok("release", self.api("POST", "/v1/release", Some(body))?)?;
            }
            "acquire" => {
                let mut body = json!({"key": text(&step, "key")?, "ttl_ms": step["ttl_ms"],
                                      "holder": "operator", "request_id": rand_id()});
                if let Some(d) = step.get("lock_delay_ms") {
                    body["lock_delay_ms"] = d.clone();
                }
                let v = expect_ok("acquire", self.api("POST", "/v1/acquire", Some(body))?)?;
                if let Some(h) = step.get("as").and_then(Value::as_str) {
                    self.vars.insert(h.to_string(), v);
                }
            }
            "enable_auth" => {
                let v = expect_ok("enable auth", self.api("POST", "/v1/auth/enable", None)?)?;
                let token = v["token"].as_str().ok_or("no root token")?.to_string();
                self.root = Some(token);
                if let Some(h) = step.get("as").and_then(Value::as_str) {
                    self.vars.insert(h.to_string(), v);
                }
            }
            "role" => {
                let name = text(&step, "name")?;
                let body = json!({"rules": step["rules"]});
                expect_ok(
                    "role",
                    self.api("PUT", &format!("/v1/auth/roles/{name}"), Some(body))?,
                )?;
            }
            "token" => {
                let body = json!({"name": text(&step, "name")?, "role": text(&step, "role")?});
                let v = expect_ok("token", self.api("POST", "/v1/auth/tokens", Some(body))?)?;
                let h = text(&step, "as")?;
                self.vars.insert(h.to_string(), v);
            }
            "pause_all" | "resume_all" => {
                let pause = op == "pause_all";
                let act =
                    |p: &leasehold_testkit::Process| if pause { p.pause() } else { p.resume() };
                match &self.servers {
                    Servers::Single { node, .. } => act(&node.process),
                    Servers::Cluster(c) => c
                        .nodes
                        .iter()
                        .filter_map(|n| n.process.as_ref())
                        .for_each(act),
                }
            }
            "kill_leader" => {
                let Servers::Cluster(c) = &mut self.servers else {
                    return Err("kill_leader needs a cluster".into());
                };
                let leader = c.wait_leader();
                c.kill(leader);
            }
            "kill_first_endpoint" => {
                let client = text(&step, "of")?;
                let options = self.client_options(client);
                let endpoints = self.endpoints_for(&options)?;
                let first = endpoints
                    .trim_start_matches("http://")
                    .split(',')
                    .next()
                    .unwrap_or_default()
                    .to_string();
                let Servers::Cluster(c) = &mut self.servers else {
                    return Err("kill_first_endpoint needs a cluster".into());
                };
                let i = c
                    .nodes
                    .iter()
                    .position(|n| n.addr == first)
                    .ok_or("no such node")?;
                c.kill(i);
            }
            other => return Err(format!("no server step {other:?}")),
        }
        Ok(())
    }

    fn proxy_step(&mut self, op: &str, step: &Value) -> Result<(), String> {
        let Servers::Single { proxy: Some(p), .. } = &self.servers else {
            return Err("no proxy: give a client \"proxy\": true, on a single node".into());
        };
        match op {
            "drop_next_reply" => p.drop_next_reply(),
            "delay_replies" => p.delay_replies(millis(step, "ms", 0)),
            "swallow_requests" => p.swallow_requests(true),
            "pass_requests" => p.swallow_requests(false),
            other => return Err(format!("no proxy step {other:?}")),
        }
        Ok(())
    }

    /// Asks a client for its token every `every_ms` until it says the
    /// lease is lost; saves each belief (`live`, `at_ms`) as `as`.
    fn poll(&mut self, client: &str, step: &Value) -> Result<(), String> {
        let handle = text(step, "handle")?.to_string();
        let every = millis(step, "every_ms", 20);
        let limit = millis(step, "within_ms", 10_000);
        let name = text(step, "as")?.to_string();
        let until = Instant::now() + limit;
        let mut beliefs = Vec::new();
        loop {
            let adapter = self.adapter(client)?;
            let id = adapter.send("token", json!({"handle": handle}), None)?;
            let answer = adapter
                .wait(id, ANSWER_LIMIT)?
                .map_err(|e| format!("token: {e}"))?;
            let live = answer["live"].as_bool().ok_or("token answers \"live\"")?;
            beliefs.push(answer.clone());
            if !live {
                self.transcript.push(format!(
                    "          {} beliefs, the last: {answer}",
                    beliefs.len()
                ));
                self.vars.insert(name, Value::Array(beliefs));
                return Ok(());
            }
            if Instant::now() >= until {
                return Err(format!("still live after {limit:?}: {answer}"));
            }
            std::thread::sleep(every);
        }
    }

    /// Every belief that the lease was live came before the moment the
    /// server could have ended it: its expiry (the `expired` event), or
    /// the end of the TTL counted from when the acquire was sent.
    fn check_beliefs(&self, name: &str, step: &Value) -> Result<(), String> {
        let beliefs = self
            .vars
            .get(name)
            .and_then(Value::as_array)
            .ok_or("no beliefs")?;
        let last_live = beliefs
            .iter()
            .filter(|b| b["live"] == true)
            .filter_map(|b| b["at_ms"].as_u64())
            .max();
        let Some(last_live) = last_live else {
            return Ok(());
        };
        let (end, what) = match text(step, "before")? {
            "expiry" => {
                let key = text(step, "key")?;
                let limit = millis(step, "within_ms", 10_000);
                (
                    self.expired_at(key, limit)?,
                    format!("the server expired {key}"),
                )
            }
            "ttl_end" => {
                let handle = text(step, "handle")?;
                let sent = self
                    .vars
                    .get(handle)
                    .and_then(|v| v["sent_ms"].as_u64())
                    .ok_or("no sent_ms")?;
                let ttl = step["ttl_ms"].as_u64().ok_or("ttl_ms")?;
                (
                    sent + ttl,
                    format!("{handle}'s TTL ended, counted from its send"),
                )
            }
            other => return Err(format!("before {other:?}?")),
        };
        if last_live >= end {
            return Err(format!(
                "the client believed it held the lease {} ms after {what} (at {end}): a rule broken",
                last_live - end
            ));
        }
        Ok(())
    }

    /// When the server expired `key`'s hold: the `expired` event's time.
    fn expired_at(&self, key: &str, limit: Duration) -> Result<u64, String> {
        let until = Instant::now() + limit;
        loop {
            let (_, v) = self.api("GET", &format!("/v1/events?prefix={key}"), None)?;
            let found = v["events"].as_array().and_then(|events| {
                events
                    .iter()
                    .find(|e| e["kind"] == "expired" && e["key"] == key)
                    .and_then(|e| e["at_unix_ms"].as_u64())
            });
            if let Some(at) = found {
                return Ok(at);
            }
            if Instant::now() >= until {
                return Err(format!("the server never expired {key}: {v}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The events saved under `names`, in order, are each once and in the
    /// deployment's order, and are the deployment's history under `prefix`
    /// from the first of them to the last, nothing left out.
    fn check_events(&self, names: &[Value], prefix: &str) -> Result<(), String> {
        let mut seen = Vec::new();
        for n in names {
            let n = n.as_str().ok_or("event list names")?;
            let events = self
                .vars
                .get(n)
                .and_then(|v| v["events"].as_array())
                .ok_or("no events")?;
            seen.extend(events.iter().cloned());
        }
        let place = |e: &Value| {
            (
                e["index"].as_u64().unwrap_or(0),
                e["seq"].as_u64().unwrap_or(0),
            )
        };
        for w in seen.windows(2) {
            if place(&w[0]) >= place(&w[1]) {
                return Err(format!("out of order or twice: {} then {}", w[0], w[1]));
            }
        }
        let (Some(first), Some(last)) = (seen.first(), seen.last()) else {
            return Err("no events".into());
        };
        let (_, v) = self.api("GET", &format!("/v1/events?prefix={prefix}"), None)?;
        let history: Vec<&Value> = v["events"]
            .as_array()
            .ok_or("no history")?
            .iter()
            .filter(|e| place(e) >= place(first) && place(e) <= place(last))
            .collect();
        let shape = |e: &Value| {
            format!(
                "{}.{} {} {} {}",
                e["index"], e["seq"], e["kind"], e["key"], e["fence"]
            )
        };
        let watched: Vec<String> = seen.iter().map(shape).collect();
        let logged: Vec<String> = history.iter().map(|e| shape(e)).collect();
        if watched != logged {
            return Err(format!("watched {watched:?}\n  the history has {logged:?}"));
        }
        Ok(())
    }
}

fn rand_id() -> u64 {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    ((t ^ 0x9E37_79B9_7F4A_7C15).rotate_left(17) % (1 << 53)) | 1
}
