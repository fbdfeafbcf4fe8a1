//! Sharing's tables (`session_shares`, `share_members`): [`ShareStore`], and its statements,
//! written once for both databases. This is the gateway's own check of who may reach a session
//! that is not theirs: on Postgres it runs as the gateway's login role, and the session itself is
//! then read as its owner.

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Postgres, Sqlite, Type};

use crate::store::{Backend, Db, StoreError, statement};

/// A share as its owner sees it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ShareRow {
    /// Its id (what revoking names).
    pub id: String,
    /// The session shared.
    pub session_id: String,
    /// Who shared it (the session's owner).
    pub owner: String,
    /// The user it names, for a share by name.
    pub grantee: Option<String>,
    /// Whether it is a link (then `grantee` is `None`).
    pub link: bool,
    /// `observer` or `controller`.
    pub role: String,
    /// When it was made (epoch µs).
    pub created_at: i64,
    /// When it ends (epoch µs), if it does.
    pub expires_at: Option<i64>,
    /// How many people have opened it (a link).
    pub members: i64,
    /// Whether a controller's prompts may run on the owner's agent while it carries the owner's
    /// stored agent keys or MCP servers' secret headers (otherwise they are refused there).
    pub owner_keys: bool,
}

/// A share to store.
#[derive(Debug, Clone, Copy)]
pub struct NewShare<'a> {
    /// Its id.
    pub id: &'a str,
    /// The session shared.
    pub session_id: &'a str,
    /// Its owner (the share is refused unless the session is theirs).
    pub owner: &'a str,
    /// The user it names, or `None` for a link.
    pub grantee: Option<&'a str>,
    /// SHA-256 of the link's token, or `None` for a share by name.
    pub token_hash: Option<&'a [u8]>,
    /// `observer` or `controller`.
    pub role: &'a str,
    /// Now (epoch µs).
    pub created_at: i64,
    /// When it ends (epoch µs), if it does.
    pub expires_at: Option<i64>,
    /// See [`ShareRow::owner_keys`].
    pub owner_keys: bool,
}

/// What lets a user reach a session that is not theirs: the share that gives the most.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ShareAccess {
    /// The share.
    pub share_id: String,
    /// The session.
    pub session_id: String,
    /// The session's owner.
    pub owner: String,
    /// `observer` or `controller`.
    pub role: String,
    /// When it ends (epoch µs), if it does.
    pub expires_at: Option<i64>,
    /// See [`ShareRow::owner_keys`].
    pub owner_keys: bool,
}

/// [`ShareAccess`] for one of several users asked about at once.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct MemberAccess {
    /// The user it lets in.
    pub member: String,
    /// What lets them in.
    #[sqlx(flatten)]
    pub access: ShareAccess,
}

/// Most (user, session) pairs asked about in one statement.
pub const ACCESS_PAIRS_PER_STATEMENT: usize = 200;

/// A session someone shared with a user, as their list shows it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct SharedSession {
    /// The session.
    pub session_id: String,
    /// Whose it is.
    pub owner: String,
    /// `observer` or `controller`.
    pub role: String,
    /// When the share ends (epoch µs), if it does.
    pub expires_at: Option<i64>,
    /// The session's title.
    pub title: Option<String>,
    /// Its agent.
    pub agent: String,
    /// When it was last updated (epoch µs).
    pub updated_at: i64,
}

const SHARE_COLUMNS: &str = "s.id, s.session_id, s.owner, s.grantee, s.token_hash IS NOT NULL AS link, s.role, \
     s.created_at, s.expires_at, (SELECT COUNT(*) FROM share_members m WHERE m.share_id = s.id) AS members, \
     s.owner_keys";

/// A share in force at `$now` that names `$user` or that `$user` has opened.
const REACHES: &str = "(s.expires_at IS NULL OR s.expires_at > $2)
     AND (s.grantee = $1 OR EXISTS (SELECT 1 FROM share_members m WHERE m.share_id = s.id AND m.member = $1))";

/// The order of the shares letting one user into one session, the one giving the most first.
const MOST: &str = "CASE s.role WHEN 'controller' THEN 0 ELSE 1 END, \
     CASE WHEN s.owner_keys THEN 0 ELSE 1 END, COALESCE(s.expires_at, 9223372036854775807) DESC";

