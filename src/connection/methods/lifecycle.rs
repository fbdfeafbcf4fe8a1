//! The session methods a client's request runs here, on its connection's [`Ctx`]: creating,
//! loading, closing and deleting a session, and the room checks and attachment they share.

use super::*;

/// A session an agent has just started for the caller, to be made theirs by [`Ctx::adopt`].
pub(super) struct Adopt<'a> {
    /// The agent it runs on.
    pub pool: &'a Arc<AgentPool>,
    /// The process that started it (holding a session slot for it).
    pub process: Arc<AgentProcess>,
    /// The agent's answer (its session id, modes, config options).
    pub result: Box<RawValue>,
    /// The row to store (its agent-side id is filled in from `result`).
    pub record: crate::store::SessionRecord,
    /// For a fork: the history it starts with.
    pub seed: Option<super::fork::Seed>,
    /// Whether the MCP servers its agent was started with carry secrets (see
    /// [`LiveSession::set_mcp_secrets_given`]).
    pub mcp_secrets: bool,
}

impl Ctx {
    /// `session/new`, answered here (`id`): the client gets its answer before the updates the
    /// agent sent right after its own (commands, mode), which then start the session's
    /// transcript, as they would have reached a client talking to the agent directly.
    pub(super) async fn new_session(&self, new: NewSessionRequest, request_id: &RawValue) -> Handled {
        let utf8 = |p: &std::path::Path| {
            p.to_str()
                .map(str::to_string)
                .ok_or_else(|| RpcError::invalid_params(format!("{p:?} is not UTF-8")))
        };
        let asked_dirs: Vec<String> = new
            .additional_directories
            .iter()
            .map(|d| utf8(d))
            .collect::<Result<_, _>>()?;
        if asked_dirs.len() > MAX_ADDITIONAL_DIRECTORIES {
            return Err(RpcError::invalid_params(format!(
                "at most {MAX_ADDITIONAL_DIRECTORIES} additionalDirectories"
            )));
        }
        let (cwd, dirs) = self.workspace_dirs(Some(&utf8(&new.cwd)?), &asked_dirs)?;
        let cwd = cwd.unwrap_or_default();
        self.room_for_a_live_session()?;
        self.room_to_store().await?;
        let info = self.pool.info_for(&self.client.user).await?;
        let cfg = self.pool.config();
        // What the agent gets is built here, not copied: the resolved directories, the accepted
        // MCP servers, and only the allowed `_meta` keys.
        let (mcp, mut raw, mcp_secrets) = self
            .start_params(&self.pool, &info, &new.mcp_servers, &cwd, &dirs)
            .await?;
        let meta: serde_json::Map<String, Value> = new
            .meta
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| cfg.forward_meta.contains(k))
            .collect();
        if !meta.is_empty() {
            raw.push_str(&format!(r#","_meta":{}"#, Value::Object(meta)));
        }
        raw.push('}');
        let process = self.pool.acquire(&self.client.user).await?;
        let result = match process.request("session/new", &raw, self.pool.request_timeout()).await {
            Ok(r) => r,
            Err(e) => {
                process.release();
                return Err(e);
            }
        };
        let meta = format!(r#"{{"mcpServers":{mcp}}}"#);
        let now = crate::store::now_micros();
        let record = crate::store::SessionRecord {
            id: uuid::Uuid::new_v4().simple().to_string(),
            owner: self.client.user.to_string(),
            agent: self.pool.name.to_string(),
            agent_session_id: None,
            cwd,
            additional_dirs: json!(dirs).to_string(),
            title: None,
            meta,
            message_count: 0,
            last_seq: 0,
            created_at: now,
            updated_at: now,
            archived_at: None,
        };
        let adopted = Adopt {
            pool: &self.pool,
            process,
            result,
            record,
            seed: None,
            mcp_secrets,
        };
        self.adopt(adopted, "session/new", request_id).await
    }

    /// What a new session's agent is started with (`session/new`, `session/fork`): the MCP
    /// servers as stored with the session (checked against the operator's rules and the agent's
    /// transports), and the params' opening (`{"cwd",…,"mcpServers",…[,"additionalDirectories"]`,
    /// left open for more) with the user's own servers added, which are never stored; and whether
    /// the servers the agent is given carry secrets.
    pub(super) async fn start_params(
        &self,
        pool: &AgentPool,
        info: &crate::agents::pool::AgentInfo,
        servers: &[agent_client_protocol_schema::v1::McpServer],
        cwd: &str,
        dirs: &[String],
    ) -> Result<(String, String, bool), RpcError> {
        crate::tenancy::check_mcp_servers(servers, pool.config(), info.mcp_transports())?;
        let mcp = serde_json::to_string(servers).map_err(|e| RpcError::internal(e.to_string()))?;
        // A user's own servers carry secret headers: only for that user's own processes, never
        // a process shared between users.
        let for_agent = if pool.is_shared() {
            mcp.clone()
        } else {
            crate::settings::user_mcp::with_users_servers(
                &self.gw.settings.user_mcp,
                &self.client.user,
                info.mcp_transports(),
                &mcp,
            )
            .await
            .map_err(|e| RpcError::internal(e.to_string()))?
        };
        let mut raw = format!(r#"{{"cwd":{},"mcpServers":{for_agent}"#, json!(cwd));
        if !dirs.is_empty() {
            raw.push_str(&format!(r#","additionalDirectories":{}"#, json!(dirs)));
        }
        let secrets = crate::tenancy::carry_secrets(&for_agent);
        Ok((mcp, raw, secrets))
    }

    /// A session an agent started for the caller (`session/new`, `session/fork`) becomes
    /// theirs: stored (with its seed transcript, for a fork), leased, bound to the process that
    /// started it, attached to this connection and answered (`method`'s answer, with the
    /// gateway's id), then handed what the agent sent for it meanwhile. The process's session
    /// slot is given back on any failure.
    pub(super) async fn adopt(&self, a: Adopt<'_>, method: &'static str, request_id: &RawValue) -> Handled {
        let Adopt {
            pool,
            process,
            result,
            mut record,
            seed,
            mcp_secrets,
        } = a;
        let Some(agent_sid) = protocol::session_id_of(Some(&result)) else {
            process.release();
            return Err(RpcError::internal(format!(
                "agent answered {method} without a sessionId"
            )));
        };
        // Kept from now (and from before: the agent's stdout is read ahead) until handed on
        // below; forgotten if the session is not created.
        let early = process.hold_updates(Arc::from(agent_sid.as_str()));
        record.agent_session_id = Some(agent_sid.clone());
        let id = record.id.clone();
        let session = match self.gw.sessions.create(&record).await {
            Ok(session) => session,
            Err(e) => {
                process.release();
                return Err(e);
            }
        };
        // Leased first: what the serving agent says (its controls, its updates) is stored only
        // under the lease.
        if let Err(e) = self.gw.sessions.lease_new(&session).await {
            process.release();
            self.gw.sessions.discard(&self.client.user, &id).await;
            return Err(e);
        }
        // A fork's history, stored before anything the agent says is numbered after it.
        if let Some(seed) = &seed
            && let Err(e) = super::fork::copy_transcript(&self.gw, seed, &record).await
        {
            process.release();
            let _ = self
                .gw
                .sessions
                .delete(&self.client.user, &id, &self.gw.agents.pools)
                .await;
            return Err(e);
        }
        // The modes, config options and models the agent offers, for session/load to answer with.
        let controls = Controls::from_result(result.get());
        session
            .change_controls(|c| {
                *c = controls;
                !c.is_empty()
            })
            .await;
        session.set_mcp_secrets_given(mcp_secrets);
        if let Err(e) = session.bind(process.clone(), Arc::from(agent_sid.as_str())) {
            process.release();
            self.gw.sessions.discard(&self.client.user, &id).await;
            tracing::warn!(connection = %self.client.id, user = %self.client.user, agent_session = %agent_sid, "agent reused a bound session id; session refused");
            return Err(e);
        }
        if let Some(seed) = &seed
            && seed.handoff
        {
            session.set_handoff(seed.through);
        }
        self.attach(&session, false, 0).await?;
        metrics::counter!(crate::infra::metrics::SESSIONS_CREATED, "agent" => pool.name.to_string()).increment(1);
        tracing::info!(connection = %self.client.id, user = %self.client.user, session = %id, method, "session created");
        match &seed {
            None => self.audit("session_create", Some(&id), "ok", Some(json!({ "agent": &*pool.name }))),
            Some(seed) => self.audit(
                "session_fork",
                Some(&id),
                "ok",
                Some(json!({ "agent": &*pool.name, "from": seed.from.id, "throughSeq": seed.through, "byAgent": !seed.handoff })),
            ),
        }
        let result = protocol::with_session_id(&result, &id)
            .ok_or_else(|| RpcError::internal(format!("agent's {method} result is not an object")))?;
        // Queued at once, room or not, like every answer (a client that is behind is fed its
        // updates from the store, and its answers wait for it): the agent's stdout reader may be
        // waiting for `early` to be handed on (the agent sent more than is held), and must not
        // wait on this client's reading. A client past the hard cap of unread answers is closed
        // with 1013 by the push.
        let frame = Utf8Bytes::from(protocol::response(request_id.get(), &result));
        self.client.outbox.push(frame);
        early.hand_on().await;
        Ok(Reply::Answered)
    }

    pub(super) async fn load(
        &self,
        sid: &str,
        cwd: Option<&str>,
        dirs: &[String],
        after: u64,
        replay: bool,
    ) -> Handled {
        let session = self.owned(sid).await?;
        self.audit(
            if replay { "session_load" } else { "session_resume" },
            Some(sid),
            "ok",
            None,
        );
        // The stored cwd is what the agent gets on restore; a client's must still be its own.
        self.workspace_dirs(cwd, dirs)?;
        self.attach(&session, replay, after).await?;
        // A turn that runs, or messages queued by another tab, show at once.
        let (queue, turn) = {
            let mut q = session.queue();
            ((!q.is_idle()).then(|| q.notice(&session.id)), q.turn_state())
        };
        if let Some(queue) = queue {
            self.client.outbox.push(queue.into());
        }
        // The controls, and how the session's turn stands (`_meta.gateway.turn`): a client back
        // after losing its connection answers the prompt it had sent from there.
        let mut answer: serde_json::Value =
            serde_json::from_str(&self.controls_answer(&session).await?).unwrap_or_else(|_| serde_json::json!({}));
        answer["_meta"] = serde_json::json!({ "gateway": { "turn": turn } });
        Ok(Reply::Result(answer.to_string()))
    }

    /// The agent's modes, config options and models, as they are after what was replayed, so
    /// a reloaded page shows its pickers (ACP lets `session/load`'s answer carry them).
    pub(super) async fn controls_answer(&self, session: &LiveSession) -> Result<String, RpcError> {
        if session.controls_need_store() {
            let stored = self.controls_in_store(session).await?;
            if session.is_bound_now() {
                session.stored_controls(&stored);
            } else {
                // Another replica may serve it and change them: this one keeps no copy it
                // would have to keep current.
                return Ok(Controls::from_result(&stored).to_json());
            }
        }
        Ok(session.controls_json())
    }

    /// The agent's modes, config options and models as the store holds them for `session`
    /// (`{}` when it holds none).
    pub(super) async fn controls_in_store(&self, session: &LiveSession) -> Result<String, RpcError> {
        let stored =
            crate::store::in_time(self.gw.sessions.store().session_controls(&session.owner, &session.id)).await?;
        Ok(stored.unwrap_or_else(|| String::from("{}")))
    }

    pub(super) async fn close(&self, sid: &str, delete: bool) -> Handled {
        let session = self.owned(sid).await?;
        session.detach(&self.client);
        self.tracked.left(sid);
        if delete {
            self.gw
                .sessions
                .delete(&self.client.user, sid, &self.gw.agents.pools)
                .await?;
            self.audit("session_delete", Some(sid), "ok", None);
        } else {
            self.gw.sessions.close_on_agent(&session, &self.gw.agents.pools).await;
        }
        Ok(Reply::Result(String::from("{}")))
    }

    /// Records what the caller did in the audit log.
    pub(super) fn audit(
        &self,
        action: &'static str,
        target: Option<&str>,
        outcome: &'static str,
        detail: Option<Value>,
    ) {
        self.gw.audit.record(crate::audit::Event {
            actor: &self.client.user,
            action,
            target,
            outcome,
            detail,
            connection: Some(&self.client.id),
            client: self.client.addr(),
        });
    }

    /// Whether the caller may put one more session on an agent process.
    pub(super) fn room_for_a_live_session(&self) -> Result<(), RpcError> {
        self.room_for_a_live_session_of(&self.client.user)
    }

    /// Whether `owner` (the caller, or the owner of a session shared with them) may have one
    /// more session on an agent process.
    pub(super) fn room_for_a_live_session_of(&self, owner: &str) -> Result<(), RpcError> {
        let live = self.gw.sessions.live_count(owner);
        self.gw.agents.quotas.live_session(live).map_err(|cap| {
            self.gw
                .audit
                .cap_refused(owner, cap.cap, Some(&self.client.id), self.client.addr());
            cap.rpc()
        })
    }

    /// Whether the caller may store more transcript (`max_stored_bytes_per_user`).
    pub(super) async fn room_to_store(&self) -> Result<(), RpcError> {
        self.room_to_store_of(&self.client.user).await
    }

    /// Whether `owner` may store more transcript (a shared session's prompts are its owner's).
    pub(super) async fn room_to_store_of(&self, owner: &Arc<str>) -> Result<(), RpcError> {
        let max = self.gw.config.limits.max_stored_bytes_per_user;
        self.gw.sessions.check_stored_bytes(owner, max).await
    }

    /// Attaches this connection to `session` (and remembers it, to detach when it ends).
    pub(super) async fn attach(&self, session: &Arc<LiveSession>, replay: bool, after: u64) -> Result<(), RpcError> {
        self.tracked.attached(&session.id);
        session
            .attach(&self.client, &**self.gw.sessions.store(), replay, after)
            .await?;
        // Commits of the session are announced here, and other replicas' agents may ask this
        // client their requests for it.
        self.gw.sessions.followed(session, true).await;
        Ok(())
    }
}
