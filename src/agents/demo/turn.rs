//! One prompt's turn: the updates it streams, batched or paced, and the permission it may ask.

use std::fmt::Write as _;
use std::io;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::controls::Controls;
use super::session::Session;
use super::{Agent, ECHO_MAX, lock};

/// With no delay, output is written in batches of about this many bytes.
const FLUSH_AT: usize = 64 << 10;

/// Reply chunks per prompt when neither `--chunks` nor `[chunks=N]` says.
const DEFAULT_CHUNKS: u64 = 8;

/// What the prompt carried besides text, as the agent got it: "You attached an image
/// (image/png, 68 bytes) and a file attachment:///notes.txt (12 bytes)." (`None`: only text).
fn attachments_seen(blocks: &[Value]) -> Option<String> {
    let str_of = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    let seen: Vec<String> = blocks
        .iter()
        .filter_map(|b| match b.get("type").and_then(Value::as_str)? {
            "image" => {
                let data = str_of(b, "data");
                let bytes = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, data.as_bytes())
                    .map_or(0, |d| d.len());
                Some(format!("an image ({}, {bytes} bytes)", str_of(b, "mimeType")))
            }
            "resource" => {
                let r = b.get("resource")?;
                Some(format!(
                    "a file {} ({} bytes)",
                    str_of(r, "uri"),
                    str_of(r, "text").len()
                ))
            }
            _ => None,
        })
        .collect();
    (!seen.is_empty()).then(|| format!("You attached {}.\n", seen.join(" and ")))
}

/// What the client answered to a permission request.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Decision {
    /// Selected `allow`.
    Allow,
    /// Selected `reject`, another option, or answered with an error.
    Reject,
    /// Outcome `cancelled`, or the prompt was cancelled while waiting.
    Cancelled,
}

/// Why a turn ended early.
pub(super) enum Stop {
    /// The prompt was cancelled.
    Cancelled,
    /// Output failed; nothing more can be sent.
    Io(io::Error),
}

impl From<io::Error> for Stop {
    fn from(e: io::Error) -> Self {
        Stop::Io(e)
    }
}

/// Maps a permission response to a decision; JSON-RPC errors and malformed answers reject.
pub(super) fn decide(response: &Value) -> Decision {
    let outcome = response.pointer("/result/outcome");
    match outcome.and_then(|o| o.get("outcome")).and_then(Value::as_str) {
        Some("cancelled") => Decision::Cancelled,
        Some("selected") if outcome.and_then(|o| o.get("optionId")) == Some(&json!("allow")) => Decision::Allow,
        _ => Decision::Reject,
    }
}

/// One prompt turn's output state: a batch buffer and a scratch buffer for the current update.
pub(super) struct Turn<'a> {
    /// The agent (output stream, options).
    pub(super) agent: &'a Agent,
    /// The session this turn belongs to.
    pub(super) session: &'a Session,
    /// Complete lines not yet written.
    buf: Vec<u8>,
    /// The current update object, serialized.
    upd: Vec<u8>,
    /// Pause after each update; zero means batch output instead.
    delay: Duration,
    /// Cancelled when the client cancels this prompt.
    pub(super) token: &'a CancellationToken,
}

impl<'a> Turn<'a> {
    /// A turn of `session` writing through `agent`, pausing `delay` after each update (zero:
    /// batching them instead), until `token` is cancelled.
    pub(super) fn new(agent: &'a Agent, session: &'a Session, delay: Duration, token: &'a CancellationToken) -> Self {
        Self {
            agent,
            session,
            buf: Vec::with_capacity(FLUSH_AT + 4096),
            upd: Vec::with_capacity(512),
            delay,
            token,
        }
    }

