//! The same conformance tests for every gate, on real stores.

use std::sync::{Arc, Mutex};

use leasehold_fence::http::{FenceLayer, FENCING_RESOURCE, FENCING_TOKEN};
use leasehold_fence::{FenceGate, FileGate, GateError, MemoryGate, PostgresGate, RedisGate, Stale};

const WRITERS: usize = 16;
const WRITES: usize = 12;

fn resource(name: &str) -> String {
    format!("{name}-{:016x}", rand::random::<u64>())
}

/// Tokens for one writer: mostly rising, with stale ones mixed in.
fn tokens(writer: usize) -> Vec<u64> {
    (0..WRITES)
        .map(|i| (i * 3 + writer % 5) as u64 + if i % 4 == 0 { 0 } else { 2 })
        .collect()
}

/// Equal tokens pass; a lower one is refused with both numbers and changes nothing.
async fn basics(gate: &dyn FenceGate, r: &str) {
    gate.admit(r, 10).await.unwrap();
    gate.admit(r, 10)
        .await
        .expect("the same holder writes again");
    match gate.admit(r, 9).await {
        Err(GateError::Stale(Stale {
            presented, highest, ..
        })) => assert_eq!((presented, highest), (9, 10)),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        gate.highest(r).await.unwrap(),
        10,
        "a refused write changed the gate"
    );
    gate.admit(r, 11).await.unwrap();
    assert_eq!(gate.highest(r).await.unwrap(), 11);
}

