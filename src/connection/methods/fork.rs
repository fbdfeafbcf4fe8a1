//! `session/fork` (ACP's draft RFD `session-fork`; `unstable` in the schema): a new session of
//! the caller's whose history starts as a copy of one of theirs, up to a seq (the gateway's
//! `_meta.gateway.upToSeq`, default: all of it), answered for any agent.
//!
//! Where the agent forks sessions itself (`sessionCapabilities.fork`) and the fork takes the whole
//! history, the agent's own `session/fork` makes it, on the process serving the original. Else the
//! agent starts a new session (`session/new`) and the fork's first prompt takes the copied history
//! to it as context (the handoff): an embedded Markdown resource where the agent takes them, else
//! a text block, the newest part kept when it is longer than [`HANDOFF_MAX_BYTES`].

use agent_client_protocol_schema::v1::McpServer;
use futures_util::StreamExt;

use super::lifecycle::Adopt;
use super::*;
use crate::store::{EventChunk, SessionRecord, SessionWrite, in_time};

/// Most Markdown a handoff carries (the newest part of the conversation is kept).
pub(super) const HANDOFF_MAX_BYTES: usize = 256 * 1024;

/// What a fork starts from.
pub(super) struct Seed {
    /// The original session.
    pub from: SessionRecord,
    /// The last seq of its history the fork takes.
    pub through: i64,
    /// Whether the agent started afresh (so the first prompt takes the history to it).
    pub handoff: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ForkParams {
    session_id: String,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    additional_directories: Option<Vec<String>>,
    #[serde(default)]
    mcp_servers: Option<Vec<McpServer>>,
    #[serde(rename = "_meta", default)]
    meta: Option<Value>,
}

impl Ctx {
    /// `session/fork`, answered here (`request_id`) as `session/new` is.
    pub(super) async fn fork(&self, params: &RawValue, request_id: &RawValue) -> Handled {
        let p: ForkParams = serde_json::from_str(params.get())
            .map_err(|e| RpcError::invalid_params(format!("invalid session/fork params: {e}")))?;
        // Another user's session answers as an unknown one, before anything else is looked at.
        let from = self.gw.sessions.stored(&self.client.user, &p.session_id).await?;
        let up_to = p.meta.as_ref().and_then(|m| m.pointer("/gateway/upToSeq"));
        let through = match up_to {
            None | Some(Value::Null) => from.last_seq,
            Some(v) => match v.as_i64() {
                Some(n) if (0..=from.last_seq).contains(&n) => n,
                _ => {
                    return Err(RpcError::invalid_params(format!(
                        "_meta.gateway.upToSeq must be a seq of the session (0 to {}), got {v}",
                        from.last_seq
                    )));
                }
            },
        };
        let pool = self
            .gw
            .agents
            .pools
            .get(&from.agent)
            .cloned()
            .ok_or_else(|| RpcError::internal(format!("agent {} is no longer configured", from.agent)))?;
        let stored_dirs: Vec<String> = serde_json::from_str(&from.additional_dirs).unwrap_or_default();
        let asked_dirs = p.additional_directories.unwrap_or(stored_dirs);
        if asked_dirs.len() > MAX_ADDITIONAL_DIRECTORIES {
            return Err(RpcError::invalid_params(format!(
                "at most {MAX_ADDITIONAL_DIRECTORIES} additionalDirectories"
            )));
        }
        let (cwd, dirs) = self.workspace_dirs(Some(p.cwd.as_deref().unwrap_or(&from.cwd)), &asked_dirs)?;
        let cwd = cwd.unwrap_or_default();
        self.room_for_a_live_session()?;
        self.room_to_store().await?;
        let info = pool.info_for(&self.client.user).await?;
        // The client's MCP servers, else the ones the original was started with.
        let servers = match p.mcp_servers {
            Some(servers) => servers,
            None => stored_mcp_servers(&from.meta),
        };
        let (_, mut raw, mcp_secrets) = self.start_params(&pool, &info, &servers, &cwd, &dirs).await?;

        // The agent's own fork takes everything it knows: only a fork of the whole history, of a
        // session this replica serves (another replica's agent holds it), whose agent knows it
        // all (not a fork still waiting to hand its history over).
        let mut by_agent = None;
        let original = if info.can_fork() && through == from.last_seq {
            Some(self.owned(&from.id).await?)
        } else {
            None
        };
        let original = match original {
            Some(o) if !o.has_handoff() && self.gw.sessions.serving_elsewhere(&o).await?.is_none() => Some(o),
            _ => None,
        };
        if let Some(original) = original {
            if !original.is_bound_now() {
                self.room_for_a_live_session()?;
            }
            let binding = original.ensure_bound(&self.gw.agents.pools).await?;
            if binding.process.try_reserve(pool.config().pool.max_sessions_per_process) {
                let params = format!(r#"{{"sessionId":{},{}"#, json!(&*binding.agent_session_id), &raw[1..]);
                match binding
                    .process
                    .request("session/fork", &format!("{params}}}"), pool.request_timeout())
                    .await
                {
                    Ok(result) => by_agent = Some((binding.process.clone(), result)),
                    Err(e) => {
                        binding.process.release();
                        return Err(e);
                    }
                }
            }
        }
        raw.push('}');
        let handoff = by_agent.is_none() && through > 0;
        let (process, result) = match by_agent {
            Some(forked) => forked,
            None => {
                let process = pool.acquire(&self.client.user).await?;
                match process.request("session/new", &raw, pool.request_timeout()).await {
                    Ok(result) => (process, result),
                    Err(e) => {
                        process.release();
                        return Err(e);
                    }
                }
            }
        };
        let now = crate::store::now_micros();
        let record = SessionRecord {
            id: uuid::Uuid::new_v4().simple().to_string(),
            owner: self.client.user.to_string(),
            agent: pool.name.to_string(),
            agent_session_id: None,
            cwd,
            additional_dirs: json!(dirs).to_string(),
            title: None,
            meta: json!({ "mcpServers": servers, "forkedFrom": { "sessionId": from.id, "seq": through } }).to_string(),
            message_count: 0,
            last_seq: through,
            created_at: now,
            updated_at: now,
            archived_at: None,
        };
        let seed = Seed { from, through, handoff };
        let adopted = Adopt {
            pool: &pool,
            process,
            result,
            record,
            seed: Some(seed),
            mcp_secrets,
        };
        self.adopt(adopted, "session/fork", request_id).await
    }
}

/// The MCP servers a session was started with (its stored `meta.mcpServers`); entries that no
/// longer parse are left out.
fn stored_mcp_servers(meta: &str) -> Vec<McpServer> {
    serde_json::from_str::<Value>(meta)
        .ok()
        .and_then(|m| m.get("mcpServers").cloned())
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|v| serde_json::from_value(v).ok())
        .collect()
}

/// Stores the fork's history: the original's updates up to `seed.through`, page by page, each
/// chunk with the time it was stored; then the fork's title (the original's, marked) and its
/// count of prompts (the user's turns copied).
pub(super) async fn copy_transcript(gw: &Gateway, seed: &Seed, to: &SessionRecord) -> Result<(), RpcError> {
    let store = gw.sessions.store();
    // The copy counts against the user's stored bytes like anything they store: it must fit.
    let max = gw.config.limits.max_stored_bytes_per_user;
    let mut room = if max == 0 {
        u64::MAX
    } else {
        max.saturating_sub(in_time(store.stored_bytes(&seed.from.owner)).await?)
    };
    let mut after = 0;
    let mut prompts = 0;
    let mut in_user_turn = false;
    while after < seed.through {
        let chunks =
            in_time(store.read_events(&seed.from.owner, &seed.from.id, after, crate::store::READ_PAGE_CHUNKS)).await?;
        if chunks.is_empty() {
            break;
        }
        let mut writes = Vec::with_capacity(chunks.len());
        for chunk in chunks {
            let last = chunk.seq_to.min(seed.through);
            let lines: Vec<&str> = (chunk.seq_from..)
                .zip(chunk.payload.split('\n'))
                .filter(|(seq, _)| *seq > after && *seq <= last)
                .map(|(_, line)| line)
                .collect();
            after = after.max(chunk.seq_to.min(seed.through));
            if lines.is_empty() {
                continue;
            }
            let first = last - (lines.len() as i64 - 1);
            for line in &lines {
                let user = line.contains(r#""sessionUpdate":"user_message_chunk""#);
                if user && !in_user_turn {
                    prompts += 1;
                }
                in_user_turn = user;
            }
            let payload = lines.join("\n");
            room = room
                .checked_sub(payload.len() as u64)
                .ok_or_else(|| crate::usage::quota::CapReached::new("stored_bytes", max).rpc())?;
            writes.push(SessionWrite {
                session_id: Arc::from(to.id.as_str()),
                chunk: Some(EventChunk {
                    seq_from: first,
                    seq_to: last,
                    payload,
                    stored_at: 0,
                }),
                updated_at: chunk.stored_at,
                ..Default::default()
            });
        }
        store.write_batch(&writes).await?;
    }
    let title = seed.from.title.as_deref().map(|t| format!("{t} (fork)"));
    store
        .write_batch(&[SessionWrite {
            session_id: Arc::from(to.id.as_str()),
            agent_title: title,
            prompts,
            updated_at: to.created_at,
            ..Default::default()
        }])
        .await?;
    Ok(())
}

/// A fork's first prompt (`rewritten`, its params for the agent) with the history copied from the
/// original, up to `through`, put before what the user wrote: an embedded resource where the
/// agent takes them, else a text block.
pub(super) async fn prompt_with_handoff(
    gw: &Gateway,
    session: &LiveSession,
    pool: &AgentPool,
    through: i64,
    rewritten: &str,
) -> Result<String, RpcError> {
    let takes_resources = pool.info_for(&session.owner).await?.takes_embedded_context();
    let record = gw.sessions.stored(&session.owner, &session.id).await?;
    let record = SessionRecord {
        last_seq: through,
        ..record
    };
    let from = Value::from(record.id.clone());
    let mut md = String::new();
    let mut pieces = Box::pin(crate::export::stream(
        gw.sessions.store().clone(),
        record,
        crate::export::Format::Markdown,
    ));
    let mut cut = false;
    while let Some(piece) = pieces.next().await {
        let piece = piece.map_err(RpcError::from)?;
        md.push_str(&String::from_utf8_lossy(&piece));
        if md.len() > 2 * HANDOFF_MAX_BYTES {
            cut = true;
            keep_tail(&mut md, HANDOFF_MAX_BYTES);
        }
    }
    cut |= md.len() > HANDOFF_MAX_BYTES;
    keep_tail(&mut md, HANDOFF_MAX_BYTES);
    let intro = if cut {
        "This session was forked from another one. The newest part of that conversation (the start is left out) follows; go on from it."
    } else {
        "This session was forked from another one. That conversation so far follows; go on from it."
    };
    let block = if takes_resources {
        json!({"type": "resource", "resource": {
            "uri": format!("gateway:///fork/{}.md", from.as_str().unwrap_or("")),
            "mimeType": "text/markdown",
            "text": format!("{intro}\n\n{md}"),
        }})
    } else {
        json!({"type": "text", "text": format!("{intro}\n\n{md}\n\n---\n\n")})
    };
    let mut params: Value =
        serde_json::from_str(rewritten).map_err(|e| RpcError::internal(format!("prompt params: {e}")))?;
    let prompt = params
        .get_mut("prompt")
        .and_then(Value::as_array_mut)
        .ok_or_else(|| RpcError::invalid_params("session/prompt params need a prompt array"))?;
    prompt.insert(0, block);
    Ok(params.to_string())
}

/// Drops the start of `s` so that at most `max` bytes are left (cut at a line where it can be).
fn keep_tail(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    if let Some(nl) = s[start..].find('\n') {
        start += nl + 1;
    }
    s.drain(..start);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_is_kept_from_a_line_start() {
        let mut s = String::from("first line\nsecond line\nthird é line\n");
        keep_tail(&mut s, 20);
        assert_eq!(s, "third é line\n");
        let mut short = String::from("short");
        keep_tail(&mut short, 20);
        assert_eq!(short, "short");
    }

    #[test]
    fn stored_servers_are_read_back() {
        let meta = r#"{"mcpServers":[{"name":"fs","command":"/bin/mcp","args":[],"env":[]},{"bogus":1}]}"#;
        let servers = stored_mcp_servers(meta);
        assert_eq!(servers.len(), 1);
        assert!(stored_mcp_servers("{}").is_empty());
    }
}
