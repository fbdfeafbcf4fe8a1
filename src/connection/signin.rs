//! The requests about the user rather than a session: ACP `authenticate` and the draft
//! `auth/status` ("Agent Authentication State Query" RFD; agents that advertise
//! `agentCapabilities.auth.status`). Both go to the caller's own agent process: its `HOME` is
//! theirs, so the login it stores, and the state it reports, belong to them alone.
//!
//! While an `authenticate` runs, what the agent tells its user meanwhile (a URL to open, a device
//! code: see [`signin_watch`](crate::agents::pool::signin_watch)) reaches the connection that asked as
//! `_gateway/authenticate/progress` notifications, before the answer.

use std::sync::Arc;

use axum::extract::ws::Utf8Bytes;
use serde_json::value::RawValue;

use super::methods::{Handled, Reply};
use crate::agents::pool::AgentPool;
use crate::gateway::Gateway;
use crate::protocol::{self, RpcError, codes};
use crate::session::Client;

/// The notification that carries what an agent says for its user during a sign-in.
pub const PROGRESS: &str = crate::protocol::method::ext::AUTHENTICATE_PROGRESS;

/// ACP `authenticate`. A shared agent's processes serve several users, so its login is the
/// operator's to set up, not a client's.
pub(super) async fn authenticate(gw: &Gateway, client: &Client, pool: &Arc<AgentPool>, params: &RawValue) -> Handled {
    if pool.is_shared() {
        return Err(RpcError::new(
            codes::INVALID_REQUEST,
            format!(
                "agent {} serves several users from one process; its login is configured by the operator",
                pool.name
            ),
        ));
    }
    let forwarded = protocol::rewrite_params(params, None, Some(&pool.config().forward_meta))
        .ok_or_else(|| RpcError::invalid_params("params must be an object"))?;
    let method = serde_json::from_str::<serde_json::Value>(params.get())
        .ok()
        .and_then(|p| p.get("methodId").and_then(|m| m.as_str()).map(String::from))
        .unwrap_or_default();
    let process = pool.process_for(&client.user).await?;
    let watch = process.signin_watch();
    let mut notes = watch.watch(&method);
    let pass_on = |note: String| {
        let told = client
            .outbox
            .push(Utf8Bytes::from(protocol::notification(PROGRESS, &note)));
        crate::infra::metrics::message_out(crate::infra::metrics::Peer::Client, PROGRESS, u64::from(told));
        told
    };
    let request = process.request("authenticate", &forwarded, pool.request_timeout());
    tokio::pin!(request);
    let result = loop {
        tokio::select! {
            biased;
            Some(note) = notes.recv() => { pass_on(note); }
            result = &mut request => break result,
        }
    };
    watch.stop();
    // What was said just before the answer still goes first.
    while let Ok(note) = notes.try_recv() {
        pass_on(note);
    }
    // One line and one count per sign-in, whatever the agent answered (never its content).
    let outcome = if result.is_ok() { "ok" } else { "failed" };
    if result.is_ok() {
        crate::signin::remember(gw.settings.keys.rows(), &client.user, &pool.name, &method).await;
    }
    crate::infra::metrics::signin(&pool.name, "agent", outcome);
    tracing::info!(connection = %client.id, user = %client.user, agent = %pool.name, method = %method, method_type = "agent", outcome, "agent sign-in");
    gw.audit.record(crate::audit::Event {
        actor: &client.user,
        action: "agent_sign_in",
        target: Some(&pool.name),
        outcome,
        detail: Some(serde_json::json!({ "method": method, "methodType": "agent" })),
        connection: Some(&client.id),
        client: client.addr(),
    });
    Ok(Reply::Result(result?.get().to_string()))
}

/// The draft `auth/status`: whether the caller's own process has credentials. An agent that
/// does not know the method answers `-32601` itself.
pub(super) async fn status(client: &Client, pool: &Arc<AgentPool>, params: &RawValue) -> Handled {
    let forwarded = protocol::rewrite_params(params, None, Some(&pool.config().forward_meta))
        .ok_or_else(|| RpcError::invalid_params("params must be an object"))?;
    let process = pool.process_for(&client.user).await?;
    let result = process
        .request("auth/status", &forwarded, pool.request_timeout())
        .await?;
    Ok(Reply::Result(result.get().to_string()))
}