    /// Writes out the batch buffer.
    pub(super) async fn flush(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            self.agent.write(&self.buf).await?;
            self.buf.clear();
        }
        Ok(())
    }

    /// Writes the prompt's answer behind the updates still buffered, and flushes them all.
    pub(super) async fn answer(&mut self, answer: &Value) -> io::Result<()> {
        if serde_json::to_writer(&mut self.buf, answer).is_ok() {
            self.buf.push(b'\n');
        }
        self.flush().await
    }

    /// Sends the update in `self.upd` (and records it), then paces or batches.
    async fn emit(&mut self) -> Result<(), Stop> {
        let upd = std::str::from_utf8(&self.upd).unwrap_or("{}");
        self.session.record(upd);
        self.buf.extend_from_slice(&self.session.prefix);
        self.buf.extend_from_slice(upd.as_bytes());
        self.buf.extend_from_slice(b"}}\n");
        if self.delay.is_zero() {
            if self.buf.len() >= FLUSH_AT {
                self.flush().await?;
                tokio::task::consume_budget().await;
            }
        } else {
            self.flush().await?;
            tokio::select! {
                _ = self.token.cancelled() => {}
                _ = tokio::time::sleep(self.delay) => {}
            }
        }
        if self.token.is_cancelled() {
            Err(Stop::Cancelled)
        } else {
            Ok(())
        }
    }

    /// Sends an update given as a JSON value.
    pub(super) async fn emit_json(&mut self, update: &Value) -> Result<(), Stop> {
        self.upd.clear();
        serde_json::to_writer(&mut self.upd, update).map_err(io::Error::from)?;
        self.emit().await
    }

    /// Sends one `agent_message_chunk` with `text` (fast path: no `Value` built).
    pub(super) async fn chunk(&mut self, text: &str) -> Result<(), Stop> {
        self.upd.clear();
        self.upd
            .extend_from_slice(br#"{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"#);
        serde_json::to_writer(&mut self.upd, text).map_err(io::Error::from)?;
        self.upd.extend_from_slice(b"}}");
        self.emit().await
    }

    /// What every turn starts with: the user's message recorded for replay, the `[title=…]`
    /// update, and `[crash]` (one chunk saying `crash_text`, then exit code 3).
    pub(super) async fn begin(&mut self, blocks: &[Value], c: &Controls, crash_text: &str) -> Result<(), Stop> {
        for block in blocks {
            self.session
                .record(&json!({"sessionUpdate": "user_message_chunk", "content": block}).to_string());
        }
        if let Some(title) = &c.title {
            self.emit_json(&json!({"sessionUpdate": "session_info_update", "title": title}))
                .await?;
        }
        if c.crash {
            self.chunk(crash_text).await?;
            self.flush().await?;
            eprintln!("demo-agent: [crash] requested, exiting with code 3");
            std::process::exit(3);
        }
        Ok(())
    }

    /// The body of a turn, from recording the user's message to the last chunk.
    pub(super) async fn run(&mut self, blocks: &[Value], text: &str, c: &Controls) -> Result<(), Stop> {
        self.begin(blocks, c, "chunk 1/1: crashing now").await?;
        self.emit_json(&json!({"sessionUpdate": "plan", "entries": [
            {"content": "Read the prompt", "priority": "high", "status": "completed"},
            {"content": "Look at the context", "priority": "medium", "status": "in_progress"},
            {"content": "Stream the reply", "priority": "low", "status": "pending"},
        ]}))
        .await?;
        if c.hang {
            self.flush().await?;
            self.token.cancelled().await;
            return Err(Stop::Cancelled);
        }
        let call_id = format!("call-{}", uuid::Uuid::new_v4().simple());
        let (kind, title) = if c.permission {
            ("read", "Read the workspace")
        } else {
            ("think", "Think about the prompt")
        };
        let tool_call = json!({"toolCallId": call_id, "title": title, "kind": kind, "status": "pending"});
        let mut update = tool_call.clone();
        update["sessionUpdate"] = json!("tool_call");
        self.emit_json(&update).await?;
        let mut allowed = "";
        if c.permission {
            self.flush().await?;
            match self.agent.ask_permission(self.session, &tool_call, self.token).await? {
                Decision::Allow => allowed = "allowed; ",
                Decision::Cancelled => return Err(Stop::Cancelled),
                Decision::Reject => {
                    self.emit_json(
                        &json!({"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": "failed"}),
                    )
                    .await?;
                    return self.chunk("rejected").await;
                }
            }
        }
        for status in ["in_progress", "completed"] {
            self.emit_json(&json!({"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": status}))
                .await?;
        }
        let echo = text
            .char_indices()
            .nth(ECHO_MAX)
            .and_then(|(i, _)| text.get(..i))
            .unwrap_or(text);
        if text.contains("[recall]") {
            let user = r#""sessionUpdate":"user_message_chunk""#;
            let n = lock(&self.session.history).iter().filter(|u| u.contains(user)).count();
            self.chunk(&format!("I remember {n} user message blocks.\n")).await?;
        }
        if let Some(said) = attachments_seen(blocks) {
            self.chunk(&said).await?;
        }
        let n = c.chunks.or(self.agent.opts.chunks).unwrap_or(DEFAULT_CHUNKS);
        let mut line = String::with_capacity(echo.len() + 64);
        for i in 1..=n {
            line.clear();
            let _ = writeln!(line, "chunk {i}/{n}: {allowed}you said: {echo}");
            self.chunk(&line).await?;
        }
        Ok(())
    }
}
