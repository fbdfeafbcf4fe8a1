//! The methods a client may send the gateway, as one list: parsing (`connection::request`), the
//! `method` label of the message metrics and the controls a session keeps all take their names
//! from [`ClientMethod`], so they cannot disagree (they did: `session/fork`, `session/attach` and
//! `session/detach` were served but counted as `other`).
//!
//! The other names the gateway reads are listed here too: what an agent sends that the gateway
//! reads by name ([`agent`]) and the gateway's own `_gateway/…` extensions ([`ext`]). A test holds
//! every method name the web UI uses to these lists.

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

/// What an agent sends a client that the gateway reads by name (everything else an agent sends
/// passes through as it came).
pub mod agent {
    /// A session's update (a notification).
    pub const SESSION_UPDATE: &str = "session/update";
    /// A permission the agent asks for.
    pub const REQUEST_PERMISSION: &str = "session/request_permission";
    /// A form the agent asks to be filled in.
    pub const ELICITATION: &str = "elicitation/create";
}

/// The gateway's own extension methods (`_gateway/…`), both ways.
pub mod ext {
    /// Client → gateway (a notification): which session a tab shows, so nothing is pushed for it.
    pub const VISIBILITY: &str = "_gateway/visibility";
    /// Client → gateway: the prompt queue's requests, one of [`QUEUE_OPS`] after this.
    pub const QUEUE_PREFIX: &str = "_gateway/queue/";
    /// What may follow [`QUEUE_PREFIX`].
    pub const QUEUE_OPS: [&str; 4] = ["add", "edit", "remove", "send"];
    /// Gateway → a session's clients: its queue changed.
    pub const QUEUE: &str = "_gateway/queue";
    /// Gateway → the owner's clients: an administrator stopped the session.
    pub const SESSION_STOPPED: &str = "_gateway/session_stopped";
    /// Gateway → a client: how an agent sign-in in a terminal is going.
    pub const AUTHENTICATE_PROGRESS: &str = "_gateway/authenticate/progress";
    /// What the gateway itself sends clients (each its own `method` label of the messages sent).
    pub const TO_CLIENT: [&str; 3] = [QUEUE, SESSION_STOPPED, AUTHENTICATE_PROGRESS];
}

#[cfg(test)]
mod tests {
    use super::{ClientMethod, agent, ext};

    /// Every method name the web UI sends or handles (each quoted `'session/…'`, `'_gateway/…'`,
    /// … in `static/`) is one the gateway lists: a client method, an agent's method it reads, or
    /// one of its own extensions. A name the UI made up, or one renamed on one side only, fails.
    #[test]
    fn every_method_the_web_ui_names_is_one_the_gateway_lists() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("static");
        let mut files = vec![root.join("app.js"), root.join("sw.js")];
        for entry in std::fs::read_dir(root.join("js")).expect("static/js") {
            files.push(entry.expect("entry").path());
        }
        let mut seen = Vec::new();
        for file in files.iter().filter(|f| f.extension().is_some_and(|e| e == "js")) {
            let text = std::fs::read_to_string(file).expect("a UI module");
            // Every quote opens a candidate up to the next one (the text between two literals
            // is a candidate too, and never looks like a method name).
            let mut rest = text.as_str();
            while let Some(open) = rest.find('\'') {
                rest = &rest[open + 1..];
                let Some(close) = rest.find('\'') else { break };
                let quoted = &rest[..close];
                let looks_like_a_method = !quoted.is_empty()
                    && quoted.len() < 64
                    && ([
                        "session/",
                        "auth/",
                        "fs/",
                        "terminal/",
                        "elicitation/",
                        "_gateway/",
                        "$/",
                    ]
                    .iter()
                    .any(|p| quoted.starts_with(p))
                        || ["initialize", "authenticate"].contains(&quoted))
                    && quoted.chars().all(|c| c.is_ascii_lowercase() || "/_$".contains(c));
                if looks_like_a_method {
                    seen.push((file.display().to_string(), quoted.to_string()));
                }
            }
        }
        assert!(
            seen.iter().any(|(_, m)| m == "session/prompt") && seen.iter().any(|(_, m)| m == "_gateway/queue/add"),
            "the scan found the UI's methods: {seen:?}"
        );
        let agents = [agent::SESSION_UPDATE, agent::REQUEST_PERMISSION, agent::ELICITATION];
        let extensions: Vec<&str> = std::iter::once(ext::VISIBILITY).chain(ext::TO_CLIENT).collect();
        let queue_op = |m: &str| {
            m.strip_prefix(ext::QUEUE_PREFIX)
                .is_some_and(|op| ext::QUEUE_OPS.contains(&op))
        };
        let unknown: Vec<_> = seen
            .iter()
            .filter(|(_, m)| {
                ClientMethod::parse(m).is_none()
                    && !agents.contains(&m.as_str())
                    && !extensions.contains(&m.as_str())
                    && !queue_op(m)
            })
            .collect();
        assert!(
            unknown.is_empty(),
            "methods the web UI names that the gateway does not list: {unknown:?}"
        );
    }

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
