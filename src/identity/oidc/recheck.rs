//! A working day, safely: sign-ins through the provider are checked again every `recheck_secs`
//! with their refresh token (the provider's current groups and e-mail go through the
//! [`Policy`](super::Policy) again), and one the provider no longer allows, or that was signed out
//! on any replica, ends: its WebSockets on this replica are closed with 1008.
//!
//! [`Watched`] is this replica's map from a sign-in to its open WebSockets. [`run`] is the task:
//! each tick it checks the sign-ins that are due (on any replica: the store is shared), then asks
//! the store whether the ones watched here have ended.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use openidconnect::{OAuth2TokenResponse, RefreshToken, TokenResponse};
use tokio_util::sync::CancellationToken;

use super::login::{LoginError, ProviderTokens};
use super::{Oidc, ProviderDown, error_chain};

/// Why the identity provider no longer lets a person in (it refused the refresh, or the new ID
/// token does not pass, or the policy no longer admits them).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct NoLongerIn(String);

/// Sign-ins checked per tick, at most.
const BATCH: i64 = 100;

/// The sign-ins with open WebSockets on this replica.
#[derive(Debug, Default)]
pub struct Watched(Mutex<HashMap<String, (CancellationToken, usize)>>);

/// One WebSocket's hold on its sign-in; the last one out forgets it.
#[derive(Debug)]
pub struct Watch {
    watched: Arc<Watched>,
    sid: String,
    /// Fired when the sign-in ends.
    pub ended: CancellationToken,
}

impl Watched {
    /// Watches `sid` for one more WebSocket.
    pub fn watch(self: &Arc<Self>, sid: &str) -> Watch {
        let mut map = self.0.lock();
        let entry = map
            .entry(sid.to_string())
            .or_insert_with(|| (CancellationToken::new(), 0));
        entry.1 += 1;
        Watch {
            watched: self.clone(),
            sid: sid.to_string(),
            ended: entry.0.clone(),
        }
    }

    /// Ends `sid` here: its WebSockets close.
    pub fn end(&self, sid: &str) {
        if let Some((token, _)) = self.0.lock().get(sid) {
            token.cancel();
        }
    }

    fn sids(&self) -> Vec<String> {
        self.0.lock().keys().cloned().collect()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut map = self.watched.0.lock();
        if let Some(entry) = map.get_mut(&self.sid) {
            entry.1 -= 1;
            if entry.1 == 0 {
                map.remove(&self.sid);
            }
        }
    }
}

/// Checks sign-ins until `stop`. Ended sign-ins close their sockets on their own beat, so a slow
/// provider never delays a sign-out reaching this replica.
pub async fn run(oidc: Arc<Oidc>, stop: CancellationToken) {
    let every = Duration::from_secs((oidc.cfg.recheck_secs / 2).clamp(1, 30));
    #[expect(clippy::disallowed_methods, reason = "awaited before `run` returns")]
    let watcher = {
        let (oidc, stop) = (oidc.clone(), stop.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every.min(Duration::from_secs(5)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => oidc.end_watched().await,
                    () = stop.cancelled() => return,
                }
            }
        })
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => break,
        }
        // While the provider is known to be down, one look at it (discovery) before the batch.
        if oidc.degraded().await.is_some() {
            let _ = oidc.provider(true).await;
        }
        oidc.check_due().await;
    }
    let _ = watcher.await;
}

