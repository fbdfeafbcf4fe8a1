//! `GET /api/usage`: what the caller spent this month, per day and agent, with the caps;
//! `GET /api/admin/usage`: the same for everyone (admins only).

use crate::infra::config::Config;
use crate::infra::config::UsageConfig;
use crate::usage::Usage;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use super::admin::Admin;
use super::auth::Caller;
use super::error::refuse;
use crate::gateway::Gateway;

pub(super) fn router() -> Router<Gateway> {
    Router::new()
        .route("/api/usage", get(mine))
        .route("/api/admin/usage", get(everyone))
}

async fn mine(State(usage): State<Arc<Usage>>, State(config): State<Arc<Config>>, Caller(who): Caller) -> Response {
    answer(&usage, &config.usage, Some(&who.user)).await
}

async fn everyone(State(usage): State<Arc<Usage>>, State(config): State<Arc<Config>>, Admin(_): Admin) -> Response {
    answer(&usage, &config.usage, None).await
}

async fn answer(usage: &Usage, cfg: &UsageConfig, owner: Option<&str>) -> Response {
    match usage.this_month(owner).await {
        Ok(days) => Json(json!({
            "days": days,
            "caps": { "daily": cfg.daily_cost_cap, "monthly": cfg.monthly_cost_cap, "currency": cfg.currency },
        }))
        .into_response(),
        Err(e) => {
            tracing::error!(error = %e.message, "cannot read usage");
            refuse(StatusCode::SERVICE_UNAVAILABLE, "usage cannot be read now; try again")
        }
    }
}
