//! The `session/list` query: built once for both databases (the owner's sessions, filtered,
//! newest first, from a cursor), and the ways a search can be answered.

use super::{ListFilter, Position, SessionRecord};

/// Every column of `sessions`, in [`SessionRecord`] order.
pub(super) const SESSION_COLUMNS: &str = "id, owner, agent, agent_session_id, cwd, additional_dirs, title, meta, message_count, last_seq, created_at, updated_at, archived_at";

/// Runs the list query built by [`list_query`] on a connection: a backend does it, as sqlx's
/// query builder cannot be run from code generic over the database. No search is kept as a
/// prepared statement, so that Postgres plans each for the values bound, never with a plan cached
/// for another search (which would read all of `session_search` for a rare one).
pub(crate) trait RunList {
    /// [`list_query`]'s rows.
    async fn run_list(
        &mut self,
        owner: &str,
        filter: &ListFilter,
        after: Option<Position<'_>>,
        limit: u32,
        by: SearchBy,
    ) -> Result<Vec<SessionRecord>, sqlx::Error>;
}

/// The text index of a database that `session/list` searches can start from (migration
/// `…_session_search`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchIndex {
    /// SQLite: the FTS5 trigram table `session_search`, whose rowids are the sessions'. It finds
    /// a superset (its case folding covers more than `LIKE`'s ASCII-only one), so the `LIKE`
    /// stays as the exact test.
    Fts5,
    /// Postgres: `session_search`, a copy of the sessions' titles and metadata with pg_trgm
    /// indexes (row-level security keeps `ILIKE` from using an index on `sessions` itself; see
    /// the migration). The copy is exact: it is kept by triggers in the same transaction.
    Trigram,
}

impl SearchIndex {
    /// Whether the index can find `search` at all. Trigram indexes need three characters: FTS5
    /// matches nothing shorter (a NUL would end its query string early), and pg_trgm takes
    /// trigrams only from runs of letters and digits (`e_c` would read the whole index).
    pub fn can_find(self, search: &str) -> bool {
        match self {
            SearchIndex::Fts5 => search.chars().count() >= 3 && !search.contains('\0'),
            SearchIndex::Trigram => {
                let mut run = 0;
                search.chars().any(|c| {
                    run = if c.is_alphanumeric() { run + 1 } else { 0 };
                    run >= 3
                })
            }
        }
    }
}

/// How [`list_query`] answers a search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchBy {
    /// Test each of the owner's sessions (`LIKE`), in whatever order the database likes: SQLite
    /// walks them in list order, Postgres mostly reads them all and sorts the matches.
    Scan,
    /// Test only the owner's newest this many sessions (after the cursor, within the filters),
    /// in list order; nothing is found when there are fewer.
    Newest(i64),
    /// Start from the index: only the sessions it finds are read. A search it cannot take (see
    /// [`SearchIndex::can_find`]) is scanned.
    Index(SearchIndex),
}

/// The counts [`Sql::list_sessions`](super::sql::Sql::list_sessions) goes up to before it decides how to search: the owner's
/// sessions (fewer are scanned; more, and the newest this many are tried first) and the sessions
/// of all owners the index finds (fewer are read from it). Reading from the index costs about
/// 3 µs per session it finds on SQLite and 10-25 µs on Postgres (rows scattered over the table);
/// testing the owner's sessions 2-3 µs each; counting to the cap 1-5 ms.
pub const SEARCH_PROBE: i64 = 2_000;

