//! `session/list` (and `GET /api/sessions`): the caller's sessions from the store, newest first,
//! keyset-paginated with signed cursors.

use serde::Deserialize;
use serde_json::{Value, json};

use super::Sessions;
use crate::protocol::RpcError;
use crate::store::{Archived, ListFilter, Position, SessionRecord, in_time, iso8601, now_micros, parse_iso8601};

/// Page size when the client names none.
pub const DEFAULT_LIMIT: u32 = 50;
/// Largest page.
pub const MAX_LIMIT: u32 = 1000;
/// Longest `search` string.
pub const MAX_SEARCH_CHARS: usize = 256;

/// The parameters of `session/list`: ACP v1 (`cwd`, `cursor`) and the seed RFD's filters.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListParams {
    /// Only sessions with this working directory.
    pub cwd: Option<String>,
    /// Continue after a previous page.
    pub cursor: Option<String>,
    /// ISO 8601.
    pub created_after: Option<String>,
    /// ISO 8601.
    pub created_before: Option<String>,
    /// ISO 8601.
    pub updated_after: Option<String>,
    /// Page size (1..=1000, default 50).
    pub limit: Option<u32>,
    /// Substring of title or metadata.
    pub search: Option<String>,
    /// Archived sessions: `false` (the default) leaves them out, `true` lists only them, `"any"`
    /// lists both (a gateway extension).
    pub archived: Option<Value>,
}

fn time(name: &str, value: Option<&str>) -> Result<Option<i64>, RpcError> {
    value
        .map(|v| {
            parse_iso8601(v)
                .ok_or_else(|| RpcError::invalid_params(format!("{name} must be an ISO 8601 date-time, got {v:?}")))
        })
        .transpose()
}

fn archived(value: Option<&Value>) -> Result<Archived, RpcError> {
    match value {
        // A query string (`GET /api/sessions?archived=true`) has only strings.
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(Archived::Hidden),
        Some(Value::Bool(true)) => Ok(Archived::Only),
        Some(Value::String(s)) if s == "false" => Ok(Archived::Hidden),
        Some(Value::String(s)) if s == "true" => Ok(Archived::Only),
        Some(Value::String(s)) if s == "any" => Ok(Archived::Any),
        Some(other) => Err(RpcError::invalid_params(format!(
            "archived must be true, false or \"any\", got {other}"
        ))),
    }
}

/// Answers a `session/list` for `user`; `params` is raw JSON (an object, or `null`).
pub async fn list_sessions(sessions: &Sessions, user: &str, params: &str) -> Result<Value, RpcError> {
    let p: ListParams = if params.trim() == "null" {
        ListParams::default()
    } else {
        serde_json::from_str(params)
            .map_err(|e| RpcError::invalid_params(format!("invalid session/list params: {e}")))?
    };
    list(sessions, user, p).await
}

/// [`list_sessions`] with parsed parameters.
pub async fn list(sessions: &Sessions, user: &str, p: ListParams) -> Result<Value, RpcError> {
    // Above the maximum is served as the maximum; zero asks for nothing and is an error.
    let limit = p.limit.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT);
    if limit == 0 {
        return Err(RpcError::invalid_params("limit must be at least 1"));
    }
    let filter = ListFilter {
        cwd: p.cwd,
        created_after: time("createdAfter", p.created_after.as_deref())?,
        created_before: time("createdBefore", p.created_before.as_deref())?,
        updated_after: time("updatedAfter", p.updated_after.as_deref())?,
        search: p.search.filter(|s| !s.is_empty()),
        archived: archived(p.archived.as_ref())?,
    };
    if filter
        .search
        .as_ref()
        .is_some_and(|s| s.chars().count() > MAX_SEARCH_CHARS)
    {
        return Err(RpcError::invalid_params(format!(
            "search is limited to {MAX_SEARCH_CHARS} characters"
        )));
    }
    let now = now_micros();
    let after = match p.cursor.as_deref().filter(|c| !c.is_empty()) {
        Some(c) => Some(
            sessions
                .cursors
                .decode(c, user, &filter, now)
                .ok_or_else(|| RpcError::invalid_params("invalid or expired cursor"))?,
        ),
        None => None,
    };
    let position = after.as_ref().map(|a| Position {
        updated_at: a.updated_at,
        id: &a.id,
    });
    // Titles and message counts of what was just prompted are in the rows we read.
    sessions.context.persister.flush().await?;
    let mut rows = in_time(sessions.context.store.list_sessions(user, &filter, position, limit + 1)).await?;
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let next = if more {
        rows.last()
            .map(|r| sessions.cursors.encode(user, &filter, r.updated_at, &r.id, now))
    } else {
        None
    };
    let mut result = json!({ "sessions": rows.iter().map(session_info).collect::<Vec<_>>() });
    if let Some(next) = next {
        result["nextCursor"] = Value::String(next);
    }
    Ok(result)
}

/// A stored session as an ACP `SessionInfo` plus the gateway's `_meta`.
pub fn session_info(r: &SessionRecord) -> Value {
    let mut info = json!({
        "sessionId": r.id,
        "cwd": r.cwd,
        "title": r.title,
        "createdAt": iso8601(r.created_at),
        "updatedAt": iso8601(r.updated_at),
        "_meta": { "messageCount": r.message_count, "agent": r.agent, "lastSeq": r.last_seq },
    });
    // A fork says where it came from (stored in its meta by session/fork).
    if r.meta.contains("\"forkedFrom\"")
        && let Some(from) = serde_json::from_str::<Value>(&r.meta)
            .ok()
            .and_then(|m| m.get("forkedFrom").cloned())
    {
        info["_meta"]["forkedFrom"] = from;
    }
    if let Some(at) = r.archived_at {
        info["_meta"]["archivedAt"] = Value::String(iso8601(at));
    }
    if let Ok(dirs) = serde_json::from_str::<Vec<Value>>(&r.additional_dirs)
        && !dirs.is_empty()
    {
        info["additionalDirectories"] = Value::Array(dirs);
    }
    info
}
