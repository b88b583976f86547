//! Runs every SQL block of docs/when-not-to-lock.md against PostgreSQL, each
//! page in a fresh schema, and checks the SKIP LOCKED claim with two workers.

use tokio_postgres::{Client, NoTls};

async fn connect() -> Client {
    let (client, conn) = tokio_postgres::connect("postgres://root@127.0.0.1:5432/test", NoTls)
        .await
        .expect("postgres on 127.0.0.1:5432");
    tokio::spawn(conn);
    client
}

fn sql_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```sql") => current = Some(String::new()),
            (Some(block), "```") => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            (Some(block), l) => {
                block.push_str(l);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

async fn fresh_schema(db: &Client) -> String {
    let schema = format!("doc_{:016x}", rand::random::<u64>());
    db.batch_execute(&format!(
        "CREATE SCHEMA {schema}; SET search_path TO {schema};"
    ))
    .await
    .unwrap();
    schema
}

#[tokio::test]
async fn every_sql_example_on_the_page_runs_and_holds() {
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/when-not-to-lock.md"
    ))
    .unwrap();
    let blocks = sql_blocks(&page);
    assert_eq!(blocks.len(), 4, "expected the four examples");
    let db = connect().await;
    let schema = fresh_schema(&db).await;
    for (i, block) in blocks.iter().enumerate() {
        db.batch_execute(block).await.unwrap_or_else(|e| {
            panic!(
                "example {} failed: {}\n{block}",
                i + 1,
                e.as_db_error()
                    .map_or(e.to_string(), |d| d.message().to_string())
            )
        });
    }
    db.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}

#[tokio::test]
async fn two_workers_with_skip_locked_never_claim_the_same_job() {
    let setup = connect().await;
    let schema = fresh_schema(&setup).await;
    setup
        .batch_execute(
            "CREATE TABLE jobs (id bigserial PRIMARY KEY, payload text NOT NULL, done boolean NOT NULL DEFAULT false);
             INSERT INTO jobs (payload) SELECT 'job ' || n FROM generate_series(1, 10) AS n;",
        )
        .await
        .unwrap();
    let claim = "SELECT id FROM jobs WHERE NOT done ORDER BY id LIMIT 3 FOR UPDATE SKIP LOCKED";
    let (mut a, mut b) = (connect().await, connect().await);
    for c in [&a, &b] {
        c.batch_execute(&format!("SET search_path TO {schema}"))
            .await
            .unwrap();
    }
    let ta = a.transaction().await.unwrap();
    let tb = b.transaction().await.unwrap();
    let ids = |rows: Vec<tokio_postgres::Row>| {
        rows.iter().map(|r| r.get::<_, i64>(0)).collect::<Vec<_>>()
    };
    let first = ids(ta.query(claim, &[]).await.unwrap());
    let second = ids(tb.query(claim, &[]).await.unwrap());
    assert_eq!(first, vec![1, 2, 3]);
    assert_eq!(
        second,
        vec![4, 5, 6],
        "the second worker waited or overlapped"
    );
    // A worker that dies (its transaction rolls back) gives its jobs back.
    // Rolled back and waited for: a dropped transaction's ROLLBACK is sent in
    // the background and could reach the server after the next claim.
    ta.rollback().await.unwrap();
    tb.commit().await.unwrap();
    let again = ids(setup.query(claim, &[]).await.unwrap());
    assert_eq!(again, vec![1, 2, 3]);
    setup
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}