impl Oidc {
    /// Checks the sign-ins not checked for `recheck_secs` (one batch).
    async fn check_due(&self) {
        let now = crate::infra::clock::now_secs() as i64;
        let due = match self.store.due(now - self.cfg.recheck_secs as i64, BATCH).await {
            Ok(due) => due,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the sign-ins due for a check");
                return;
            }
        };
        for record in due {
            // Another replica may be checking it: only one uses its (rotating) refresh token.
            match self.store.claim(&record.id, record.checked_at, now).await {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot take a sign-in for its check");
                    return;
                }
            }
            let Some(tokens) = self.open_session(&record) else {
                tracing::warn!(user = %record.owner, "a sign-in's provider tokens cannot be opened (another secrets key?); it is ended");
                self.end(&record.id, "its provider tokens cannot be opened").await;
                continue;
            };
            let Some(refresh) = tokens.refresh_token.clone() else {
                // Nothing to check with: it lasts until its cookie expires.
                let mut kept = record.clone();
                kept.checked_at = now;
                let _ = self.store.put(&kept).await;
                continue;
            };
            match self.refresh(&refresh).await {
                Ok(Ok((user, fresh))) if user.as_deref().is_none_or(|u| u == record.owner) => {
                    let merged = ProviderTokens {
                        refresh_token: fresh.refresh_token.or(Some(refresh)),
                        id_token: fresh.id_token.or(tokens.id_token),
                    };
                    let updated = self.seal_session(
                        &record.id,
                        &record.owner,
                        &merged,
                        record.created_at as u64,
                        record.expires_at as u64,
                        now as u64,
                    );
                    if let Err(e) = self.store.put(&updated).await {
                        tracing::warn!(user = %record.owner, error = %e, "cannot record a sign-in's check");
                    }
                }
                Ok(Ok((user, _))) => {
                    let why = format!("the provider now names this account {:?}", user.unwrap_or_default());
                    self.end(&record.id, &why).await;
                }
                Ok(Err(NoLongerIn(why))) => {
                    tracing::info!(user = %record.owner, reason = %why, "sign-in ended: the identity provider no longer lets this person in");
                    self.end(&record.id, &why).await;
                }
                Err(why) => {
                    // The provider is down (or answered with something other than a refusal):
                    // the person keeps working, checked again next time; the rest of the batch
                    // waits for the provider to come back.
                    tracing::debug!(user = %record.owner, error = %why, "sign-in not checked: provider unreachable");
                    // Its `checked_at` back to before the claim: it is due again next tick.
                    let _ = self.store.put(&record).await;
                    return;
                }
            }
        }
    }

    /// One refresh grant: `Ok(Ok((user, tokens)))` when the provider still lets the person in
    /// (`user` as its new ID token names them, when it sent one),
    /// `Ok(Err(why))` when it does not, `Err` when it cannot be reached.
    async fn refresh(
        &self,
        refresh: &str,
    ) -> Result<Result<(Option<String>, ProviderTokens), NoLongerIn>, ProviderDown> {
        let d = self.provider(false).await?;
        let client = self.client(&d).map_err(|e| ProviderDown(e.to_string()))?;
        let refresh = RefreshToken::new(refresh.to_string());
        let request = client
            .exchange_refresh_token(&refresh)
            .map_err(|e| ProviderDown(format!("the provider names no token endpoint: {e}")))?;
        let response = match request.request_async(&self.http).await {
            Ok(r) => {
                self.recovered();
                r
            }
            // Only `invalid_grant` says the person's grant is gone (revoked, expired, the user
            // removed); any other error (a rotated client secret, `temporarily_unavailable`) is
            // the provider's trouble, not a sign-out.
            Err(openidconnect::RequestTokenError::ServerResponse(e))
                if *e.error() == openidconnect::core::CoreErrorResponseType::InvalidGrant =>
            {
                return Ok(Err(NoLongerIn(format!("the provider refused the refresh: {e}"))));
            }
            Err(openidconnect::RequestTokenError::ServerResponse(e)) => {
                let why = format!("token endpoint: {e}");
                self.failed("token", &why);
                return Err(ProviderDown(why));
            }
            Err(e) => {
                let why = format!("token endpoint: {}", error_chain(&e));
                self.failed("token", &why);
                return Err(ProviderDown(why));
            }
        };
        let refresh_token = response.refresh_token().map(|r| r.secret().clone());
        let Some(id_token) = response.id_token() else {
            // No ID token on refresh: the refresh itself is the provider's yes (groups cannot be
            // read again).
            return Ok(Ok((
                None,
                ProviderTokens {
                    refresh_token,
                    id_token: None,
                },
            )));
        };
        let claims = match self.verified_claims(&client, &d, id_token, None).await {
            Ok(c) => c,
            Err(LoginError::Unavailable(why)) => return Err(why),
            Err(e) => return Ok(Err(NoLongerIn(e.to_string()))),
        };
        let claims = self.with_userinfo(&d, response.access_token().secret(), claims).await?;
        Ok(self
            .policy
            .admit(&claims)
            .map(|user| {
                (
                    Some(user),
                    ProviderTokens {
                        refresh_token,
                        id_token: Some(id_token.to_string()),
                    },
                )
            })
            .map_err(|r| NoLongerIn(r.why)))
    }

    /// Ends a sign-in everywhere (the store) and here (its WebSockets).
    pub async fn end(&self, sid: &str, why: &str) {
        if let Err(e) = self.store.revoke(sid, why).await {
            tracing::warn!(error = %e, "cannot record that a sign-in ended");
        }
        self.watched.end(sid);
    }

    /// Closes the WebSockets of sign-ins that ended (on any replica).
    async fn end_watched(&self) {
        end_ended(&self.watched, &self.store).await;
    }
}

/// Closes the connections of the sign-ins watched here that ended (signed out or revoked on any
/// replica, or expired).
pub async fn end_ended(watched: &Watched, store: &crate::identity::WebSessions) {
    let now = crate::infra::clock::now_secs() as i64;
    for sid in watched.sids() {
        match store.get(&sid).await {
            Ok(Some(r)) if r.revoked_at.is_none() && r.expires_at > now => {}
            Ok(_) => watched.end(&sid),
            Err(e) => tracing::debug!(error = %e, "cannot look a sign-in up"),
        }
    }
}

/// Without an identity provider, sign-ins still end: a device revoked or a login link's
/// sign-in signed out on another replica. Looks every `every` until `stop`.
pub async fn watch_ended(
    watched: Arc<Watched>,
    store: crate::identity::WebSessions,
    every: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => end_ended(&watched, &store).await,
            () = stop.cancelled() => return,
        }
    }
}

/// Whether the sign-in `sid` of `user` is live (checked on every request that carries it): a
/// sign-in through the provider, or one with a login link or the token form.
pub async fn is_live(store: &crate::identity::WebSessions, sid: &str, user: &str) -> bool {
    let now = crate::infra::clock::now_secs() as i64;
    match store.get(sid).await {
        Ok(Some(r)) => r.owner == user && r.revoked_at.is_none() && r.expires_at > now,
        Ok(None) => false,
        Err(e) => {
            tracing::warn!(error = %e, "cannot look a sign-in up; refused");
            false
        }
    }
}