/// The statements, for any database that can run them.
pub(crate) trait ShareSql: Database
where
    for<'q> Self::Arguments<'q>: IntoArguments<'q, Self>,
    for<'c> &'c mut Self::Connection: Executor<'c, Database = Self>,
    for<'q> &'q str: Encode<'q, Self> + Type<Self>,
    for<'q> Option<&'q str>: Encode<'q, Self> + Type<Self>,
    for<'q> Option<&'q [u8]>: Encode<'q, Self> + Type<Self>,
    for<'q> &'q [u8]: Encode<'q, Self> + Type<Self>,
    for<'q> i64: Encode<'q, Self> + Type<Self>,
    for<'q> Option<i64>: Encode<'q, Self> + Type<Self>,
    for<'q> bool: Encode<'q, Self> + Type<Self>,
    for<'r> ShareRow: FromRow<'r, Self::Row>,
    for<'r> ShareAccess: FromRow<'r, Self::Row>,
    for<'r> SharedSession: FromRow<'r, Self::Row>,
    for<'r> MemberAccess: FromRow<'r, Self::Row>,
    for<'r> (i64,): FromRow<'r, Self::Row>,
{
    /// Stores `s` if its session is its owner's and has fewer than `max` shares in force; whether
    /// it did. One statement: on SQLite it holds the write lock from its start, so two at once
    /// cannot both count the same shares; Postgres needs the lock of [`ShareStore::create`].
    async fn create_share<'c>(
        e: impl Executor<'c, Database = Self>,
        s: &NewShare<'_>,
        max: i64,
    ) -> Result<bool, sqlx::Error> {
        let done: Option<(i64,)> = sqlx::query_as(
            "INSERT INTO session_shares (id, session_id, owner, grantee, token_hash, role, created_at, expires_at, owner_keys)
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $10
             WHERE EXISTS (SELECT 1 FROM sessions WHERE id = $2 AND owner = $3)
               AND (SELECT COUNT(*) FROM session_shares
                    WHERE session_id = $2 AND (expires_at IS NULL OR expires_at > $7)) < $9
             RETURNING CAST(1 AS BIGINT)",
        )
        .bind(s.id)
        .bind(s.session_id)
        .bind(s.owner)
        .bind(s.grantee)
        .bind(s.token_hash)
        .bind(s.role)
        .bind(s.created_at)
        .bind(s.expires_at)
        .bind(max)
        .bind(s.owner_keys)
        .fetch_optional(e)
        .await?;
        Ok(done.is_some())
    }

    /// Forgets the shares of `owner`'s session `session_id` that ended by `now`: done before each
    /// new share, so a session keeps at most twice [`create_share`](Self::create_share)'s cap of
    /// rows however many short shares its owner makes (an ended share lets nobody in).
    async fn purge_ended_shares<'c>(
        e: impl Executor<'c, Database = Self>,
        owner: &str,
        session_id: &str,
        now: i64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM session_shares WHERE session_id = $1 AND owner = $2 AND expires_at <= $3")
            .bind(session_id)
            .bind(owner)
            .bind(now)
            .execute(e)
            .await?;
        Ok(())
    }

    /// Forgets up to `limit` shares of any session that ended by `now` (with their members);
    /// how many. The background purge: an ended share lets nobody in, and is otherwise kept
    /// until its session's next share.
    async fn purge_expired_shares<'c>(
        e: impl Executor<'c, Database = Self>,
        now: i64,
        limit: i64,
    ) -> Result<u64, sqlx::Error> {
        let gone: Vec<(i64,)> = sqlx::query_as(
            "DELETE FROM session_shares WHERE id IN
                 (SELECT id FROM session_shares WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2)
             RETURNING CAST(1 AS BIGINT)",
        )
        .bind(now)
        .bind(limit)
        .fetch_all(e)
        .await?;
        Ok(gone.len() as u64)
    }

    /// The shares of `owner`'s session `session_id` in force at `now`, oldest first.
    async fn shares<'c>(
        e: impl Executor<'c, Database = Self>,
        owner: &str,
        session_id: &str,
        now: i64,
    ) -> Result<Vec<ShareRow>, sqlx::Error> {
        let sql = format!(
            "SELECT {SHARE_COLUMNS} FROM session_shares s WHERE s.session_id = $1 AND s.owner = $2
               AND (s.expires_at IS NULL OR s.expires_at > $3)
             ORDER BY s.created_at, s.id"
        );
        sqlx::query_as(&sql)
            .bind(session_id)
            .bind(owner)
            .bind(now)
            .fetch_all(e)
            .await
    }

    /// Revokes the share `id` of `owner`'s session `session_id`; whether there was one.
    async fn delete_share<'c>(
        e: impl Executor<'c, Database = Self>,
        owner: &str,
        session_id: &str,
        id: &str,
    ) -> Result<bool, sqlx::Error> {
        let done: Option<(i64,)> = sqlx::query_as(
            "DELETE FROM session_shares WHERE id = $1 AND session_id = $2 AND owner = $3 RETURNING CAST(1 AS BIGINT)",
        )
        .bind(id)
        .bind(session_id)
        .bind(owner)
        .fetch_optional(e)
        .await?;
        Ok(done.is_some())
    }

    /// The link share whose token hashes to `token_hash`, in force at `now`.
    async fn link_share<'c>(
        e: impl Executor<'c, Database = Self>,
        token_hash: &[u8],
        now: i64,
    ) -> Result<Option<ShareRow>, sqlx::Error> {
        let sql = format!(
            "SELECT {SHARE_COLUMNS} FROM session_shares s
             WHERE s.token_hash = $1 AND (s.expires_at IS NULL OR s.expires_at > $2)"
        );
        sqlx::query_as(&sql).bind(token_hash).bind(now).fetch_optional(e).await
    }

    /// Records that `member` opened the link share `share_id` (again: nothing changes).
    async fn join_share<'c>(
        e: impl Executor<'c, Database = Self>,
        share_id: &str,
        member: &str,
        now: i64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO share_members (share_id, member, joined_at) VALUES ($1, $2, $3)
             ON CONFLICT (share_id, member) DO NOTHING",
        )
        .bind(share_id)
        .bind(member)
        .bind(now)
        .execute(e)
        .await?;
        Ok(())
    }

    /// What lets `user` reach `session_id` at `now`: the share in force giving the most (a
    /// controller's before an observer's, one lending the owner's keys before one that does not,
    /// then the one that lasts longest).
    async fn share_access<'c>(
        e: impl Executor<'c, Database = Self>,
        user: &str,
        session_id: &str,
        now: i64,
    ) -> Result<Option<ShareAccess>, sqlx::Error> {
        let sql = format!(
            "SELECT s.id AS share_id, s.session_id, s.owner, s.role, s.expires_at, s.owner_keys FROM session_shares s
             WHERE s.session_id = $3 AND {REACHES}
             ORDER BY {MOST}
             LIMIT 1"
        );
        sqlx::query_as(&sql)
            .bind(user)
            .bind(now)
            .bind(session_id)
            .fetch_optional(e)
            .await
    }

    /// [`Self::share_access`] for each (user, session) pair of `pairs` (at most
    /// [`ACCESS_PAIRS_PER_STATEMENT`]) in one statement: the pairs a share lets in, with it.
    async fn share_accesses<'c>(
        e: impl Executor<'c, Database = Self>,
        pairs: &[(&str, &str)],
        now: i64,
    ) -> Result<Vec<MemberAccess>, sqlx::Error> {
        if pairs.is_empty() {
            return Ok(Vec::new());
        }
        let values: Vec<String> = (0..pairs.len())
            .map(|i| format!("(${}, ${})", 2 + 2 * i, 3 + 2 * i))
            .collect();
        let sql = format!(
            "WITH p (member, session_id) AS (VALUES {})
             SELECT member, share_id, session_id, owner, role, expires_at, owner_keys FROM (
                 SELECT p.member, s.id AS share_id, s.session_id, s.owner, s.role, s.expires_at, s.owner_keys,
                        ROW_NUMBER() OVER (PARTITION BY p.member, p.session_id ORDER BY {MOST}) AS best
                 FROM p JOIN session_shares s ON s.session_id = p.session_id
                 WHERE (s.expires_at IS NULL OR s.expires_at > $1)
                   AND (s.grantee = p.member
                        OR EXISTS (SELECT 1 FROM share_members m WHERE m.share_id = s.id AND m.member = p.member))
             ) ranked WHERE best = 1",
            values.join(", ")
        );
        let mut query = sqlx::query_as(&sql).bind(now);
        for (user, session) in pairs {
            query = query.bind(*user).bind(*session);
        }
        query.fetch_all(e).await
    }

    /// Sessions shared with `user` in force at `now`, most recently updated first (a session
    /// shared twice shows twice: the caller keeps the share giving the most).
    async fn shared_with<'c>(
        e: impl Executor<'c, Database = Self>,
        user: &str,
        now: i64,
        limit: i64,
    ) -> Result<Vec<SharedSession>, sqlx::Error> {
        let sql = format!(
            "SELECT s.session_id, s.owner, s.role, s.expires_at, x.title, x.agent, x.updated_at
             FROM session_shares s JOIN sessions x ON x.id = s.session_id
             WHERE {REACHES} AND s.owner <> $1
             ORDER BY x.updated_at DESC, s.session_id LIMIT $3"
        );
        sqlx::query_as(&sql).bind(user).bind(now).bind(limit).fetch_all(e).await
    }
}