/// The `session/list` query, the same on both backends but for `like`, the backend's
/// case-insensitive `LIKE` operator, and for how a search is answered (`by`). `prefix` goes before
/// `SELECT` (`EXPLAIN` in the benchmark, which shows the plan of exactly this query; empty
/// otherwise).
pub fn list_query<'a, DB>(
    prefix: &str,
    owner: &'a str,
    filter: &'a ListFilter,
    after: Option<Position<'a>>,
    limit: u32,
    like: &str,
    by: SearchBy,
) -> sqlx::QueryBuilder<'a, DB>
where
    DB: sqlx::Database,
    &'a str: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    String: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
{
    let by = match (by, filter.search.as_deref()) {
        (SearchBy::Index(index), Some(s)) if !index.can_find(s) => SearchBy::Scan,
        (by, _) => by,
    };
    let mut q = sqlx::QueryBuilder::new(format!("{prefix}SELECT {SESSION_COLUMNS} FROM sessions WHERE "));
    push_list_conditions(&mut q, owner, filter, after);
    if let (SearchBy::Newest(n), Some(_)) = (by, &filter.search) {
        // Bounded by the n-th newest row (none when there are fewer: then nothing is found, and
        // the caller goes on another way). A range of the list index, walked in order, that
        // stops at a full page: SQLite would sort a LIMITed subquery's rows again.
        q.push(" AND (updated_at, id) >= (SELECT updated_at, id FROM sessions WHERE ");
        push_list_conditions(&mut q, owner, filter, after);
        q.push(" ORDER BY updated_at DESC, id DESC LIMIT 1 OFFSET ")
            .push_bind(n - 1)
            .push(")");
    }
    if let Some(s) = &filter.search {
        let pattern = like_pattern(s);
        if by == SearchBy::Index(SearchIndex::Trigram) {
            // Exact on its own: no second test on `sessions`, which would also make the planner
            // count the search's selectivity twice.
            q.push(format!(" AND id IN (SELECT id FROM session_search WHERE title {like} "))
                .push_bind(pattern.clone());
        } else {
            q.push(format!(" AND (title {like} ")).push_bind(pattern.clone());
        }
        q.push(format!(" ESCAPE '\\' OR meta {like} "))
            .push_bind(pattern)
            .push(" ESCAPE '\\')");
        if by == SearchBy::Index(SearchIndex::Fts5) {
            q.push(" AND rowid IN (SELECT rowid FROM session_search WHERE session_search MATCH ")
                .push_bind(fts5_phrase(s))
                .push(")");
        }
    }
    q.push(" ORDER BY updated_at DESC, id DESC LIMIT ")
        .push_bind(i64::from(limit));
    q
}

/// The conditions of [`list_query`] besides the search: the owner's, the filters', the cursor's.
fn push_list_conditions<'a, DB>(
    q: &mut sqlx::QueryBuilder<'a, DB>,
    owner: &'a str,
    filter: &'a ListFilter,
    after: Option<Position<'a>>,
) where
    DB: sqlx::Database,
    &'a str: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
{
    q.push("owner = ").push_bind(owner);
    match filter.archived {
        super::Archived::Hidden => q.push(" AND archived_at IS NULL"),
        super::Archived::Only => q.push(" AND archived_at IS NOT NULL"),
        super::Archived::Any => q,
    };
    if let Some(cwd) = &filter.cwd {
        q.push(" AND cwd = ").push_bind(cwd.as_str());
    }
    if let Some(t) = filter.created_after {
        q.push(" AND created_at > ").push_bind(t);
    }
    if let Some(t) = filter.created_before {
        q.push(" AND created_at < ").push_bind(t);
    }
    if let Some(t) = filter.updated_after {
        q.push(" AND updated_at > ").push_bind(t);
    }
    if let Some(pos) = after {
        // A row-value comparison: both databases start the index scan at the cursor with it
        // (the equivalent OR form makes them filter every row before it).
        q.push(" AND (updated_at, id) < (")
            .push_bind(pos.updated_at)
            .push(", ")
            .push_bind(pos.id)
            .push(")");
    }
}

/// Escapes `%`, `_` and `\` for a `LIKE ... ESCAPE '\'` pattern and wraps it in `%`.
pub(super) fn like_pattern(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('%');
    for c in s.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('%');
    out
}

/// `s` as an FTS5 phrase: quoted, quotes doubled. With the trigram tokenizer a phrase matches
/// the rows that contain it as a substring (case-folded), whatever characters it holds.
pub(super) fn fts5_phrase(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn like_escapes_wildcards() {
        assert_eq!(like_pattern("a%b_c\\"), "%a\\%b\\_c\\\\%");
    }

    #[test]
    fn fts5_phrases_quote_everything() {
        assert_eq!(fts5_phrase(r#"say "hi" OR x*"#), r#""say ""hi"" OR x*""#);
    }

    #[test]
    fn what_an_index_can_find() {
        use SearchIndex::*;
        assert!(Fts5.can_find("abc") && Fts5.can_find("%_%") && Fts5.can_find("äöü"));
        assert!(!Fts5.can_find("ab") && !Fts5.can_find("äö") && !Fts5.can_find("ab\0cd"));
        assert!(Trigram.can_find("100%") && Trigram.can_find("a-bcd") && Trigram.can_find("äöü"));
        assert!(!Trigram.can_find("e_c") && !Trigram.can_find("%_%") && !Trigram.can_find("ab cd"));
    }
}
