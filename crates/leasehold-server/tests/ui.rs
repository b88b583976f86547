//! The dashboard at `/ui`, served by a real `leaseholdd` and read by a real
//! headless browser (Debian's `chromium`, driven through `chromedriver`'s
//! WebDriver API): a lock taken through the API appears on the page with its
//! holder and fence, and disappears when it is released; the event stream
//! shows both, and what happened before the page loaded comes from the
//! node's history. A follower's page links to the leader's.
//!
//! `LEASEHOLD_SCREENSHOT=FILE` saves a screenshot of the populated page.

mod common;

use std::time::{Duration, Instant};

use base64::Engine;
use leasehold_testkit::{free_port, http_get, listening, wait_until, Cluster, Leaseholdd, Process};
use serde_json::{json, Value};

/// A chromedriver process and one headless browser session in it.
struct Browser {
    _driver: Process,
    base: String,
    session: String,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Browser {
    async fn start() -> Browser {
        let driver = ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("chromedriver is not installed: apt-get install chromium chromium-driver (scripts/test does)");
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        // Its own process group: the browser it starts dies with it.
        let process = Process::spawn_group(
            std::path::Path::new(driver),
            &[format!("--port={port}")],
            &dir.path().join("chromedriver.log"),
        );
        let addr = format!("127.0.0.1:{port}");
        wait_until(Duration::from_secs(20), "chromedriver", || listening(&addr));
        let base = format!("http://{addr}");
        let http = reqwest::Client::new();
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu",
                    "--disable-dev-shm-usage", "--window-size=1400,1000",
                    format!("--user-data-dir={}", dir.path().join("profile").display()),
                ],
            },
        }}});
        let created: Value = http
            .post(format!("{base}/session"))
            .json(&capabilities)
            .send()
            .await
            .expect("create a session")
            .json()
            .await
            .expect("session answer");
        let session = created["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {created}"))
            .to_string();
        Browser {
            _driver: process,
            base,
            session,
            http,
            _dir: dir,
        }
    }

    async fn command(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut request = self.http.request(method.clone(), url);
        if method != reqwest::Method::GET {
            request = request.json(&body);
        }
        let answer: Value = request
            .send()
            .await
            .expect("webdriver call")
            .json()
            .await
            .expect("webdriver answer");
        answer["value"].clone()
    }

    async fn open(&self, url: &str) {
        self.command(reqwest::Method::POST, "/url", json!({"url": url}))
            .await;
    }

    /// What `script` (a function body) returns in the page.
    async fn run(&self, script: &str) -> Value {
        self.command(
            reqwest::Method::POST,
            "/execute/sync",
            json!({"script": script, "args": []}),
        )
        .await
    }

    /// The visible text of the element with this id.
    async fn text(&self, id: &str) -> String {
        let value = self
            .run(&format!("return document.getElementById('{id}').innerText"))
            .await;
        value.as_str().unwrap_or_default().to_string()
    }

    /// Waits until the element's text satisfies `ok`; the text.
    async fn wait_text(&self, id: &str, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let text = self.text(id).await;
            if ok(&text) {
                return text;
            }
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "the page never showed {what}; #{id} says: {text}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn screenshot(&self) -> Vec<u8> {
        let png = self
            .command(reqwest::Method::GET, "/screenshot", Value::Null)
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap_or_default())
            .expect("base64");
        assert!(png.starts_with(b"\x89PNG"), "no screenshot came back");
        png
    }
}

