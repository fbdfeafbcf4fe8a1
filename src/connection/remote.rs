//! Requests for sessions another replica serves, both ways through Postgres
//! ([`crate::replica`]): a client's prompt or cancel sent to the serving replica, and the
//! serving replica's side, which runs them for a stand-in of that client and sends the answer
//! back. The answer reaches the client after every update it followed (its `afterSeq`).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::Utf8Bytes;
use serde_json::value::RawValue;

use super::methods::Ctx;
use super::request::{self, ClientRequest};
use crate::gateway::Gateway;
use crate::protocol::{self, RpcError};
use crate::replica::{Handler, Message};
use crate::session::{Client, LiveSession};

/// How often a request waiting on another replica checks that the replica still serves it.
const HOLDER_CHECK: Duration = Duration::from_millis(500);

/// Sends a client's request for `session` to `holder`, the replica serving it, and answers the
/// client when the answer comes back (after the updates it followed). If `holder` stops
/// serving the session first (it died, or gave the session up), the client is told to send
/// the request again (then this replica or another takes the session over).
pub(super) async fn forward(
    gw: &Gateway,
    client: &Arc<Client>,
    session: &Arc<LiveSession>,
    holder: &str,
    method: &str,
    id: &RawValue,
    params: &RawValue,
) -> Result<(), RpcError> {
    let Some(replica) = gw.life.bus.as_ref() else {
        return Err(RpcError::internal("no replica bus"));
    };
    let (reply, mut answer) = replica.expect_answer();
    let message = Message::Request {
        from: replica.id.to_string(),
        reply,
        session: session.id.to_string(),
        // The serving replica acts as the owner: this one checked the caller may (a share),
        // and the serving one checks again.
        user: session.owner.to_string(),
        teammate: (client.user != session.owner).then(|| client.user.to_string()),
        method: method.to_string(),
        params: params.get().to_string(),
        client_id: id.get().to_string(),
    };
    if let Err(e) = replica.send(holder, &message).await {
        replica.forget_answer(reply);
        return Err(e.into());
    }
    tracing::debug!(session = %session.id, holder, method, "request sent to the replica serving the session");
    let mut check = tokio::time::interval(HOLDER_CHECK);
    check.tick().await;
    loop {
        tokio::select! {
            a = &mut answer => {
                let Ok(a) = a else { return Err(RpcError::internal("replica bus stopped")) };
                session.respond_after(a.after_seq, &client.outbox, id, Utf8Bytes::from(a.frame));
                // Whatever the answer follows may not have been announced yet.
                gw.sessions.spawn_catch_up(session.clone());
                return Ok(());
            }
            _ = check.tick() => {
                let still = replica.holder(&session.id).await.ok().flatten();
                if still.as_deref() != Some(holder) || !replica.is_alive(holder).await.unwrap_or(true) {
                    replica.forget_answer(reply);
                    gw.sessions.spawn_catch_up(session.clone());
                    tracing::info!(session = %session.id, holder, "the replica serving the session went away during a request");
                    return Err(RpcError::internal(
                        "the gateway replica serving this session went away; send the request again",
                    ));
                }
            }
        }
    }
}

/// Sends `client`'s `session/cancel` for `session` to the replica serving it.
pub(super) async fn cancel(gw: &Gateway, client: &Client, session: &LiveSession, params: &RawValue) {
    let Some(replica) = gw.life.bus.as_ref() else { return };
    let Ok(Some(holder)) = replica.holder(&session.id).await else {
        return;
    };
    if holder == *replica.id {
        return;
    }
    let message = Message::Notify {
        session: session.id.to_string(),
        user: session.owner.to_string(),
        teammate: (client.user != session.owner).then(|| client.user.to_string()),
        method: "session/cancel".into(),
        params: params.get().to_string(),
    };
    if let Err(e) = replica.send(&holder, &message).await {
        tracing::warn!(session = %session.id, error = %e, "cannot pass a cancel to the replica serving the session");
    }
}

/// What the bus hands this replica, acted on with the whole gateway.
pub struct BusHandler {
    /// Held by the bus and lease tasks, which start-up stops after the last flush.
    gw: Gateway,
}

impl BusHandler {
    /// A handler for `gw`.
    pub fn new(gw: &Gateway) -> Arc<Self> {
        Arc::new(Self { gw: gw.clone() })
    }
}

impl Handler for BusHandler {
    fn committed(&self, session: &str, seq: u64) {
        self.gw.sessions.committed_elsewhere(session, seq);
    }

    fn resync(&self) {
        self.gw.sessions.resync();
    }

    fn message(&self, message: Message) {
        let gw = &self.gw;
        // Agent requests across replicas: handled here, in the order they were sent (a
        // `Settled` must not overtake its `Ask`); none of this waits.
        let message = match message {
            Message::Ask {
                from,
                key,
                session,
                method,
                params,
                after_seq,
            } => {
                gw.sessions
                    .ask_from_replica(&from, key, &session, &method, params, after_seq);
                return;
            }
            Message::Answered {
                from,
                key,
                result,
                error,
            } => {
                let raw = |s: Option<String>| s.and_then(|s| RawValue::from_string(s).ok());
                if let Some(asks) = gw.sessions.asks() {
                    asks.answered(&from, key, raw(result).as_deref(), raw(error).as_deref());
                }
                return;
            }
            Message::Settled { from, key } => {
                if let Some(asks) = gw.sessions.asks() {
                    asks.settled(&from, key);
                }
                return;
            }
            Message::Watching { from, session } => {
                if let Some(asks) = gw.sessions.asks() {
                    asks.watching(&from, &session);
                }
                return;
            }
            other => other,
        };
        let tracker = gw.life.tracker.clone();
        let gw = gw.clone();
        tracker.spawn(async move { serve(gw, message).await });
    }