fn assert_never_decreases(landed: &[u64], refused: usize) {
    assert!(!landed.is_empty());
    assert!(refused > 0, "the mix should include stale writes");
    for w in landed.windows(2) {
        assert!(
            w[0] <= w[1],
            "token {} landed after {}: {landed:?}",
            w[1],
            w[0]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_gate() {
    let gate = Arc::new(MemoryGate::new());
    basics(gate.as_ref(), &resource("basics")).await;
    let (r, landed) = (resource("ledger"), Arc::new(Mutex::new(Vec::new())));
    let refused = Arc::new(Mutex::new(0));
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let (gate, r, landed, refused) = (gate.clone(), r.clone(), landed.clone(), refused.clone());
        tasks.push(std::thread::spawn(move || {
            for t in tokens(w) {
                match gate.admit_with(&r, t, || landed.lock().unwrap().push(t)) {
                    Ok(()) => {}
                    Err(_) => *refused.lock().unwrap() += 1,
                }
            }
        }));
    }
    tasks.into_iter().for_each(|t| t.join().unwrap());
    assert_never_decreases(&landed.lock().unwrap(), *refused.lock().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_gate() {
    let gate = Arc::new(
        RedisGate::connect("redis://127.0.0.1:6379")
            .await
            .expect("redis on 127.0.0.1:6379"),
    );
    basics(gate.as_ref(), &resource("basics")).await;
    let r = resource("ledger");
    let list = format!("test:landed:{r}");
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let (gate, r, list) = (gate.clone(), r.clone(), list.clone());
        tasks.push(tokio::spawn(async move {
            let mut refused = 0;
            for t in tokens(w) {
                match gate
                    .admit_and_write(&r, t, "RPUSH", &list, &[&t.to_string()])
                    .await
                {
                    Ok(()) => {}
                    Err(GateError::Stale(_)) => refused += 1,
                    Err(e) => panic!("{e}"),
                }
            }
            refused
        }));
    }
    let mut refused = 0;
    for t in tasks {
        refused += t.await.unwrap();
    }
    let client = redis::Client::open("redis://127.0.0.1:6379").unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let landed: Vec<u64> = redis::cmd("LRANGE")
        .arg(&list)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("DEL")
        .arg(&list)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(landed.len() + refused, WRITERS * WRITES);
    assert_never_decreases(&landed, refused);
}

async fn pg() -> tokio_postgres::Client {
    let (client, conn) =
        tokio_postgres::connect("postgres://root@127.0.0.1:5432/test", tokio_postgres::NoTls)
            .await
            .expect("postgres on 127.0.0.1:5432");
    tokio::spawn(conn);
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_gate() {
    let gate = PostgresGate::new(pg().await).await.unwrap();
    basics(&gate, &resource("basics")).await;
    let setup = pg().await;
    let log = format!("landed_{:x}", rand::random::<u32>());
    setup
        .batch_execute(&format!(
            "CREATE TABLE {log} (id bigserial PRIMARY KEY, fence bigint NOT NULL)"
        ))
        .await
        .unwrap();
    let r = resource("ledger");
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let (r, log) = (r.clone(), log.clone());
        tasks.push(tokio::spawn(async move {
            let mut db = pg().await;
            let mut refused = 0;
            for t in tokens(w) {
                // The user's write and the fence check commit together.
                let tx = db.transaction().await.unwrap();
                match PostgresGate::admit_in(&tx, &r, t).await {
                    Ok(()) => {
                        tx.execute(
                            &format!("INSERT INTO {log} (fence) VALUES ($1)"),
                            &[&(t as i64)],
                        )
                        .await
                        .unwrap();
                        tx.commit().await.unwrap();
                    }
                    Err(GateError::Stale(_)) => refused += 1,
                    Err(e) => panic!("{e}"),
                }
            }
            refused
        }));
    }
    let mut refused = 0;
    for t in tasks {
        refused += t.await.unwrap();
    }
    let landed: Vec<u64> = setup
        .query(&format!("SELECT fence FROM {log} ORDER BY id"), &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get::<_, i64>(0) as u64)
        .collect();
    setup
        .batch_execute(&format!("DROP TABLE {log}"))
        .await
        .unwrap();
    assert_eq!(landed.len() + refused, WRITERS * WRITES);
    assert_never_decreases(&landed, refused);
}

#[tokio::test]
async fn postgres_column_pattern() {
    let db = pg().await;
    let table = format!("accounts_{:x}", rand::random::<u32>());
    db.batch_execute(&format!(
        "CREATE TABLE {table} (id int PRIMARY KEY, balance bigint NOT NULL, fence bigint NOT NULL DEFAULT 0);
         INSERT INTO {table} (id, balance) VALUES (7, 100);"
    ))
    .await
    .unwrap();
    let update =
        format!("UPDATE {table} SET balance = $1, fence = $2 WHERE id = $3 AND fence <= $2");
    let current = format!("SELECT fence FROM {table} WHERE id = $1");
    PostgresGate::fenced_update(
        &db,
        "account:7",
        34,
        &update,
        &[&130i64, &34i64, &7i32],
        &current,
        &[&7i32],
    )
    .await
    .expect("fence 34 admitted");
    let err = PostgresGate::fenced_update(
        &db,
        "account:7",
        33,
        &update,
        &[&150i64, &33i64, &7i32],
        &current,
        &[&7i32],
    )
    .await
    .expect_err("fence 33 is stale");
    assert_eq!(err.to_string(), "stale fence 33 < 34 for \"account:7\"");
    let balance: i64 = db
        .query_one(&format!("SELECT balance FROM {table} WHERE id = 7"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(balance, 130, "the stale write landed");
    db.batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn file_gate() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(FileGate::new(dir.path()).unwrap());
    basics(gate.as_ref(), "basics").await;
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let gate = gate.clone();
        tasks.push(tokio::spawn(async move {
            let (mut refused, mut highest_written) = (0, 0);
            for t in tokens(w) {
                match gate
                    .write("report.csv", t, format!("written with {t}\n").into_bytes())
                    .await
                {
                    Ok(()) => highest_written = highest_written.max(t),
                    Err(GateError::Stale(s)) => {
                        assert!(s.presented < s.highest);
                        refused += 1;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            (refused, highest_written)
        }));
    }
    let (mut refused, mut max) = (0, 0);
    for t in tasks {
        let (r, m) = t.await.unwrap();
        refused += r;
        max = max.max(m);
    }
    assert!(refused > 0);
    let content = std::fs::read_to_string(dir.path().join("report.csv")).unwrap();
    assert_eq!(
        content,
        format!("written with {max}\n"),
        "a lower token's file replaced a higher one's"
    );
    assert_eq!(gate.highest("report.csv").await.unwrap(), max);
    assert!(gate.write("../escape", 1, vec![]).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn http_layer() {
    use axum::routing::post;
    let landed = Arc::new(Mutex::new(Vec::<u64>::new()));
    let l = landed.clone();
    let app = axum::Router::new()
        .route(
            "/ledger",
            post(move |headers: axum::http::HeaderMap| {
                let l = l.clone();
                async move {
                    let t: u64 = headers[FENCING_TOKEN].to_str().unwrap().parse().unwrap();
                    tokio::task::yield_now().await; // let others try to overtake
                    l.lock().unwrap().push(t);
                    "ok"
                }
            })
            .get(|| async { "read" }),
        )
        .layer(FenceLayer::new(Arc::new(MemoryGate::new())));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/ledger", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let http = reqwest::Client::new();
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let (http, url) = (http.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let mut refused = 0;
            for t in tokens(w) {
                let r = http
                    .post(&url)
                    .header(FENCING_TOKEN, t.to_string())
                    .send()
                    .await
                    .unwrap();
                match r.status().as_u16() {
                    200 => {}
                    409 => {
                        let body: serde_json::Value = r.json().await.unwrap();
                        assert_eq!(body["error"]["code"], "stale_fence");
                        assert_eq!(body["error"]["presented"], t);
                        assert!(body["error"]["highest"].as_u64().unwrap() > t);
                        refused += 1;
                    }
                    s => panic!("status {s}"),
                }
            }
            refused
        }));
    }
    let mut refused = 0;
    for t in tasks {
        refused += t.await.unwrap();
    }
    assert_never_decreases(&landed.lock().unwrap(), refused);

    assert_eq!(
        http.get(&url).send().await.unwrap().status(),
        200,
        "reads need no token"
    );
    assert_eq!(
        http.post(&url).send().await.unwrap().status(),
        428,
        "a write without a token"
    );
    let bad = http
        .post(&url)
        .header(FENCING_TOKEN, "soon")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let other = http
        .post(&url)
        .header(FENCING_TOKEN, "1")
        .header(FENCING_RESOURCE, "other")
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 200, "resources are fenced separately");
}