#[test]
fn the_dashboard_is_served_from_the_binary() {
    let server = Leaseholdd::start();
    let page = http_get(&server.addr, "/ui").expect("/ui answers");
    assert!(page.contains("<script src=\"/ui/app.js\">"), "{page}");
    let script = http_get(&server.addr, "/ui/app.js").expect("script");
    assert!(script.contains("EventSource"), "{script}");
    assert!(http_get(&server.addr, "/ui/app.css").is_some());
    // Nothing on the page comes from elsewhere.
    assert!(!page.contains("http://") && !page.contains("https://"));
    // A browser pointed at the bare address lands on the dashboard.
    let mut s = std::net::TcpStream::connect(&server.addr).expect("connect");
    use std::io::{Read, Write};
    write!(s, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").expect("send");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("read");
    assert!(answer.starts_with("HTTP/1.1 303"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("location: /ui\r\n"),
        "{answer}"
    );
}

#[tokio::test]
async fn the_dashboard_shows_a_lock_appear_and_disappear() {
    let server = Leaseholdd::start();
    let browser = Browser::start().await;
    browser.open(&format!("http://{}/ui", server.addr)).await;
    browser
        .wait_text("stream", "the event stream connected", |t| t == "live")
        .await;
    browser
        .wait_text("locks", "an empty lock table", |t| {
            t.contains("no lock held")
        })
        .await;

    let (_, taken) = common::post(
        &server.addr,
        "/v1/acquire",
        json!({"key": "payments/nightly", "ttl_ms": 60_000, "holder": "batch-7"}),
    )
    .await;
    let fence = taken["fence"].as_u64().expect("a fence");
    let locks = browser
        .wait_text("locks", "the lock appear", |t| {
            t.contains("payments/nightly")
        })
        .await;
    assert!(locks.contains("batch-7"), "{locks}");
    browser
        .wait_text("events", "the acquired event", |t| {
            t.contains("acquired") && t.contains("payments/nightly")
        })
        .await;
    // A semaphore with two of its three permits taken says so.
    for holder in ["w1", "w2"] {
        common::post(
            &server.addr,
            "/v1/acquire",
            json!({"key": "partner-api", "ttl_ms": 60_000, "holder": holder, "permits": 3}),
        )
        .await;
    }
    // Both of its holders, each with its fence.
    let locks = browser
        .wait_text("locks", "the semaphore's permits", |t| {
            t.contains("2/3 permits")
        })
        .await;
    assert!(
        locks.contains("w1 (fence") && locks.contains("w2 (fence"),
        "{locks}"
    );

    // A populated page, for the README, when asked for.
    if let Ok(path) = std::env::var("LEASEHOLD_SCREENSHOT") {
        populate(&server.addr).await;
        browser
            .wait_text("locks", "the other locks", |t| t.contains("jobs/reindex"))
            .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        std::fs::write(path, browser.screenshot().await).expect("write the screenshot");
    }

    let (_, released) = common::post(
        &server.addr,
        "/v1/release",
        json!({"key": "payments/nightly", "fence": fence}),
    )
    .await;
    assert!(released.get("error").is_none(), "{released}");
    browser
        .wait_text("locks", "the lock disappear", |t| {
            !t.contains("payments/nightly")
        })
        .await;
    browser
        .wait_text("events", "the released event", |t| t.contains("released"))
        .await;

    // Search by prefix: only keys under it.
    common::post(
        &server.addr,
        "/v1/acquire",
        json!({"key": "jobs/only", "ttl_ms": 60_000}),
    )
    .await;
    common::post(
        &server.addr,
        "/v1/acquire",
        json!({"key": "other/key", "ttl_ms": 60_000}),
    )
    .await;
    browser
        .command(
            reqwest::Method::POST,
            "/execute/sync",
            json!({"script": "document.getElementById('prefix').value = 'jobs/'; document.getElementById('search').requestSubmit();", "args": []}),
        )
        .await;
    let found = browser
        .wait_text("locks", "only jobs/ keys", |t| {
            t.contains("jobs/only") && !t.contains("other/key")
        })
        .await;
    assert!(!found.contains("other/key"), "{found}");
}

/// With auth on, the page asks for a token; once one is entered it shows
/// what that token may read, and its event stream carries the token too.
#[tokio::test]
async fn with_auth_on_the_dashboard_shows_what_its_token_may_read() {
    let server = Leaseholdd::start();
    let (_, root) = common::post(&server.addr, "/v1/auth/enable", json!({})).await;
    let root = root["token"].as_str().expect("root token").to_string();
    let http = reqwest::Client::new();
    let as_root = |method: reqwest::Method, path: &str, body: Value| {
        http.request(method, format!("http://{}{path}", server.addr))
            .bearer_auth(&root)
            .json(&body)
            .send()
    };
    let rules = json!({"rules": [{"prefix": "jobs/", "permission": "read"}]});
    as_root(reqwest::Method::PUT, "/v1/auth/roles/viewer", rules)
        .await
        .expect("role");
    let viewer: Value = as_root(
        reqwest::Method::POST,
        "/v1/auth/tokens",
        json!({"name": "dashboard", "role": "viewer"}),
    )
    .await
    .expect("token")
    .json()
    .await
    .expect("token answer");
    let viewer = viewer["token"].as_str().expect("viewer token");
    for key in ["jobs/visible", "payments/hidden"] {
        as_root(
            reqwest::Method::POST,
            "/v1/acquire",
            json!({"key": key, "ttl_ms": 60_000}),
        )
        .await
        .expect("acquire");
    }

    let browser = Browser::start().await;
    browser.open(&format!("http://{}/ui", server.addr)).await;
    browser
        .wait_text("notice", "a request for a token", |t| {
            t.contains("enter an access token")
        })
        .await;
    // The events pane says why it has no stream, instead of reconnecting.
    browser
        .wait_text("stream", "the stream asking for a token", |t| {
            t.contains("enter an access token")
        })
        .await;
    let enter = format!(
        "document.getElementById('token').value = {}; document.getElementById('auth').requestSubmit();",
        json!(viewer)
    );
    browser
        .command(
            reqwest::Method::POST,
            "/execute/sync",
            json!({"script": enter, "args": []}),
        )
        .await;
    let locks = browser
        .wait_text("locks", "the lock the token may read", |t| {
            t.contains("jobs/visible")
        })
        .await;
    assert!(!locks.contains("payments/hidden"), "{locks}");
    browser
        .wait_text("stream", "the event stream connected", |t| t == "live")
        .await;
    as_root(
        reqwest::Method::POST,
        "/v1/acquire",
        json!({"key": "jobs/streamed", "ttl_ms": 60_000}),
    )
    .await
    .expect("acquire");
    browser
        .wait_text("events", "the acquired event", |t| {
            t.contains("jobs/streamed")
        })
        .await;
}

/// The line of `text` (a table's) that contains every one of `words`.
fn line_with<'a>(text: &'a str, words: &[&str]) -> Option<&'a str> {
    text.lines().find(|l| words.iter().all(|w| l.contains(w)))
}

