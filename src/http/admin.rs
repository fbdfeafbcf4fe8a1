//! `/api/admin/*`: what an administrator sees and does (`[admin]`: named users, or members of the
//! identity provider's admin groups). Everyone else gets `403` on every route. Admins never read
//! a transcript here: users, counts, states and the audit log only.
//!
//! - `GET /api/admin/users`: every user seen (stored sessions, stored bytes, last activity, last
//!   sign-in, live sessions and agent processes on this replica);
//! - `GET /api/admin/sessions`: the sessions on an agent process of this replica, any user's
//!   (owner, agent, state, since when);
//! - `POST /api/admin/sessions/{id}/stop`: cancels the session's prompt and closes it on its agent;
//!   the owner's clients get `_gateway/session_stopped` saying who and why;
//! - `GET /api/admin/audit?actor=&action=&before=&limit=`: the audit log, newest first, a page at
//!   a time (`before`: the last `id` of the previous page).

use crate::agents::pool::Pools;
use crate::audit::Audit;
use crate::gateway::Identities;
use crate::gateway::Life;
use crate::session::Sessions;
use axum::extract::FromRef;
use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::auth::Caller;
use super::error::refuse;
use super::server::Peer;
use crate::audit::AuditFilter;
use crate::gateway::Gateway;
use crate::identity::auth::Identity;
use crate::protocol;
use crate::store::iso8601;

/// The notification the owner's clients get when an admin stops their session.
pub const STOPPED: &str = protocol::method::ext::SESSION_STOPPED;

pub(super) fn router() -> Router<Gateway> {
    Router::new()
        .route("/api/admin/users", get(users))
        .route("/api/admin/sessions", get(sessions))
        .route("/api/admin/sessions/{id}/stop", post(stop))
        .route("/api/admin/audit", get(audit))
}

/// An authenticated administrator.
pub struct Admin(pub Identity);

impl<S> FromRequestParts<S> for Admin
where
    Arc<Identities>: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Caller(who) = Caller::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        if !Arc::<Identities>::from_ref(state).is_admin(&who) {
            tracing::info!(user = %who.user, path = %parts.uri.path(), "admin route refused to a non-admin");
            return Err(refuse(
                StatusCode::FORBIDDEN,
                "this route is for the gateway's administrators ([admin] users or groups)",
            ));
        }
        Ok(Admin(who))
    }
}

async fn users(
    State(sessions): State<Arc<Sessions>>,
    State(audit): State<Arc<Audit>>,
    State(pools): State<Arc<Pools>>,
    State(life): State<Arc<Life>>,
    Admin(_): Admin,
) -> Response {
    // Stored bytes and last activity as of every update stored so far (the transcript writer
    // advances session rows after their chunks, when its queue is quiet).
    if let Err(e) = sessions.flush_for_request().await {
        tracing::error!(error = %e, "the transcript writer did not flush for the users overview");
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "the transcript is not written yet; try again",
        );
    }
    let store = sessions.store();
    let (stored, signins) = match (
        crate::store::in_time(store.users_overview(10_000)).await,
        audit.last_sign_ins().await,
    ) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!(error = %e, "cannot read the users overview");
            return refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "the database cannot be read now; try again",
            );
        }
    };
    let mut users: BTreeMap<String, Value> = BTreeMap::new();
    for u in stored {
        users.insert(
            u.owner.clone(),
            json!({ "user": u.owner, "sessions": u.sessions, "storedBytes": u.stored_bytes,
                    "lastActive": iso8601(u.last_active), "lastSignIn": null }),
        );
    }
    for (user, at) in signins {
        let entry = users.entry(user.clone()).or_insert_with(
            || json!({ "user": user, "sessions": 0, "storedBytes": 0, "lastActive": null, "lastSignIn": null }),
        );
        entry["lastSignIn"] = json!(iso8601(at));
    }
    let processes = pools.processes_by_owner();
    let out: Vec<Value> = users
        .into_values()
        .map(|mut u| {
            let name = u["user"].as_str().unwrap_or_default().to_string();
            u["liveSessions"] = json!(sessions.live_count(&name));
            u["agentProcesses"] = json!(processes.get(name.as_str()).copied().unwrap_or(0));
            u
        })
        .collect();
    Json(json!({ "users": out, "replica": life.replica })).into_response()
}

