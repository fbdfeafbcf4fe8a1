//! The audit log's table (`audit_log`): [`AuditLog`], and its statements, written once for both
//! databases. Appended in batches by the audit writer, read a page at a time (newest first) by
//! the admin routes, and pruned by the retention. Rows are never updated (a trigger refuses it).

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Postgres, Sqlite, Type};

use crate::store::{Backend, Db, StoreError, statement};

/// One entry.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct AuditEntry {
    /// Its place (increasing); 0 before it is stored.
    pub id: i64,
    /// When (epoch µs).
    pub at: i64,
    /// Who acted (`""` for someone not signed in).
    pub actor: String,
    /// What they did (`sign_in`, `session_create`, `admin_stop`, …).
    pub action: String,
    /// What it was done to (a session id, an agent, a user).
    pub target: Option<String>,
    /// `ok`, `refused` or `failed`.
    pub outcome: String,
    /// More, as JSON (never a secret).
    pub detail: Option<String>,
    /// The WebSocket connection, when it came through one.
    pub connection: Option<String>,
    /// The replica that saw it.
    pub replica: String,
    /// The client's address.
    pub client_addr: Option<String>,
}

/// Which entries a page holds.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    /// Only this actor's.
    pub actor: Option<String>,
    /// Only this action's.
    pub action: Option<String>,
    /// Only entries with ids below this (the previous page's last).
    pub before: Option<i64>,
    /// At most this many.
    pub limit: i64,
}

const COLUMNS: &str = "id, at, actor, action, target, outcome, detail, connection, replica, client_addr";

/// The `audit_log` statements, for any database that can run them.
pub(crate) trait AuditSql: Database
where
    for<'q> Self::Arguments<'q>: IntoArguments<'q, Self>,
    for<'c> &'c mut Self::Connection: Executor<'c, Database = Self>,
    for<'q> &'q str: Encode<'q, Self> + Type<Self>,
    for<'q> Option<&'q str>: Encode<'q, Self> + Type<Self>,
    for<'q> i64: Encode<'q, Self> + Type<Self>,
    for<'r> AuditEntry: FromRow<'r, Self::Row>,
    for<'r> (String, i64): FromRow<'r, Self::Row>,
{
    /// Appends `entries`.
    async fn append_audit<'c, E>(e: E, entries: &[AuditEntry]) -> Result<(), sqlx::Error>
    where
        E: Executor<'c, Database = Self> + Copy,
    {
        for a in entries {
            sqlx::query(
                "INSERT INTO audit_log (at, actor, action, target, outcome, detail, connection, replica, client_addr)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            )
            .bind(a.at)
            .bind(a.actor.as_str())
            .bind(a.action.as_str())
            .bind(a.target.as_deref())
            .bind(a.outcome.as_str())
            .bind(a.detail.as_deref())
            .bind(a.connection.as_deref())
            .bind(a.replica.as_str())
            .bind(a.client_addr.as_deref())
            .execute(e)
            .await?;
        }
        Ok(())
    }

    /// A page of entries, newest first.
    async fn audit_page<'c>(
        e: impl Executor<'c, Database = Self>,
        f: &AuditFilter,
    ) -> Result<Vec<AuditEntry>, sqlx::Error> {
        let mut sql = format!("SELECT {COLUMNS} FROM audit_log WHERE 1 = 1");
        let mut n = 0;
        let mut next = || {
            n += 1;
            n
        };
        if f.actor.is_some() {
            sql.push_str(&format!(" AND actor = ${}", next()));
        }
        if f.action.is_some() {
            sql.push_str(&format!(" AND action = ${}", next()));
        }
        if f.before.is_some() {
            sql.push_str(&format!(" AND id < ${}", next()));
        }
        sql.push_str(&format!(" ORDER BY id DESC LIMIT ${}", next()));
        let mut q = sqlx::query_as::<Self, AuditEntry>(&sql);
        if let Some(actor) = &f.actor {
            q = q.bind(actor.as_str());
        }
        if let Some(action) = &f.action {
            q = q.bind(action.as_str());
        }
        if let Some(before) = f.before {
            q = q.bind(before);
        }
        q.bind(f.limit).fetch_all(e).await
    }

    /// Removes entries older than `before` (epoch µs).
    async fn prune_audit<'c>(e: impl Executor<'c, Database = Self>, before: i64) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM audit_log WHERE at < $1")
            .bind(before)
            .execute(e)
            .await?;
        Ok(())
    }

    /// Each user's last successful sign-in (epoch µs).
    async fn last_sign_ins<'c>(e: impl Executor<'c, Database = Self>) -> Result<Vec<(String, i64)>, sqlx::Error> {
        sqlx::query_as(
            "SELECT actor, CAST(MAX(at) AS BIGINT) FROM audit_log
             WHERE action = 'sign_in' AND outcome = 'ok' GROUP BY actor",
        )
        .fetch_all(e)
        .await
    }
}

impl AuditSql for Sqlite {}
impl AuditSql for Postgres {}

/// The audit log's table, in the database.
#[derive(Debug, Clone)]
pub struct AuditLog {
    db: Db,
}

impl AuditLog {
    /// The audit log in `db`.
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    /// The same log, each call answering within `limit` (see [`Db::bounded`]).
    pub fn bounded(&self, limit: std::time::Duration) -> Self {
        Self::new(self.db.bounded(limit))
    }

    /// Appends entries.
    pub async fn append(&self, entries: &[AuditEntry]) -> Result<(), StoreError> {
        self.db
            .within(async {
                match self.db.backend() {
                    Backend::Sqlite(pool) => Sqlite::append_audit(pool, entries).await?,
                    Backend::Postgres(pg) => Postgres::append_audit(pg.pool(), entries).await?,
                }
                Ok(())
            })
            .await
    }

    /// A page of the log, newest first.
    pub async fn page(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>, StoreError> {
        statement!(self.db, audit_page(filter))
    }

    /// Removes entries older than `before` (epoch µs).
    pub async fn prune(&self, before: i64) -> Result<(), StoreError> {
        statement!(self.db, prune_audit(before))
    }

    /// Each user's last successful sign-in (epoch µs).
    pub async fn last_sign_ins(&self) -> Result<Vec<(String, i64)>, StoreError> {
        statement!(self.db, last_sign_ins())
    }
}