/// Whether a cell of this table line reads as minutes and seconds, the way
/// the CLI prints a TTL: `9m58s`.
fn has_minutes(line: &str) -> bool {
    line.split_whitespace().any(|w| {
        w.strip_suffix('s')
            .and_then(|w| w.split_once('m'))
            .is_some_and(|(m, s)| {
                !m.is_empty()
                    && m.bytes().all(|b| b.is_ascii_digit())
                    && s.len() == 2
                    && s.bytes().all(|b| b.is_ascii_digit())
            })
    })
}

/// What happened before the page loaded is in the events pane, at the time
/// the server gave it; a key that only keeps a checkpoint is listed only
/// when free keys are asked for; a ten-minute TTL reads `9m5Xs`; a lease in
/// line names the key it waits for.
#[tokio::test]
async fn the_dashboard_shows_history_held_keys_ttls_and_waits() {
    let server = Leaseholdd::start();
    // Before the page loads: a key that is taken, given a checkpoint and
    // released (it keeps only the checkpoint), one held for ten minutes, and
    // a lease in line for that one.
    let (_, taken) = common::post(
        &server.addr,
        "/v1/acquire",
        json!({"key": "elections/web", "ttl_ms": 60_000, "holder": "candidate-1"}),
    )
    .await;
    let fence = taken["fence"].as_u64().expect("a fence");
    let (_, saved) = common::post(
        &server.addr,
        "/v1/checkpoint",
        json!({"key": "elections/web", "fence": fence, "data": "10.0.0.7"}),
    )
    .await;
    assert!(saved.get("error").is_none(), "{saved}");
    let (_, released) = common::post(
        &server.addr,
        "/v1/release",
        json!({"key": "elections/web", "fence": fence}),
    )
    .await;
    assert!(released.get("error").is_none(), "{released}");
    let (_, held) = common::post(
        &server.addr,
        "/v1/acquire",
        json!({"key": "jobs/long", "ttl_ms": 600_000, "holder": "long-runner"}),
    )
    .await;
    assert!(held.get("error").is_none(), "{held}");
    let addr = server.addr.clone();
    tokio::spawn(async move {
        common::post(
            &addr,
            "/v1/acquire",
            json!({"key": "jobs/long", "ttl_ms": 60_000, "holder": "patient", "wait_ms": 600_000}),
        )
        .await
    });
    let history: Value = reqwest::get(format!("http://{}/v1/events", server.addr))
        .await
        .expect("events")
        .json()
        .await
        .expect("events answer");
    let released_at = history["events"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["kind"] == "released" && e["key"] == "elections/web")
        .and_then(|e| e["at_unix_ms"].as_u64())
        .unwrap_or_else(|| panic!("the release is not in the history: {history}"));

    let browser = Browser::start().await;
    browser.open(&format!("http://{}/ui", server.addr)).await;
    let events = browser
        .wait_text("events", "the events from before the page loaded", |t| {
            line_with(t, &["released", "elections/web"]).is_some()
        })
        .await;
    // The time is the server's, as this browser writes it.
    let clock = browser
        .run(&format!(
            "return new Date({released_at}).toLocaleTimeString()"
        ))
        .await;
    let clock = clock.as_str().expect("a time");
    let release = line_with(&events, &["released", "elections/web"]).unwrap_or_default();
    assert!(release.contains(clock), "no {clock} in: {events}");
    assert!(
        line_with(&events, &["checkpoint", "elections/web"]).is_some(),
        "{events}"
    );
    browser
        .wait_text("stream", "the event stream connected", |t| t == "live")
        .await;
    // Shown once, though the stream connected before the history came.
    let events = browser.text("events").await;
    let acquired = events
        .lines()
        .filter(|l| l.contains("acquired") && l.contains("jobs/long"))
        .count();
    assert_eq!(acquired, 1, "{events}");

    // Held keys only, by default; the TTL left in minutes and seconds.
    let locks = browser
        .wait_text("locks", "the held key", |t| t.contains("jobs/long"))
        .await;
    assert!(
        !locks.contains("elections/web"),
        "a key with only a checkpoint is listed: {locks}"
    );
    let long = line_with(&locks, &["jobs/long"]).unwrap_or_default();
    assert!(long.contains("9m") && has_minutes(long), "{locks}");
    assert!(!long.contains(" s"), "{locks}");

    // The waiting lease names the key it waits for; TTLs as the CLI writes them.
    let leases = browser
        .wait_text("leases", "the key the waiting lease waits for", |t| {
            line_with(t, &["patient", "jobs/long"]).is_some()
        })
        .await;
    let runner = line_with(&leases, &["long-runner"]).unwrap_or_default();
    assert!(
        runner.contains("10m00s") && runner.contains("9m"),
        "{leases}"
    );

    // Free keys when asked for: the one that keeps a checkpoint.
    browser
        .run("document.getElementById('show-free').click()")
        .await;
    let locks = browser
        .wait_text("locks", "the free key that keeps a checkpoint", |t| {
            t.contains("elections/web")
        })
        .await;
    let free = line_with(&locks, &["elections/web"]).unwrap_or_default();
    assert!(
        free.contains("(free)") && free.contains("checkpoint"),
        "{locks}"
    );
}