impl ShareSql for Sqlite {}
impl ShareSql for Postgres {}

/// The shares of every session, in the database.
#[derive(Debug, Clone)]
pub struct ShareStore {
    db: Db,
}

impl ShareStore {
    /// Sharing's tables in `db`.
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    /// Stores a share of its owner's session if it has fewer than `max` shares in force (however
    /// many are made at once); whether it did. The session's ended shares are forgotten first.
    pub async fn create(&self, s: &NewShare<'_>, max: i64) -> Result<bool, StoreError> {
        self.db
            .within(async {
                match self.db.backend() {
                    Backend::Sqlite(pool) => {
                        Sqlite::purge_ended_shares(pool, s.owner, s.session_id, s.created_at).await?;
                        Ok(Sqlite::create_share(pool, s, max).await?)
                    }
                    Backend::Postgres(pg) => {
                        // Under Postgres's READ COMMITTED two creates at once would each count the
                        // shares the other has not committed yet, and both pass the cap: a lock per
                        // session serializes them (an advisory one, which the transcript writer's
                        // updates of the session row do not wait for). The second counts in a
                        // snapshot taken after the first committed.
                        let mut tx = pg.as_system().await?;
                        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('session_shares:' || $1, 0))")
                            .bind(s.session_id)
                            .execute(&mut *tx)
                            .await?;
                        Postgres::purge_ended_shares(&mut *tx, s.owner, s.session_id, s.created_at).await?;
                        let made = Postgres::create_share(&mut *tx, s, max).await?;
                        tx.commit().await?;
                        Ok(made)
                    }
                }
            })
            .await
    }

    /// Forgets up to `limit` shares, of any session, that ended by `now`; how many.
    pub async fn purge_expired(&self, now: i64, limit: i64) -> Result<u64, StoreError> {
        statement!(self.db, purge_expired_shares(now, limit))
    }

    /// The shares of `owner`'s session in force at `now` (an ended one lets nobody in; its row
    /// is forgotten at the session's next share or by the periodic purge).
    pub async fn of_session(&self, owner: &str, session_id: &str, now: i64) -> Result<Vec<ShareRow>, StoreError> {
        statement!(self.db, shares(owner, session_id, now))
    }

    /// Revokes a share of `owner`'s session; whether there was one.
    pub async fn delete(&self, owner: &str, session_id: &str, id: &str) -> Result<bool, StoreError> {
        statement!(self.db, delete_share(owner, session_id, id))
    }

    /// The link share in force at `now` whose token hashes to `token_hash`.
    pub async fn link(&self, token_hash: &[u8], now: i64) -> Result<Option<ShareRow>, StoreError> {
        statement!(self.db, link_share(token_hash, now))
    }

    /// Records that `member` opened the link share `id`.
    pub async fn join(&self, id: &str, member: &str, now: i64) -> Result<(), StoreError> {
        statement!(self.db, join_share(id, member, now))
    }

    /// What lets `user` reach another user's session at `now`, if anything does.
    pub async fn access(&self, user: &str, session_id: &str, now: i64) -> Result<Option<ShareAccess>, StoreError> {
        statement!(self.db, share_access(user, session_id, now))
    }

    /// [`ShareStore::access`] for each (user, session) of `pairs` (at most
    /// [`ACCESS_PAIRS_PER_STATEMENT`]) in one statement: the pairs a share lets in, with it.
    pub async fn accesses(&self, pairs: &[(&str, &str)], now: i64) -> Result<Vec<MemberAccess>, StoreError> {
        statement!(self.db, share_accesses(pairs, now))
    }

    /// Sessions shared with `user` at `now`.
    pub async fn shared_with(&self, user: &str, now: i64, limit: i64) -> Result<Vec<SharedSession>, StoreError> {
        statement!(self.db, shared_with(user, now, limit))
    }
}