async fn sessions(
    State(sessions): State<Arc<Sessions>>,
    State(life): State<Arc<Life>>,
    Admin(_): Admin,
) -> Json<Value> {
    let mut out = Vec::new();
    for s in sessions.all_bound() {
        let Some(b) = s.binding() else { continue };
        let prompting = b.process.prompting().iter().any(|p| **p == *s.id);
        out.push(json!({
            "sessionId": &*s.id, "owner": &*s.owner, "agent": &*s.agent,
            "state": if prompting { "prompting" } else { "idle" },
            "since": iso8601(b.since), "process": b.process.pid,
        }));
    }
    Json(json!({ "sessions": out, "replica": life.replica }))
}

async fn stop(
    State(sessions): State<Arc<Sessions>>,
    State(pools): State<Arc<Pools>>,
    State(audit_log): State<Arc<Audit>>,
    Admin(admin): Admin,
    peer: Option<Extension<Peer>>,
    Path(id): Path<String>,
) -> Response {
    let Some(session) = sessions.any_live(&id).filter(|s| s.is_bound_now()) else {
        return refuse(
            StatusCode::NOT_FOUND,
            format!("no session {id:?} is live on this replica"),
        );
    };
    if let Some(b) = session.binding() {
        let mut params = String::from(r#"{"sessionId":"#);
        protocol::push_json_str(&mut params, &b.agent_session_id);
        params.push('}');
        let _ = b
            .process
            .send_line(protocol::notification("session/cancel", &params))
            .await;
    }
    let notice = json!({
        "sessionId": &*session.id,
        "by": admin.user,
        "reason": format!("stopped by the administrator {}", admin.user),
    });
    let told = session.tell_clients(STOPPED, &protocol::notification(STOPPED, &notice.to_string()).into());
    sessions.close_on_agent(&session, &pools).await;
    tracing::info!(admin = %admin.user, owner = %session.owner, session = %session.id, told, "session stopped by an admin");
    audit_log.record(crate::audit::Event {
        actor: &admin.user,
        action: "admin_stop",
        target: Some(&session.id),
        outcome: "ok",
        detail: Some(json!({ "owner": &*session.owner, "clientsTold": told })),
        connection: None,
        client: peer.map(|p| p.client.to_string()),
    });
    Json(json!({ "stopped": &*session.id, "clientsTold": told })).into_response()
}

#[derive(Deserialize)]
struct AuditQuery {
    actor: Option<String>,
    action: Option<String>,
    before: Option<i64>,
    limit: Option<i64>,
}

async fn audit(State(audit): State<Arc<Audit>>, Admin(_): Admin, Query(q): Query<AuditQuery>) -> Response {
    let filter = AuditFilter {
        actor: q.actor.filter(|a| !a.is_empty()),
        action: q.action.filter(|a| !a.is_empty()),
        before: q.before,
        limit: q.limit.unwrap_or(100).clamp(1, 1000),
    };
    match audit.page(&filter).await {
        Ok(entries) => {
            let next = (entries.len() as i64 == filter.limit)
                .then(|| entries.last().map(|e| e.id))
                .flatten();
            let entries: Vec<Value> = entries
                .into_iter()
                .map(|e| {
                    json!({
                        "id": e.id, "at": iso8601(e.at), "actor": e.actor, "action": e.action,
                        "target": e.target, "outcome": e.outcome,
                        "detail": e.detail.and_then(|d| serde_json::from_str::<Value>(&d).ok()),
                        "connection": e.connection, "replica": e.replica, "clientAddr": e.client_addr,
                    })
                })
                .collect();
            Json(json!({ "entries": entries, "nextBefore": next })).into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot read the audit log");
            refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "the audit log cannot be read now; try again",
            )
        }
    }
}
