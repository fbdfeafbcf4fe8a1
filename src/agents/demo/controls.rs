//! The controls a demo prompt's text may carry (`[chunks=N]`, `[permission]`, …).

/// Prompt controls parsed from the first text block of a prompt.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Controls {
    /// `[chunks=N]`: stream N reply chunks instead of the configured number.
    pub(super) chunks: Option<u64>,
    /// `[delay_us=N]`: wait N microseconds between updates instead of the configured delay.
    pub(super) delay_us: Option<u64>,
    /// `[permission]`, or the words "ask me" or "permission" anywhere (any case): ask the client
    /// for permission before running the tool call.
    pub(super) permission: bool,
    /// `[crash]`: send one chunk, then exit the process with code 3.
    pub(super) crash: bool,
    /// `[hang]`: send the plan, then never answer until cancelled.
    pub(super) hang: bool,
    /// `[title=XYZ]`: send a `session_info_update` with this title first.
    pub(super) title: Option<String>,
}

/// Parses the controls out of a prompt's text; malformed controls are ignored.
pub(super) fn parse_controls(text: &str) -> Controls {
    let num = |key: &str| tag_value(text, key).and_then(|v| v.trim().parse().ok());
    Controls {
        chunks: num("chunks"),
        delay_us: num("delay_us"),
        permission: text.contains("[permission]") || asks_permission(text),
        crash: text.contains("[crash]"),
        hang: text.contains("[hang]"),
        title: tag_value(text, "title").filter(|t| !t.is_empty()).map(str::to_owned),
    }
}

/// Whether the prompt asks in words to be asked first: "ask me", or a word starting with
/// "permission" ("permission", "permissions"), in any case, not inside a longer word.
pub(super) fn asks_permission(text: &str) -> bool {
    let lower = text.to_lowercase();
    let starts_word = |i: usize| {
        lower
            .get(..i)
            .and_then(|before| before.chars().next_back())
            .is_none_or(|c| !c.is_alphanumeric())
    };
    let ends_word = |i: usize| {
        lower
            .get(i..)
            .and_then(|after| after.chars().next())
            .is_none_or(|c| !c.is_alphanumeric())
    };
    lower
        .match_indices("ask me")
        .any(|(i, m)| starts_word(i) && ends_word(i + m.len()))
        || lower.match_indices("permission").any(|(i, _)| starts_word(i))
}

/// The text between `[key=` and the next `]`, if present.
pub(super) fn tag_value<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let open = format!("[{key}=");
    let rest = text.get(text.find(&open)? + open.len()..)?;
    rest.get(..rest.find(']')?)
}