/// A follower's page says where the leader's is, with a link to it; its
/// lock and lease tables say the leader serves them, and its events pane
/// shows the group's events. The leader's page shows every member reachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followers_dashboard_links_to_the_leaders() {
    let _serial = common::serial().await;
    let c = Cluster::start(3);
    let leader = c.wait_leader();
    let at_leader = c.nodes[leader].addr.clone();
    let follower = c.nodes[(leader + 1) % c.nodes.len()].addr.clone();
    let (_, taken) = common::post(
        &at_leader,
        "/v1/acquire",
        json!({"key": "jobs/at-leader", "ttl_ms": 60_000, "holder": "worker-1"}),
    )
    .await;
    assert!(taken.get("error").is_none(), "{taken}");

    let browser = Browser::start().await;
    browser.open(&format!("http://{follower}/ui")).await;
    let dashboard = format!("http://{at_leader}/ui");
    let said = browser
        .wait_text("follower", "the leader's dashboard", |t| {
            t.contains(&dashboard)
        })
        .await;
    assert!(said.contains("This node is a follower"), "{said}");
    let href = browser
        .run("return document.querySelector('#follower a').href")
        .await;
    assert_eq!(href, json!(dashboard));
    browser
        .wait_text("locks", "locks served by the leader", |t| {
            t.contains("served by the leader") && t.contains(&dashboard)
        })
        .await;
    browser
        .wait_text("leases", "leases served by the leader", |t| {
            t.contains("served by the leader")
        })
        .await;
    browser
        .wait_text("events", "the group's events", |t| {
            t.contains("acquired") && t.contains("jobs/at-leader")
        })
        .await;

    browser.open(&format!("http://{at_leader}/ui")).await;
    browser
        .wait_text("cluster", "every member reachable", |t| {
            t.lines().filter(|l| l.contains("\tyes")).count() == 3
        })
        .await;
    let hidden = browser
        .run("return ['follower', 'quorum'].map((id) => document.getElementById(id).hidden)")
        .await;
    assert_eq!(hidden, json!([true, true]), "a leader with its quorum");
}

/// Holders, waiters and leases enough to look like a working deployment.
async fn populate(addr: &str) {
    let keys = [
        ("jobs/reindex", "indexer-2"),
        ("jobs/backup", "cron@db-1"),
        ("payments/settle", "settler-a"),
        ("reports/daily", "reporter-3"),
        ("schedulers/leader", "scheduler-b"),
    ];
    for (key, holder) in keys {
        common::post(
            addr,
            "/v1/acquire",
            json!({"key": key, "ttl_ms": 30_000, "holder": holder}),
        )
        .await;
    }
    // A waiter in line for one of them.
    let addr = addr.to_string();
    tokio::spawn(async move {
        common::post(
            &addr,
            "/v1/acquire",
            json!({"key": "jobs/reindex", "ttl_ms": 30_000, "holder": "indexer-5", "wait_ms": 20_000}),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
}
