//! [`Db`]: one handle on the database for the tables that are not the session store's. Each
//! feature keeps its own tables as a concrete repository over it (sharing's `ShareStore`,
//! identity's `WebSessions`, `audit::AuditLog`, `usage::UsageLog`, the sealed rows here), with
//! its statements written once for both databases (generic over [`sqlx::Database`]); the
//! repository only picks where each runs. Nobody fakes these, so they are not traits: the
//! [`Store`](super::Store) trait keeps what differs per backend.

use std::future::Future;
use std::time::Duration;

use sqlx::SqlitePool;

use super::StoreError;
use super::postgres::PgDb;

/// The database, as the features' repositories reach it.
#[derive(Debug, Clone)]
pub struct Db {
    backend: Backend,
    /// Longest one repository call may take, when it is on a request's path (see [`Db::bounded`]).
    limit: Option<Duration>,
}

/// Which database, and its connections.
#[derive(Debug, Clone)]
pub enum Backend {
    /// One file (or memory), one process.
    Sqlite(SqlitePool),
    /// Postgres, shared by replicas, with row-level security for request work.
    Postgres(PgDb),
}

impl Db {
    pub(super) fn new(backend: Backend) -> Self {
        Self { backend, limit: None }
    }

    /// The same database, each call of a repository over it answering within `limit`: a database
    /// that does not answer gets [`StoreError::Timeout`], so a client hears an error instead of
    /// waiting. For the repositories a request waits on; background writers keep the unbounded
    /// handle, since a write given up on might still commit.
    pub fn bounded(&self, limit: Duration) -> Self {
        Self {
            backend: self.backend.clone(),
            limit: Some(limit),
        }
    }

    /// Which database it is.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// Runs `f` within the handle's limit, if it has one.
    pub async fn within<T>(&self, f: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
        match self.limit {
            Some(limit) => super::within_limit(limit, f).await,
            None => f.await,
        }
    }
}

/// Runs one statement of a repository's statements trait (a generic method of a trait
/// implemented for [`sqlx::Sqlite`] and [`sqlx::Postgres`]) as system work, within the handle's
/// limit: on SQLite's pool, on a Postgres connection of the tables' owner.
/// `statement!(db, shares(owner, id, now))`.
macro_rules! statement {
    ($db:expr, $f:ident ( $($arg:expr),* $(,)? )) => {{
        let db = &$db;
        db.within(async {
            Ok(match db.backend() {
                $crate::store::Backend::Sqlite(pool) => <sqlx::Sqlite>::$f(pool, $($arg),*).await?,
                $crate::store::Backend::Postgres(pg) => <sqlx::Postgres>::$f(&mut *pg.conn().await?, $($arg),*).await?,
            })
        })
        .await
    }};
}
pub(crate) use statement;