    fn serving(&self, session: &str) -> bool {
        self.gw.sessions.serving(session)
    }

    fn lease_lost(&self, session: &str) {
        self.gw.sessions.lease_lost(session);
    }
}

/// Who sent a request another replica passed on: the session's owner, or a teammate of theirs.
#[derive(Clone, Copy)]
struct Caller<'a> {
    owner: &'a str,
    teammate: Option<&'a str>,
}

/// Runs another replica's request (or notification) here, where the session is served.
async fn serve(gw: Gateway, message: Message) {
    match message {
        Message::Request {
            from,
            reply,
            session,
            user,
            teammate,
            method,
            params,
            client_id,
        } => {
            let raw = |s: String| RawValue::from_string(s).map_err(|e| RpcError::invalid_params(e.to_string()));
            let (params, client_id) = match (raw(params), raw(client_id)) {
                (Ok(p), Ok(i)) => (p, i),
                _ => {
                    tracing::warn!(session, "unreadable request from another replica dropped");
                    return;
                }
            };
            let by = Caller {
                owner: &user,
                teammate: teammate.as_deref(),
            };
            let (frame, after_seq) = match run_request(&gw, &session, by, &method, &params, &client_id).await {
                Ok(answer) => answer,
                Err(e) => (protocol::error(Some(client_id.get()), &e), 0),
            };
            let Some(replica) = gw.life.bus.as_ref() else { return };
            let answer = Message::Answer {
                reply,
                frame,
                after_seq,
            };
            if let Err(e) = replica.send(&from, &answer).await {
                tracing::warn!(session, error = %e, "cannot send an answer to the replica that asked");
            }
        }
        Message::Notify {
            session,
            user,
            teammate,
            method,
            params,
        } => {
            let Ok(s) = gw.sessions.owned(&user, &session).await else {
                return;
            };
            if let Some(teammate) = &teammate
                && !gw.shares.controls(teammate, &session).await
            {
                refused(&gw, teammate, &session, &method);
                return;
            }
            let Ok(params) = RawValue::from_string(params) else {
                return;
            };
            let (Some(b), Some(pool)) = (s.binding(), gw.agents.pools.get(&s.agent)) else {
                return;
            };
            if let Some(params) =
                protocol::rewrite_params(&params, Some(&b.agent_session_id), Some(&pool.config().forward_meta))
            {
                let _ = b.process.send_line(protocol::notification(&method, &params)).await;
            }
        }
        Message::Answer { .. }
        | Message::Ask { .. }
        | Message::Answered { .. }
        | Message::Settled { .. }
        | Message::Watching { .. } => {}
    }
}

/// Audits a teammate's request (or cancel) another replica passed on, refused here because no
/// share lets them control the session any more: in their name, as their own replica would.
fn refused(gw: &Gateway, teammate: &str, session: &str, method: &str) {
    tracing::info!(
        session,
        user = teammate,
        method,
        "a teammate's request from another replica refused: no share lets them control the session"
    );
    gw.audit.record(crate::audit::Event {
        actor: teammate,
        action: "share_refused",
        target: Some(session),
        outcome: "refused",
        detail: Some(serde_json::json!({ "method": method, "reason": "share_ended", "relayed": true })),
        connection: None,
        client: None,
    });
}

/// Forwards another replica's client request to this replica's agent process for a stand-in
/// client; returns the answer frame and the seq it follows.
async fn run_request(
    gw: &Gateway,
    sid: &str,
    by: Caller<'_>,
    method: &str,
    params: &RawValue,
    client_id: &RawValue,
) -> Result<(String, u64), RpcError> {
    let session = gw.sessions.owned(by.owner, sid).await?;
    if let Some(teammate) = by.teammate
        && !gw.shares.controls(teammate, sid).await
    {
        // Revoked (here, or anywhere: the store says) since their replica checked.
        refused(gw, teammate, sid, method);
        return Err(RpcError::session_not_found());
    }
    if !session.is_bound_now() && gw.sessions.serving_elsewhere(&session).await?.is_some() {
        return Err(RpcError::internal(
            "this session moved to another gateway replica; send the request again",
        ));
    }
    let ClientRequest::Forward { prompt, .. } = request::parse(method, Some(params))? else {
        return Err(RpcError::invalid_params("not a session request"));
    };
    let pool = gw
        .agents
        .pools
        .get(&session.agent)
        .cloned()
        .ok_or_else(|| RpcError::internal(format!("agent {} is no longer configured", session.agent)))?;
    let (outbox, mut rx) = crate::infra::outbox::outbox(4, 64 << 20);
    let stand_in = Client::new(
        Arc::from(format!("{}-remote", gw.life.replica)),
        Arc::from(by.teammate.unwrap_or(by.owner)),
        None,
        outbox.clone(),
    );
    let ctx = Ctx::stand_in(gw.clone(), stand_in, pool);
    let _forwarded = ctx
        .forward_here(&session, method, client_id, params, prompt.as_deref(), outbox, None)
        .await?;
    let mut frames = Vec::with_capacity(1);
    if rx.recv_many(&mut frames, 1).await == 0 {
        return Err(RpcError::internal("the agent process ended before answering"));
    }
    rx.written(&frames);
    // Delivered here after every update it followed: those are all released (stored) by now.
    Ok((frames[0].to_string(), session.released()))
}
