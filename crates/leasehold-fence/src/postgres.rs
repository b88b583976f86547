//! PostgreSQL: fence checks in the same statement or transaction as the write.
//!
//! Two ways, both atomic with the write:
//! - **Your own column.** Put a `fence bigint` on the rows you protect and make
//!   every write conditional: `UPDATE accounts SET balance = $1, fence = $2
//!   WHERE id = $3 AND fence <= $2`. Zero rows means a newer holder wrote;
//!   [`PostgresGate::fenced_update`] runs such a statement and tells you which.
//! - **A gate table** `leasehold_fences(resource, highest)` for resources without
//!   a column: [`PostgresGate::admit_in`] checks and raises the token inside your
//!   transaction, so your write commits only with an admitted token.

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, GenericClient};

use crate::{Fence, FenceGate, GateError, Stale};

/// The gate table, created by [`PostgresGate::create_schema`].
pub const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS leasehold_fences (resource text PRIMARY KEY, highest bigint NOT NULL)";

const ADMIT: &str = "
INSERT INTO leasehold_fences (resource, highest) VALUES ($1, $2)
ON CONFLICT (resource) DO UPDATE SET highest = EXCLUDED.highest
    WHERE leasehold_fences.highest <= EXCLUDED.highest
RETURNING highest";

/// A fence gate in PostgreSQL.
pub struct PostgresGate {
    client: Client,
}

fn store(e: tokio_postgres::Error) -> GateError {
    GateError::Store(
        e.as_db_error()
            .map_or_else(|| e.to_string(), |d| d.message().to_string()),
    )
}

impl PostgresGate {
    /// A gate over `client`; creates the gate table if missing.
    pub async fn new(client: Client) -> Result<Self, GateError> {
        Self::create_schema(&client).await?;
        Ok(PostgresGate { client })
    }

    /// Creates `leasehold_fences` if it does not exist.
    pub async fn create_schema(client: &impl GenericClient) -> Result<(), GateError> {
        client
            .execute("SELECT pg_advisory_xact_lock(7420)", &[])
            .await
            .map_err(store)?;
        client.execute(SCHEMA, &[]).await.map_err(store)?;
        Ok(())
    }

    /// Checks and raises the token for `resource` inside the caller's
    /// transaction (or on any client). The row stays locked until the
    /// transaction ends, so concurrent writers to the same resource go one at
    /// a time and a lower token can never commit after a higher one.
    pub async fn admit_in(
        db: &impl GenericClient,
        resource: &str,
        fence: Fence,
    ) -> Result<(), GateError> {
        let presented = i64::try_from(fence)
            .map_err(|_| GateError::Store(format!("fence {fence} does not fit a bigint")))?;
        if db
            .query_opt(ADMIT, &[&resource, &presented])
            .await
            .map_err(store)?
            .is_some()
        {
            return Ok(());
        }
        let highest: i64 = db
            .query_one(
                "SELECT highest FROM leasehold_fences WHERE resource = $1",
                &[&resource],
            )
            .await
            .map_err(store)?
            .get(0);
        Err(Stale {
            resource: resource.to_string(),
            presented: fence,
            highest: highest as Fence,
        }
        .into())
    }

    /// Runs a conditional write such as `UPDATE t SET v = $1, fence = $2 WHERE
    /// id = $3 AND fence <= $2`. If it touched no row, reads the current fence
    /// with `current_sql` (e.g. `SELECT fence FROM t WHERE id = $1`, given
    /// `current_params`) and reports a [`Stale`] naming both tokens.
    pub async fn fenced_update(
        db: &impl GenericClient,
        resource: &str,
        fence: Fence,
        update_sql: &str,
        params: &[&(dyn ToSql + Sync)],
        current_sql: &str,
        current_params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, GateError> {
        let n = db.execute(update_sql, params).await.map_err(store)?;
        if n > 0 {
            return Ok(n);
        }
        let highest = db
            .query_opt(current_sql, current_params)
            .await
            .map_err(store)?
            .map_or(0, |r| r.get::<_, i64>(0) as Fence);
        Err(Stale {
            resource: resource.to_string(),
            presented: fence,
            highest,
        }
        .into())
    }
}

#[async_trait::async_trait]
impl FenceGate for PostgresGate {
    async fn admit(&self, resource: &str, fence: Fence) -> Result<(), GateError> {
        Self::admit_in(&self.client, resource, fence).await
    }

    async fn highest(&self, resource: &str) -> Result<Fence, GateError> {
        Ok(self
            .client
            .query_opt(
                "SELECT highest FROM leasehold_fences WHERE resource = $1",
                &[&resource],
            )
            .await
            .map_err(store)?
            .map_or(0, |r| r.get::<_, i64>(0) as Fence))
    }
}
