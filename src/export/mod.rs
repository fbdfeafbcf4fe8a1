//! A stored transcript, exported: JSON Lines (every stored update with its seq and when it was
//! stored) or Markdown (the conversation as a person reads it). Read from the store one page of
//! chunks at a time, as the client takes them, so a session of any length costs one page of
//! memory and a slow reader holds nothing but its place.

mod markdown;

use std::sync::Arc;

use bytes::Bytes;
use futures_util::Stream;

pub use markdown::Markdown;

use crate::store::{SessionRecord, Store, StoreError};

/// What an export is written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One stored update per line: `{"seq":N,"time":"…","update":{…}}`.
    Jsonl,
    /// The conversation as a person reads it.
    Markdown,
}

/// An export format asked for that there is not.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown export format {0:?}: expected jsonl or markdown")]
pub struct UnknownFormat(pub String);

impl Format {
    /// `jsonl` (also the default) or `markdown`/`md`; anything else is named in the error.
    pub fn parse(s: Option<&str>) -> Result<Self, UnknownFormat> {
        match s.unwrap_or("jsonl") {
            "jsonl" | "ndjson" => Ok(Self::Jsonl),
            "markdown" | "md" => Ok(Self::Markdown),
            other => Err(UnknownFormat(other.to_string())),
        }
    }

    /// The response's `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Jsonl => "application/x-ndjson; charset=utf-8",
            Self::Markdown => "text/markdown; charset=utf-8",
        }
    }

    /// The downloaded file's extension.
    pub fn extension(self) -> &'static str {
        match self {
            Self::Jsonl => "jsonl",
            Self::Markdown => "md",
        }
    }
}

/// Turns stored updates, in order, into the export's text.
enum Writer {
    Jsonl,
    Markdown(Box<Markdown>),
}

impl Writer {
    fn update(&mut self, seq: i64, stored_at: i64, update: &str, out: &mut String) {
        match self {
            Self::Jsonl => jsonl_line(seq, stored_at, update, out),
            Self::Markdown(md) => md.update(stored_at, update, out),
        }
    }
}

/// One JSON Lines record. The stored update is JSON the gateway wrote itself, so it goes in as
/// it is, not parsed and printed again.
pub fn jsonl_line(seq: i64, stored_at: i64, update: &str, out: &mut String) {
    use std::fmt::Write;
    let _ = writeln!(
        out,
        "{{\"seq\":{seq},\"time\":\"{}\",\"update\":{update}}}",
        crate::store::iso8601(stored_at)
    );
}

struct State {
    store: Arc<dyn Store>,
    owner: String,
    id: String,
    /// Updates above this seq were stored after the export began: left out, so an export of a
    /// running session is the transcript as it was when asked for.
    through: i64,
    after: i64,
    writer: Writer,
    started: bool,
    done: bool,
}

/// The export of `record` (already checked to be the caller's), as a stream of pieces of text
/// for an HTTP body. The store is asked for the next page only when the client has taken the
/// previous one. A store failure midway ends the stream with the error (the client sees the
/// download cut short, never a file that looks whole).
pub fn stream(
    store: Arc<dyn Store>,
    record: SessionRecord,
    format: Format,
) -> impl Stream<Item = Result<Bytes, StoreError>> + Send + 'static {
    let writer = match format {
        Format::Jsonl => Writer::Jsonl,
        Format::Markdown => Writer::Markdown(Box::new(Markdown::new(&record))),
    };
    let state = State {
        store,
        owner: record.owner,
        id: record.id,
        through: record.last_seq,
        after: 0,
        writer,
        started: false,
        done: false,
    };
    futures_util::stream::unfold(state, |mut s| async move {
        if s.done {
            return None;
        }
        let mut out = String::new();
        if !s.started {
            s.started = true;
            if let Writer::Markdown(md) = &mut s.writer {
                md.begin(&mut out);
                return Some((Ok(Bytes::from(out)), s));
            }
        }
        match next_page(&mut s, &mut out).await {
            Ok(()) => Some((Ok(Bytes::from(out)), s)),
            Err(e) => {
                tracing::error!(session = %s.id, error = %e, "export stopped: the store failed");
                s.done = true;
                Some((Err(e), s))
            }
        }
    })
}

/// Writes the next page of updates into `out`; at the end, the format's closing and `done`.
async fn next_page(s: &mut State, out: &mut String) -> Result<(), StoreError> {
    let chunks = if s.after >= s.through {
        Vec::new()
    } else {
        crate::store::in_time(
            s.store
                .read_events(&s.owner, &s.id, s.after, crate::store::READ_PAGE_CHUNKS),
        )
        .await?
    };
    for chunk in &chunks {
        for (seq, line) in (chunk.seq_from..).zip(chunk.payload.split('\n')) {
            if seq > s.after && seq <= s.through {
                s.writer.update(seq, chunk.stored_at, line, out);
                s.after = seq;
            }
        }
        s.after = s.after.max(chunk.seq_to.min(s.through));
    }
    if chunks.is_empty() || s.after >= s.through {
        if let Writer::Markdown(md) = &mut s.writer {
            md.end(out);
        }
        s.done = true;
    }
    Ok(())
}

/// A file name for the download: the title's letters and digits (so it is safe in a header and
/// on any file system), then the session id.
pub fn file_name(record: &SessionRecord, format: Format) -> String {
    let mut stem: String = record
        .title
        .as_deref()
        .unwrap_or("")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    stem = stem.split('-').filter(|w| !w.is_empty()).collect::<Vec<_>>().join("-");
    stem.truncate(48);
    let stem = stem.trim_end_matches('-');
    let id: String = record
        .id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    if stem.is_empty() {
        format!("session-{id}.{}", format.extension())
    } else {
        format!("{stem}-{id}.{}", format.extension())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_their_refusal() {
        assert_eq!(Format::parse(None), Ok(Format::Jsonl));
        assert_eq!(Format::parse(Some("markdown")), Ok(Format::Markdown));
        let e = Format::parse(Some("pdf")).unwrap_err().to_string();
        assert_eq!(e, "unknown export format \"pdf\": expected jsonl or markdown");
    }

    #[test]
    fn a_jsonl_line_holds_the_update_as_stored() {
        let mut out = String::new();
        jsonl_line(
            7,
            1_700_000_000_000_000,
            r#"{"sessionUpdate":"plan","entries":[]}"#,
            &mut out,
        );
        let v: serde_json::Value = serde_json::from_str(out.trim_end()).expect("json");
        assert_eq!(v["seq"], 7);
        assert_eq!(v["time"], "2023-11-14T22:13:20.000000Z");
        assert_eq!(v["update"]["sessionUpdate"], "plan");
        assert!(out.ends_with("}\n"));
    }

    #[test]
    fn file_names_are_safe() {
        let mut r = SessionRecord {
            id: "0b1c-2d".into(),
            owner: "u".into(),
            agent: "demo".into(),
            agent_session_id: None,
            cwd: "/w".into(),
            additional_dirs: "[]".into(),
            title: Some("Fix the \"login\" bug / étape 2\r\n".into()),
            meta: "{}".into(),
            message_count: 0,
            last_seq: 0,
            created_at: 0,
            updated_at: 0,
            archived_at: None,
        };
        assert_eq!(file_name(&r, Format::Markdown), "fix-the-login-bug-tape-2-0b1c-2d.md");
        r.title = None;
        assert_eq!(file_name(&r, Format::Jsonl), "session-0b1c-2d.jsonl");
    }
}
