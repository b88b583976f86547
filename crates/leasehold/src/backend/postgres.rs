//! PostgreSQL — `Correctness`.
//!
//! Leases are rows judged by the database's own clock (`clock_timestamp()`),
//! so client clocks never decide who holds a lock. Fencing tokens come from a
//! sequence, which never hands out a value twice. Acquire, renew, release and
//! checkpoint are each one ownership-checked statement. A lock-delay is kept
//! in the row: after its holder's lease expires, nobody takes the key until
//! the delay has passed too; a release deletes the row and leaves none. A
//! waiting acquire retries with jittered, bounded backoff (10–160 ms), not a
//! hot loop.
//!
//! The schema is created on first use (see [`SCHEMA`]), under an advisory lock
//! so that many clients starting at once do not race.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client as PgClient, NoTls};

use super::backoff;
use super::{Acquired, Backend, Guarantee, Hold, LockOptions, LockStatus};
use crate::keeper::{Keeper, RenewError};
use crate::{Error, Fence, Result};

/// The tables and sequence the backend uses; created if missing.
pub const SCHEMA: &str = "
CREATE SEQUENCE IF NOT EXISTS leasehold_fence;
CREATE TABLE IF NOT EXISTS leasehold_locks (
    key        text PRIMARY KEY,
    owner      text NOT NULL,
    holder     text NOT NULL,
    fence      bigint NOT NULL,
    ttl_ms     bigint NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS leasehold_checkpoints (
    key   text PRIMARY KEY,
    fence bigint NOT NULL,
    data  bytea NOT NULL
);
ALTER TABLE leasehold_locks ADD COLUMN IF NOT EXISTS delay_ms bigint NOT NULL DEFAULT 0;
";

/// Takes the key if it has no row, or its holder's lease expired and that
/// holder's lock-delay has passed too (a release deletes the row: no delay).
const ACQUIRE: &str = "
INSERT INTO leasehold_locks (key, owner, holder, fence, ttl_ms, expires_at, delay_ms)
VALUES ($1, $2, $3, nextval('leasehold_fence'), $4::bigint, clock_timestamp() + $4::bigint::float8 * interval '1 millisecond', $5::bigint)
ON CONFLICT (key) DO UPDATE
    SET owner = EXCLUDED.owner, holder = EXCLUDED.holder, fence = EXCLUDED.fence,
        ttl_ms = EXCLUDED.ttl_ms, expires_at = EXCLUDED.expires_at, delay_ms = EXCLUDED.delay_ms
    WHERE leasehold_locks.expires_at + leasehold_locks.delay_ms::float8 * interval '1 millisecond'
        <= clock_timestamp()
RETURNING fence, (SELECT data FROM leasehold_checkpoints c WHERE c.key = $1)";

const RENEW: &str = "
UPDATE leasehold_locks SET expires_at = clock_timestamp() + ttl_ms::float8 * interval '1 millisecond'
WHERE key = $1 AND fence = $2 AND expires_at > clock_timestamp()";

const RELEASE: &str = "DELETE FROM leasehold_locks WHERE key = $1 AND fence = $2";

const CHECKPOINT: &str = "
INSERT INTO leasehold_checkpoints (key, fence, data)
SELECT $1, $2, $3 WHERE EXISTS (
    SELECT 1 FROM leasehold_locks WHERE key = $1 AND fence = $2 AND expires_at > clock_timestamp())
ON CONFLICT (key) DO UPDATE SET fence = EXCLUDED.fence, data = EXCLUDED.data";

/// The PostgreSQL backend: a few connections used round-robin.
pub struct Postgres {
    pool: Arc<Vec<PgClient>>,
    next: AtomicUsize,
}

/// An error of a statement: the database's refusal by its SQLSTATE, or a
/// connection that failed or closed (nothing to say it acted).
fn db_error(e: tokio_postgres::Error) -> Error {
    match e.as_db_error() {
        Some(db) => refusal(db.code(), db.message()),
        None => Error::Unavailable(format!("postgres: {e}")),
    }
}

/// What the database's refusal with `code` asks of the caller.
fn refusal(code: &SqlState, message: &str) -> Error {
    match code.code().get(..2).unwrap_or_default() {
        // A connection exception, a server shutting down or starting up, a
        // statement cancelled, or a transaction rolled back (serialization
        // failure, deadlock): nothing was done, and trying again may work.
        "40" if *code == SqlState::T_R_STATEMENT_COMPLETION_UNKNOWN => {
            Error::OutcomeUnknown(format!("postgres: {message}"))
        }
        "08" | "57" | "40" => Error::Unavailable(format!("postgres: {message}")),
        // A standby after a failover, say: no writes here.
        "25" if *code == SqlState::READ_ONLY_SQL_TRANSACTION => Error::Unavailable(format!(
            "postgres: {message}: this server takes no writes (a standby?): point the URL at the primary"
        )),
        // Out of disk, memory or connections.
        "53" => Error::ResourceExhausted {
            backend: "postgres",
            reason: message.to_string(),
        },
        "28" => Error::Unauthenticated(format!(
            "postgres: {message}: check the user and password in the URL"
        )),
        "42" if *code == SqlState::INSUFFICIENT_PRIVILEGE => Error::PermissionDenied(format!(
            "postgres: {message}: the user needs to create and write the leasehold_* tables and sequence"
        )),
        "3D" => Error::InvalidArgument(format!(
            "postgres: {message}: create the database or name another in the URL"
        )),
        _ => Error::Other(format!("postgres: {message}")),
    }
}

impl Postgres {
    /// Connects to `postgres://user@host:port/db`. `?pool=N` sets how many
    /// connections to open (default 4).
    pub async fn connect(url: &str) -> Result<Postgres> {
        let (url, size) = match url.split_once("pool=") {
            Some((base, n)) => {
                let n: usize = n
                    .split('&')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| Error::InvalidArgument(format!("bad pool size in {url:?}")))?;
                (
                    base.trim_end_matches(['?', '&']).to_string(),
                    n.clamp(1, 64),
                )
            }
            None => (url.to_string(), 4),
        };
        let mut pool = Vec::with_capacity(size);
        for _ in 0..size {
            let (client, connection) =
                tokio::time::timeout(Duration::from_secs(5), tokio_postgres::connect(&url, NoTls))
                    .await
                    .map_err(|_| Error::Unavailable("postgres: connect timed out".into()))?
                    .map_err(|e| match e.as_db_error() {
                        Some(db) => refusal(db.code(), db.message()),
                        None => Error::Unavailable(format!("postgres at {url}: {e}")),
                    })?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "postgres connection ended");
                }
            });
            pool.push(client);
        }
        let first = &pool[0];
        first
            .batch_execute(&format!(
                "BEGIN; SELECT pg_advisory_xact_lock(7419); {SCHEMA} COMMIT;"
            ))
            .await
            .map_err(db_error)?;
        Ok(Postgres {
            pool: Arc::new(pool),
            next: AtomicUsize::new(0),
        })
    }

    /// Who keeps `key` from us: its holder, or the lock-delay after an
    /// expired holder.
    async fn held(&self, key: &str) -> Result<Error> {
        let row = self
            .conn()
            .query_opt(
                "SELECT holder, fence, expires_at > clock_timestamp(),
                        GREATEST(0, EXTRACT(EPOCH FROM expires_at + delay_ms::float8 * interval '1 millisecond'
                                                      - clock_timestamp()) * 1000)::bigint
                 FROM leasehold_locks WHERE key = $1",
                &[&key],
            )
            .await
            .map_err(db_error)?;
        let key = key.to_string();
        Ok(match row {
            Some(r) if !r.get::<_, bool>(2) => {
                Error::lock_delayed(&key, u64::try_from(r.get::<_, i64>(3)).unwrap_or(0))
            }
            Some(r) => Error::Held {
                key,
                holder: r.get(0),
                fence: Some(r.get::<_, i64>(1) as Fence),
            },
            // Released since the try.
            None => Error::Held {
                key,
                holder: String::new(),
                fence: None,
            },
        })
    }

    fn conn(&self) -> &PgClient {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.pool.len();
        &self.pool[i]
    }
}

