//! Requests a client sends for a session that its agent answers (`session/prompt`, the
//! controls, extension methods): sent on to the replica that serves the session, or to this
//! replica's agent process, with the agent's session id; a prompt recorded first, counted as the
//! session's turn, and (a fork's first) carrying the forked history.

use super::*;

impl Ctx {
    /// Forwards a session-scoped request to the session's agent process (restoring the session
    /// onto one if needed), with the agent's session id and a gateway-issued request id.
    pub(super) async fn forward(
        &self,
        method: &str,
        id: &RawValue,
        sid: &str,
        params: &RawValue,
        prompt: Option<&RawValue>,
        slot: OwnedSemaphorePermit,
    ) -> Handled {
        let session = self.controllable(sid, method).await?;
        let pool = self
            .pool_of(&session)
            .ok_or_else(|| RpcError::internal(format!("agent {} is no longer configured", session.agent)))?;
        let cfg = pool.config();
        if method.starts_with('_')
            && !method.starts_with(queue::PREFIX)
            && !cfg.allowed_ext_methods.iter().any(|m| m == method)
        {
            return Err(RpcError::method_not_found(method));
        }
        if let Some(prompt) = prompt {
            // A shared session's prompts run on its owner's agent and count as theirs.
            let owner = &session.owner;
            let info = pool.info_for(owner).await?;
            crate::connection::attachments::check(prompt, &info.capabilities, self.gw.config.limits.attachment_bytes)?;
            self.room_to_store_of(owner).await?;
            if let Err(e) = self.gw.usage.check(owner).await {
                self.gw
                    .audit
                    .cap_refused(owner, "cost", Some(&self.client.id), self.client.addr());
                return Err(e);
            }
        }
        self.attach(&session, false, 0).await?;
        if !session.is_bound_now() {
            // Served by another replica: the request goes there through Postgres.
            if let Some(holder) = self.gw.sessions.serving_elsewhere(&session).await? {
                crate::connection::remote::forward(&self.gw, &self.client, &session, &holder, method, id, params)
                    .await?;
                return Ok(Reply::Forwarded);
            }
        }
        self.forward_here(
            &session,
            method,
            id,
            params,
            prompt,
            self.client.outbox.clone(),
            Some(slot),
        )
        .await
    }

    /// Forwards a request for `session` to this replica's agent process (restoring the session
    /// onto one if needed); the answer goes to `to`.
    #[allow(
        clippy::too_many_arguments,
        reason = "a forwarded request's parts, taken apart once by the parser; a struct would only rename them"
    )]
    pub(in crate::connection) async fn forward_here(
        &self,
        session: &Arc<LiveSession>,
        method: &str,
        id: &RawValue,
        params: &RawValue,
        prompt: Option<&RawValue>,
        to: crate::infra::outbox::Outbox,
        slot: Option<OwnedSemaphorePermit>,
    ) -> Handled {
        // A teammate's turn (a prompt, or a message queued for one) is checked here, where the
        // session is served, whichever replica their client is on.
        if prompt.is_some() && session.owner != self.client.user {
            withheld::teammate_may_prompt(&self.gw, session, &self.client.user, Some(&self.client.id)).await?;
        }
        if let Some(op) = method.strip_prefix(queue::PREFIX) {
            return self.queue_op(session, op, id, params, &to).await;
        }
        let pool = self
            .pool_of(session)
            .ok_or_else(|| RpcError::internal(format!("agent {} is no longer configured", session.agent)))?;
        let cfg = pool.config();
        if !session.is_bound_now() {
            self.room_for_a_live_session_of(&session.owner)?;
            // Served here from now on: the controls as stored (another replica may have
            // changed them), then as the agent's restore answer says.
            if session.controls_need_store() {
                session.stored_controls(&self.controls_in_store(session).await?);
            }
        }
        let binding = session.ensure_bound(&self.gw.agents.pools).await?;
        // A teammate whose share ended while the session was restored has been closed by now:
        // nothing of theirs goes to the owner's agent.
        if session.owner != self.client.user && self.client.is_closed() {
            return Err(RpcError::session_not_found());
        }
        let rewritten = protocol::rewrite_params(params, Some(&binding.agent_session_id), Some(&cfg.forward_meta))
            .ok_or_else(|| RpcError::invalid_params("params must be an object"))?;
        let route: Arc<dyn SessionRoute> = if ClientMethod::parse(method).is_some_and(ClientMethod::is_control) {
            Arc::new(ControlsAnswer {
                session: session.clone(),
                method: method.into(),
                params: params.get().into(),
                gw: self.gw.clone(),
            })
        } else if prompt.is_some() {
            Arc::new(queue::PromptAnswer {
                session: session.clone(),
                gw: self.gw.clone(),
            })
        } else {
            session.clone()
        };
        let answer = Pending::Forward {
            route,
            to,
            client_id: id.to_owned(),
            _slot: slot,
        };
        let agent_id = if let Some(prompt) = prompt {
            metrics::counter!(crate::infra::metrics::PROMPTS).increment(1);
            // Counted before it is sent: the answer may come back before `forward_prompt` does
            // (and a message queued meanwhile waits for this turn).
            session.queue().turn_started();
            // A fork its agent did not make: the first prompt takes the copied history to it.
            let handoff = match session.take_handoff() {
                Some(through) => match fork::prompt_with_handoff(&self.gw, session, &pool, through, &rewritten).await {
                    Ok(with) => Some((through, with)),
                    Err(e) => {
                        session.set_handoff(through);
                        queue::turn_over(&self.gw, session, true);
                        return Err(e);
                    }
                },
                None => None,
            };
            let (through, rewritten) = match handoff {
                Some((through, with)) => (Some(through), with),
                None => (None, rewritten),
            };
            let send = || binding.process.forward(method, &rewritten, answer);
            match session.forward_prompt(Some(prompt), send).await {
                Ok(agent_id) => {
                    session.tell_queue_if_watched();
                    agent_id
                }
                Err(e) => {
                    if let Some(through) = through {
                        session.set_handoff(through);
                    }
                    queue::turn_over(&self.gw, session, true);
                    return Err(e);
                }
            }
        } else {
            binding.process.forward(method, &rewritten, answer)?
        };
        self.tracked.remember_forwarded(id.get(), &binding.process, agent_id);
        Ok(Reply::Forwarded)
    }
}
