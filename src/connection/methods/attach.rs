//! `session/attach` and `session/detach` (the draft "Multi-Client Session Attach" RFD): a client
//! joins a session live as a **controller** or an **observer**, with the history it asks for;
//! the session is the caller's own, or one its owner shared with them ([`crate::sharing`]). Here
//! too is the one check of who may reach a session at all ([`Ctx::reach`]), and may act on it
//! ([`Ctx::controllable`]).

use super::*;
use crate::connection::request::History;
use crate::sharing::ShareAccess;
use crate::sharing::{self, Role};

impl Ctx {
    /// Session `sid` if the caller may reach it: their own (`None`), or shared with them (the
    /// share giving the most). Unknown ids, other users' sessions and ended shares get the same
    /// `-32002`.
    pub(super) async fn reach(&self, sid: &str) -> Result<(Arc<LiveSession>, Option<ShareAccess>), RpcError> {
        match self.owned(sid).await {
            Ok(session) => return Ok((session, None)),
            Err(e) if e.code != codes::RESOURCE_NOT_FOUND => return Err(e),
            Err(_) => {}
        }
        let access = self
            .gw
            .shares
            .access(&self.client.user, sid)
            .await?
            .ok_or_else(RpcError::session_not_found)?;
        // Read as its owner: the share is what let the caller in.
        let session = self.gw.sessions.owned(&access.owner, sid).await?;
        Ok((session, Some(access)))
    }

    /// Session `sid` if the caller may act on it (`what`): their own, or shared with them as a
    /// controller; an observer is refused (and the refusal audited).
    pub(super) async fn controllable(&self, sid: &str, what: &str) -> Result<Arc<LiveSession>, RpcError> {
        let (session, access) = self.reach(sid).await?;
        if let Some(access) = access {
            if Role::of(&access.role) != Role::Controller {
                self.audit(
                    "share_refused",
                    Some(sid),
                    "refused",
                    Some(json!({ "method": what, "share": access.share_id })),
                );
                return Err(sharing::observer_refused(what));
            }
            self.gw.shares.watch(&self.client, &access);
            // Watched from now on; a revoke made before that would have gone unseen until the
            // watcher's next pass, so the store is asked once more.
            let still = self.gw.shares.access(&self.client.user, sid).await?;
            if still.is_none_or(|a| Role::of(&a.role) != Role::Controller) {
                self.gw.shares.unwatch(&self.client, sid);
                return Err(RpcError::session_not_found());
            }
        }
        Ok(session)
    }

    /// `session/attach`: answers with the role granted, the history policy, and the session's
    /// controls (as `session/load` does).
    pub(super) async fn attach_session(&self, sid: &str, asked: Option<Role>, history: History, after: u64) -> Handled {
        let (session, access) = self.reach(sid).await?;
        let allowed = access.as_ref().map_or(Role::Controller, |a| Role::of(&a.role));
        let role = asked.unwrap_or(allowed);
        if role > allowed {
            self.audit(
                "session_attach",
                Some(sid),
                "refused",
                Some(json!({ "role": role.as_str() })),
            );
            return Err(sharing::observer_refused("attaching as a controller"));
        }
        if let Some(access) = &access {
            self.gw.shares.watch(&self.client, access);
        }
        self.tracked.attached(&session.id);
        let how = crate::session::Attach {
            replay: history == History::Full,
            after_seq: after,
            observer: role == Role::Observer,
            ask_open: history != History::None,
        };
        if let Err(e) = session.attach_as(&self.client, &**self.gw.sessions.store(), how).await {
            self.tracked.left(sid);
            return Err(e);
        }
        // Commits of the session are announced here from now on. Other replicas' agents ask
        // their requests of replicas that watch the session: one with only observers would
        // take a request nobody there may answer.
        self.gw.sessions.followed(&session, role == Role::Controller).await;
        self.audit(
            "session_attach",
            Some(sid),
            "ok",
            Some(json!({
                "role": role.as_str(),
                "historyPolicy": history.as_str(),
                "owner": &*session.owner,
                "share": access.as_ref().map(|a| a.share_id.as_str()),
            })),
        );
        let controls = self.controls_answer(&session).await?;
        let mut result: Value = serde_json::from_str(&controls).unwrap_or_else(|_| json!({}));
        if let Some(obj) = result.as_object_mut() {
            obj.insert("sessionId".into(), json!(&*session.id));
            obj.insert("role".into(), json!(role.as_str()));
            obj.insert("historyPolicy".into(), json!(history.as_str()));
            obj.insert(
                "_meta".into(),
                json!({ "gateway": {
                    "owner": &*session.owner,
                    "shared": access.is_some(),
                    "shareExpiresAt": access.as_ref().and_then(|a| a.expires_at).map(crate::store::iso8601),
                }}),
            );
        }
        Ok(Reply::Result(result.to_string()))
    }

    /// `session/detach`: the caller stops receiving the session (it goes on for everyone else);
    /// `-32002` when this connection is not attached to it.
    pub(super) fn detach_session(&self, sid: &str) -> Handled {
        if !self.tracked.is_attached(sid) {
            return Err(RpcError::session_not_found());
        }
        if let Some(session) = self.gw.sessions.any_live(sid) {
            session.detach(&self.client);
        }
        self.tracked.left(sid);
        self.gw.shares.unwatch(&self.client, sid);
        self.audit("session_detach", Some(sid), "ok", None);
        Ok(Reply::Result(String::from("{}")))
    }
}
