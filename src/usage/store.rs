//! What each person spends (`usage_daily`, `usage_sessions`): [`UsageLog`], and its statements,
//! written once for both databases. An agent's cumulative session cost becomes the day's increase,
//! and days are summed for the usage routes and the cost caps.

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Postgres, Sqlite, Type};

use crate::store::{Backend, Db, StoreError, statement};

/// One user's spending with one agent on one day, in one currency.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, serde::Serialize)]
pub struct UsageRow {
    /// The user.
    pub owner: String,
    /// The agent.
    pub agent: String,
    /// The UTC day, `YYYY-MM-DD`.
    pub day: String,
    /// The currency (or unit) the agent reports.
    pub currency: String,
    /// What was spent that day.
    pub cost: f64,
    /// How many `usage_update`s carried it.
    pub updates: i64,
}

/// One `usage_update` with a cost, as the store takes it.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageSample {
    pub owner: String,
    pub agent: String,
    pub session: String,
    pub day: String,
    pub currency: String,
    /// The session's cumulative cost so far.
    pub cumulative: f64,
}

/// The usage statements, for any database that can run them.
pub(crate) trait UsageSql: Database
where
    for<'q> Self::Arguments<'q>: IntoArguments<'q, Self>,
    for<'c> &'c mut Self::Connection: Executor<'c, Database = Self>,
    for<'q> &'q str: Encode<'q, Self> + Type<Self>,
    for<'q> f64: Encode<'q, Self> + Type<Self>,
    for<'r> UsageRow: FromRow<'r, Self::Row>,
    for<'r> (String, f64): FromRow<'r, Self::Row>,
    for<'r> (f64,): FromRow<'r, Self::Row>,
{
    /// The session's last cumulative cost in `currency` (0 when none was seen).
    async fn last_cost<'c>(
        e: impl Executor<'c, Database = Self>,
        session: &str,
    ) -> Result<Option<(String, f64)>, sqlx::Error> {
        sqlx::query_as("SELECT currency, last_cost FROM usage_sessions WHERE session_id = $1")
            .bind(session)
            .fetch_optional(e)
            .await
    }

    /// Records the session's cumulative cost.
    async fn set_last_cost<'c>(
        e: impl Executor<'c, Database = Self>,
        session: &str,
        currency: &str,
        cost: f64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO usage_sessions (session_id, currency, last_cost) VALUES ($1, $2, $3)
             ON CONFLICT (session_id) DO UPDATE SET currency = excluded.currency, last_cost = excluded.last_cost",
        )
        .bind(session)
        .bind(currency)
        .bind(cost)
        .execute(e)
        .await?;
        Ok(())
    }

    /// Adds `delta` to the user's day.
    async fn add_cost<'c>(
        e: impl Executor<'c, Database = Self>,
        s: &UsageSample,
        delta: f64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO usage_daily (owner, agent, day, currency, cost, updates) VALUES ($1, $2, $3, $4, $5, 1)
             ON CONFLICT (owner, agent, day, currency) DO UPDATE SET cost = usage_daily.cost + excluded.cost,
                 updates = usage_daily.updates + 1",
        )
        .bind(s.owner.as_str())
        .bind(s.agent.as_str())
        .bind(s.day.as_str())
        .bind(s.currency.as_str())
        .bind(delta)
        .execute(e)
        .await?;
        Ok(())
    }

    /// Days from `since` on (`YYYY-MM-DD`), of `owner` or of everyone.
    async fn usage_rows<'c>(
        e: impl Executor<'c, Database = Self>,
        owner: Option<&str>,
        since: &str,
    ) -> Result<Vec<UsageRow>, sqlx::Error> {
        match owner {
            Some(owner) => {
                sqlx::query_as(
                    "SELECT owner, agent, day, currency, cost, updates FROM usage_daily
                     WHERE owner = $1 AND day >= $2 ORDER BY day DESC, agent",
                )
                .bind(owner)
                .bind(since)
                .fetch_all(e)
                .await
            }
            None => {
                sqlx::query_as(
                    "SELECT owner, agent, day, currency, cost, updates FROM usage_daily
                     WHERE day >= $1 ORDER BY day DESC, owner, agent",
                )
                .bind(since)
                .fetch_all(e)
                .await
            }
        }
    }

    /// What `owner` spent in `currency` from day `since` on, over every agent.
    async fn cost_since<'c>(
        e: impl Executor<'c, Database = Self>,
        owner: &str,
        since: &str,
        currency: &str,
    ) -> Result<f64, sqlx::Error> {
        let (sum,): (f64,) = sqlx::query_as(
            "SELECT CAST(COALESCE(SUM(cost), 0) AS DOUBLE PRECISION) FROM usage_daily
             WHERE owner = $1 AND day >= $2 AND currency = $3",
        )
        .bind(owner)
        .bind(since)
        .bind(currency)
        .fetch_one(e)
        .await?;
        Ok(sum)
    }
}

impl UsageSql for Sqlite {}
impl UsageSql for Postgres {}

/// The spending tables, in the database.
#[derive(Debug, Clone)]
pub struct UsageLog {
    db: Db,
}

impl UsageLog {
    /// The spending tables in `db`.
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    /// Adds what a session's cumulative cost grew by to its user's day, in one transaction.
    pub async fn record(&self, s: &UsageSample) -> Result<(), StoreError> {
        /// The statements of one sample, on transaction `$tx` of database `$D`.
        macro_rules! record_on {
            ($D:ty, $tx:expr) => {{
                let mut tx = $tx;
                let delta = match <$D>::last_cost(&mut *tx, &s.session).await? {
                    Some((currency, cost)) if currency == s.currency => (s.cumulative - cost).max(0.0),
                    _ => s.cumulative.max(0.0),
                };
                <$D>::set_last_cost(&mut *tx, &s.session, &s.currency, s.cumulative).await?;
                if delta > 0.0 {
                    <$D>::add_cost(&mut *tx, s, delta).await?;
                }
                tx.commit().await?;
            }};
        }
        self.db
            .within(async {
                match self.db.backend() {
                    // IMMEDIATE: it reads, then writes; a deferred transaction would fail with
                    // SQLITE_BUSY_SNAPSHOT when another writer commits in between.
                    Backend::Sqlite(pool) => record_on!(Sqlite, pool.begin_with("BEGIN IMMEDIATE").await?),
                    Backend::Postgres(pg) => record_on!(Postgres, pg.as_system().await?),
                }
                Ok(())
            })
            .await
    }

    /// Spending per user, agent, day and currency from day `since` on (`owner`'s, or everyone's).
    pub async fn days(&self, owner: Option<&str>, since: &str) -> Result<Vec<UsageRow>, StoreError> {
        statement!(self.db, usage_rows(owner, since))
    }

    /// What `owner` spent in `currency` from day `since` on.
    pub async fn cost_since(&self, owner: &str, since: &str, currency: &str) -> Result<f64, StoreError> {
        statement!(self.db, cost_since(owner, since, currency))
    }
}
