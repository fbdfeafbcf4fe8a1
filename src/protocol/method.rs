//! The methods a client may send the gateway, as one list: parsing (`connection::request`), the
//! `method` label of the message metrics and the controls a session keeps all take their names
//! from [`ClientMethod`], so they cannot disagree (they did: `session/fork`, `session/attach` and
//! `session/detach` were served but counted as `other`).

/// A method a client sends: requests, and the two notifications (`session/cancel`,
/// `$/cancel_request`). Extension methods (`_…`) are not listed: they are forwarded by prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientMethod {
    /// `initialize`.
    Initialize,
    /// `authenticate`.
    Authenticate,
    /// `auth/status` (draft).
    AuthStatus,
    /// `session/new`.
    SessionNew,
    /// `session/fork` (draft).
    SessionFork,
    /// `session/load`.
    SessionLoad,
    /// `session/resume` (draft).
    SessionResume,
    /// `session/attach` (the multi-client attach RFD).
    SessionAttach,
    /// `session/detach`.
    SessionDetach,
    /// `session/list`.
    SessionList,
    /// `session/close`.
    SessionClose,
    /// `session/delete` (the gateway's).
    SessionDelete,
    /// `session/prompt`.
    SessionPrompt,
    /// `session/set_mode`.
    SetMode,
    /// `session/set_config_option`.
    SetConfigOption,
    /// `session/set_model` (unstable).
    SetModel,
    /// `session/cancel` (a notification).
    SessionCancel,
    /// `$/cancel_request` (a notification).
    CancelRequest,
}

impl ClientMethod {
    /// Every method, `session/prompt` among the first metric labels as before.
    pub const ALL: [Self; 18] = [
        Self::Initialize,
        Self::Authenticate,
        Self::AuthStatus,
        Self::SessionNew,
        Self::SessionFork,
        Self::SessionLoad,
        Self::SessionResume,
        Self::SessionAttach,
        Self::SessionDetach,
        Self::SessionList,
        Self::SessionClose,
        Self::SessionDelete,
        Self::SessionPrompt,
        Self::SetMode,
        Self::SetConfigOption,
        Self::SetModel,
        Self::SessionCancel,
        Self::CancelRequest,
    ];

    /// Its name on the wire.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Initialize => "initialize",
            Self::Authenticate => "authenticate",
            Self::AuthStatus => "auth/status",
            Self::SessionNew => "session/new",
            Self::SessionFork => "session/fork",
            Self::SessionLoad => "session/load",
            Self::SessionResume => "session/resume",
            Self::SessionAttach => "session/attach",
            Self::SessionDetach => "session/detach",
            Self::SessionList => "session/list",
            Self::SessionClose => "session/close",
            Self::SessionDelete => "session/delete",
            Self::SessionPrompt => "session/prompt",
            Self::SetMode => "session/set_mode",
            Self::SetConfigOption => "session/set_config_option",
            Self::SetModel => "session/set_model",
            Self::SessionCancel => "session/cancel",
            Self::CancelRequest => "$/cancel_request",
        }
    }

    /// The method named `name`, if a client may send it.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Whether it changes a session's controls (mode, config options, model): the agent's answer
    /// is kept as the session's controls.
    pub const fn is_control(self) -> bool {
        matches!(self, Self::SetMode | Self::SetConfigOption | Self::SetModel)
    }
}

/// The names of [`ClientMethod::ALL`] followed by `other`: the `method` label values of messages
/// from clients, resolved once at start.
pub const fn labels_then(other: &'static str) -> [&'static str; ClientMethod::ALL.len() + 1] {
    let mut out = [other; ClientMethod::ALL.len() + 1];
    let mut i = 0;
    while i < ClientMethod::ALL.len() {
        out[i] = ClientMethod::ALL[i].name();
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::ClientMethod;

    #[test]
    fn every_method_parses_back_from_its_name_and_nothing_else_does() {
        for m in ClientMethod::ALL {
            assert_eq!(ClientMethod::parse(m.name()), Some(m));
        }
        for other in ["", "session/unknown", "_vendor/x", "Session/new", "session/new "] {
            assert_eq!(ClientMethod::parse(other), None, "{other:?}");
        }
        let controls: Vec<_> = ClientMethod::ALL
            .into_iter()
            .filter(|m| m.is_control())
            .map(|m| m.name())
            .collect();
        assert_eq!(
            controls,
            ["session/set_mode", "session/set_config_option", "session/set_model"]
        );
    }
}
