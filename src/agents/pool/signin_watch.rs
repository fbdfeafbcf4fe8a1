//! What an agent tells its user while it signs them in. An `agent`-type sign-in (ACP
//! `authenticate`, e.g. codex's `chatgpt`) may need the person for a moment: a URL to open or a
//! device code to type elsewhere. Agents say it in one of three ways: a notification of their
//! own while the request runs, the answer's `_meta`, or a line on stderr. The answer reaches the
//! client anyway; this carries the other two to the connection that asked, while it waits.
//!
//! Only a user's own process is ever watched (a shared process's sign-in is the operator's), and
//! only stderr lines that hold a URL or a code are passed on: the rest of stderr stays in the
//! logs. Bounded: [`NOTES_MAX`] notes of at most [`NOTE_BYTES_MAX`] bytes per sign-in.

use parking_lot::Mutex;

use serde_json::value::RawValue;
use tokio::sync::mpsc;

use super::child::lock;

/// Notes passed on per sign-in; later ones are dropped (and logged).
pub const NOTES_MAX: usize = 64;
/// Longest note passed on (a longer one is cut at a character boundary).
pub const NOTE_BYTES_MAX: usize = 2048;

/// One thing the agent said for its user while signing in, as the `params` of a
/// `_gateway/authenticate/progress` notification (JSON).
pub type Note = String;

/// The current sign-in's listener, if one is running, and its method's id.
#[derive(Default)]
pub struct SigninWatch(Mutex<Option<(mpsc::Sender<Note>, String)>>);

impl SigninWatch {
    /// Starts passing notes on for the sign-in with `method_id` (each note names it), replacing
    /// any earlier listener.
    pub fn watch(&self, method_id: &str) -> mpsc::Receiver<Note> {
        let (tx, rx) = mpsc::channel(NOTES_MAX);
        *lock(&self.0) = Some((tx, method_id.to_string()));
        rx
    }

    /// Stops passing notes on.
    pub fn stop(&self) {
        lock(&self.0).take();
    }

    fn pass(&self, mut note: serde_json::Value) {
        let guard = lock(&self.0);
        let Some((tx, method_id)) = guard.as_ref() else { return };
        note["methodId"] = method_id.as_str().into();
        if tx.try_send(note.to_string()).is_err() {
            tracing::debug!("sign-in note dropped: the listener is full or gone");
        }
    }

    /// A stderr line: passed on when it holds a URL or a code meant for the person.
    pub fn stderr(&self, line: &str) {
        if lock(&self.0).is_none() || !for_the_user(line) {
            return;
        }
        let text = cut(line);
        let mut note = serde_json::json!({ "source": "stderr", "text": text });
        if let Some(url) = url_in(text) {
            note["url"] = url.into();
        }
        self.pass(note);
    }

    /// A notification the gateway has no other use for (an agent's own `_…` method, say).
    pub fn notification(&self, method: &str, params: Option<&RawValue>) {
        if lock(&self.0).is_none() {
            return;
        }
        let raw = params.map_or("null", |p| p.get());
        let params: serde_json::Value = if raw.len() <= NOTE_BYTES_MAX {
            serde_json::from_str(raw).unwrap_or(serde_json::Value::Null)
        } else {
            serde_json::Value::Null
        };
        let mut note = serde_json::json!({ "source": "notification", "method": cut(method), "params": params });
        if let Some(url) = url_in(raw) {
            note["url"] = url.into();
        }
        self.pass(note);
    }
}

/// At most [`NOTE_BYTES_MAX`] bytes of `s`, cut at a character boundary.
fn cut(s: &str) -> &str {
    if s.len() <= NOTE_BYTES_MAX {
        return s;
    }
    let mut end = NOTE_BYTES_MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Whether a stderr line is meant for the person signing in: it holds a web address, or it
/// speaks of a code (a device or one-time code to type elsewhere).
fn for_the_user(line: &str) -> bool {
    url_in(line).is_some() || line.to_ascii_lowercase().contains("code")
}

/// The first `http(s)://` address in `text`, up to whitespace or a quote.
pub fn url_in(text: &str) -> Option<&str> {
    let start = text.find("https://").or_else(|| text.find("http://"))?;
    let rest = &text[start..];
    let end = rest
        .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '\\'))
        .unwrap_or(rest.len());
    let url = rest[..end].trim_end_matches(['.', ',', ')', ';']);
    (url.len() > "https://".len()).then_some(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_found_and_trimmed() {
        assert_eq!(
            url_in("open https://auth.example/device?x=1. then"),
            Some("https://auth.example/device?x=1")
        );
        assert_eq!(url_in(r#"{"verification_uri":"http://h/a"}"#), Some("http://h/a"));
        assert_eq!(url_in("no address here"), None);
        assert_eq!(url_in("https://"), None);
    }

    #[tokio::test]
    async fn only_lines_for_the_user_pass_and_only_while_watched() {
        let watch = SigninWatch::default();
        watch.stderr("Go to https://example/device before anything");
        let mut rx = watch.watch("device");
        watch.stderr("debug: loading config");
        watch.stderr("Enter code ABCD-1234");
        watch.stderr("Go to https://example/device");
        watch.notification(
            "_codex/login",
            RawValue::from_string(r#"{"u":"https://x/y"}"#.into()).ok().as_deref(),
        );
        watch.stop();
        watch.stderr("Enter code late");
        let mut notes = Vec::new();
        while let Ok(n) = rx.try_recv() {
            notes.push(serde_json::from_str::<serde_json::Value>(&n).expect("json"));
        }
        assert_eq!(notes.len(), 3, "{notes:?}");
        assert_eq!(notes[0]["text"], "Enter code ABCD-1234");
        assert_eq!(notes[0]["methodId"], "device");
        assert!(notes[0].get("url").is_none());
        assert_eq!(notes[1]["url"], "https://example/device");
        assert_eq!(notes[2]["source"], "notification");
        assert_eq!(notes[2]["params"]["u"], "https://x/y");
        assert_eq!(notes[2]["url"], "https://x/y");
    }

    #[test]
    fn long_lines_are_cut_on_a_character() {
        let long = "é".repeat(NOTE_BYTES_MAX);
        assert!(cut(&long).len() <= NOTE_BYTES_MAX);
        assert!(cut(&long).chars().all(|c| c == 'é'));
    }
}