#[async_trait::async_trait]
impl Backend for Postgres {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn guarantee(&self) -> Guarantee {
        Guarantee::Correctness
    }

    async fn acquire(
        &self,
        key: &str,
        holder: &str,
        opts: &LockOptions,
        wait: Option<Duration>,
    ) -> Result<Acquired> {
        let ttl_ms = i64::try_from(opts.ttl.as_millis()).unwrap_or(i64::MAX);
        let delay_ms = i64::try_from(opts.lock_delay.as_millis()).unwrap_or(i64::MAX);
        let owner = format!("{:016x}", rand::random::<u64>());
        let give_up = Instant::now() + wait.unwrap_or_default();
        let mut attempt = 0;
        loop {
            let sent_at = Instant::now();
            let row = self
                .conn()
                .query_opt(ACQUIRE, &[&key, &owner, &holder, &ttl_ms, &delay_ms])
                .await
                .map_err(db_error)?;
            if let Some(row) = row {
                let fence = row.get::<_, i64>(0) as Fence;
                let checkpoint: Option<Vec<u8>> = row.get(1);
                let (pool, k) = (self.pool.clone(), key.to_string());
                let keeper = Keeper::spawn(opts.ttl, sent_at, move || {
                    let (pool, k) = (pool.clone(), k.clone());
                    async move {
                        match pool[0].execute(RENEW, &[&k, &(fence as i64)]).await {
                            Ok(1) => Ok(()),
                            Ok(_) => Err(RenewError::Lost(
                                "the lease row expired or was taken".into(),
                            )),
                            Err(e) => Err(RenewError::Transient(e.to_string())),
                        }
                    }
                });
                return Ok(Acquired {
                    fence: Some(fence),
                    checkpoint,
                    liveness: keeper.liveness().clone(),
                    hold: Box::new(PostgresHold {
                        pool: self.pool.clone(),
                        key: key.to_string(),
                        fence,
                        keeper,
                    }),
                });
            }
            if wait.is_none() {
                return Err(self.held(key).await?);
            }
            if !backoff(&mut attempt, give_up).await {
                return Err(Error::Timeout {
                    key: key.to_string(),
                });
            }
        }
    }

