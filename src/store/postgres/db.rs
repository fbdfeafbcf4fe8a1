//! [`PgDb`]: the transactions Postgres work runs in, as the request role for one user or as the
//! tables' owner for everyone. The session store and the features' tables share it.

use sqlx::pool::PoolConnection;
use sqlx::postgres::PgPool;
use sqlx::{Postgres, Transaction};

use super::super::StoreError;
use super::super::pg_roles::{ACT_FOR_USER, RequestIdentity};

/// Where Postgres work runs (see the module docs of [`super`]).
#[derive(Debug, Clone)]
pub struct PgDb {
    /// System work's connections, as the login role (the tables' owner): each method borrows one
    /// for one transaction.
    pub(in crate::store) pool: PgPool,
    /// Request work's connections when `request_database_url` gives it a login of its own (a
    /// member of `acp_gateway_request` and nothing more); else request work uses `pool`. Each
    /// transaction's role and identity end with it.
    pub(in crate::store) requests: Option<PgPool>,
    /// Signs the user a request transaction acts for.
    pub(in crate::store) identity: RequestIdentity,
}

/// Awaits `$start` (taking a connection, beginning a transaction on it) once more when it failed
/// because the connection was dead: after Postgres restarts, the pool finds its old connections
/// dead and opens a new one, and that first connect may be reset while the server comes up
/// (sqlx retries a refused connect within the pool's wait, not a reset one). Nothing has been
/// written at this point, so running it again is safe; a connection lost later, mid-statement,
/// is the caller's error, since a write may or may not have happened.
macro_rules! once_more_if_dead {
    ($start:expr) => {
        match $start.await {
            Err(e) if connection_lost(&e) => {
                tracing::info!(error = %e, "a Postgres connection was found dead; trying a new one");
                $start.await
            }
            done => done,
        }
    };
}

impl PgDb {
    /// A transaction of request work: as the request role, row-level security shows it only
    /// `owner`'s rows.
    pub async fn as_user(&self, owner: &str) -> Result<Transaction<'static, Postgres>, StoreError> {
        let pool = self.requests.as_ref().unwrap_or(&self.pool);
        let identity = self.identity.sign(owner);
        let begin = async || -> Result<_, sqlx::Error> {
            let mut tx = pool.begin().await?;
            sqlx::query(ACT_FOR_USER).bind(&identity).execute(&mut *tx).await?;
            Ok(tx)
        };
        Ok(once_more_if_dead!(begin())?)
    }

    /// A transaction of system work, done for every user (transcript writes, the cursor key): as
    /// the login role, the tables' owner, which row-level security does not apply to.
    pub async fn as_system(&self) -> Result<Transaction<'static, Postgres>, StoreError> {
        Ok(once_more_if_dead!(self.pool.begin())?)
    }

    /// A connection of system work for statements that run on their own.
    pub async fn conn(&self) -> Result<PoolConnection<Postgres>, StoreError> {
        Ok(once_more_if_dead!(self.pool.acquire())?)
    }

    /// System work's pool, for a statement that takes connections as it needs them.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// Whether `e` says the connection is gone: reset or closed under it, or the server shutting
/// down or starting up (SQLSTATE class 08, and 57P01, 57P02, 57P03).
fn connection_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) => true,
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("08") || matches!(&*c, "57P01" | "57P02" | "57P03")),
        _ => false,
    }
}