    fn supports_lock_delay(&self) -> bool {
        true
    }

    async fn status(&self, prefix: &str) -> Result<Vec<LockStatus>> {
        let rows = self
            .conn()
            .query(
                "SELECT key, holder, fence, GREATEST(0, (EXTRACT(EPOCH FROM expires_at - clock_timestamp()) * 1000))::bigint
                 FROM leasehold_locks WHERE starts_with(key, $1) AND expires_at > clock_timestamp() ORDER BY key",
                &[&prefix],
            )
            .await
            .map_err(db_error)?;
        Ok(rows
            .iter()
            .map(|r| {
                let (holder, fence): (String, i64) = (r.get(1), r.get(2));
                LockStatus {
                    key: r.get(0),
                    holders: vec![(holder.clone(), fence as Fence)],
                    holder,
                    fence: Some(fence as Fence),
                    lease: None,
                    ttl_left_ms: r.get::<_, i64>(3) as u64,
                    waiters: 0,
                    permits: 0,
                    shared: false,
                    checkpoint: None,
                }
            })
            .collect())
    }

    async fn release_by_fence(&self, key: &str, fence: Fence) -> Result<()> {
        release(&self.pool[0], key, fence).await
    }
}

async fn release(conn: &PgClient, key: &str, fence: Fence) -> Result<()> {
    if conn
        .execute(RELEASE, &[&key, &(fence as i64)])
        .await
        .map_err(db_error)?
        == 1
    {
        return Ok(());
    }
    let current = conn
        .query_opt(
            "SELECT fence FROM leasehold_locks WHERE key = $1 AND expires_at > clock_timestamp()",
            &[&key],
        )
        .await
        .map_err(db_error)?
        .map(|r| r.get::<_, i64>(0) as Fence);
    Err(Error::StaleFence {
        presented: fence,
        current,
    })
}

struct PostgresHold {
    pool: Arc<Vec<PgClient>>,
    key: String,
    fence: Fence,
    keeper: Keeper,
}

#[async_trait::async_trait]
impl Hold for PostgresHold {
    async fn release(self: Box<Self>) -> Result<()> {
        self.keeper.stop().await;
        release(&self.pool[0], &self.key, self.fence).await
    }

    async fn save_checkpoint(&self, data: &[u8]) -> Result<()> {
        let n = self.pool[0]
            .execute(CHECKPOINT, &[&self.key, &(self.fence as i64), &data])
            .await
            .map_err(db_error)?;
        if n == 1 {
            Ok(())
        } else {
            Err(Error::StaleFence {
                presented: self.fence,
                current: None,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The variant, by name.
    fn kind(e: &Error) -> &'static str {
        match e {
            Error::ResourceExhausted {
                backend: "postgres",
                ..
            } => "resource_exhausted",
            Error::Unavailable(_) => "unavailable",
            Error::OutcomeUnknown(_) => "outcome_unknown",
            Error::Unauthenticated(_) => "unauthenticated",
            Error::PermissionDenied(_) => "permission_denied",
            Error::InvalidArgument(_) => "invalid_argument",
            Error::Other(_) => "other",
            _ => "something else",
        }
    }

    #[test]
    fn refusals_a_caller_acts_on_are_typed() {
        let cases = [
            (SqlState::TOO_MANY_CONNECTIONS, "resource_exhausted"),
            (SqlState::DISK_FULL, "resource_exhausted"),
            (SqlState::T_R_SERIALIZATION_FAILURE, "unavailable"),
            (
                SqlState::T_R_STATEMENT_COMPLETION_UNKNOWN,
                "outcome_unknown",
            ),
            (SqlState::ADMIN_SHUTDOWN, "unavailable"),
            (SqlState::READ_ONLY_SQL_TRANSACTION, "unavailable"),
            (SqlState::INVALID_PASSWORD, "unauthenticated"),
            (SqlState::INSUFFICIENT_PRIVILEGE, "permission_denied"),
            (SqlState::INVALID_CATALOG_NAME, "invalid_argument"),
            (SqlState::UNIQUE_VIOLATION, "other"),
        ];
        for (code, expected) in cases {
            let mapped = refusal(&code, "the database says no");
            assert_eq!(kind(&mapped), expected, "{code:?}: {mapped:?}");
        }
    }
}
