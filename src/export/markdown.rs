//! The conversation as a person reads it: the user's prompts and the agent's answers under
//! headings, its thinking as a quote, tool calls with their status, output and diffs, plans as
//! checklists. Written as the updates stream past: message text goes out as it comes, and the
//! only thing remembered is each tool call's title (so a later update can name it).

use std::collections::HashMap;
use std::fmt::Write;

use serde_json::Value;

use crate::store::SessionRecord;

/// Largest diff shown (old and new text together); a bigger one is named, not diffed.
const MAX_DIFF_BYTES: usize = 1 << 20;

/// Longest a diff is worked on before a coarser one is taken.
const DIFF_DEADLINE: std::time::Duration = std::time::Duration::from_millis(50);

/// Tool call titles remembered at most (a session with more names the rest by their id).
const MAX_TOOL_TITLES: usize = 10_000;

/// What the text written last belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    None,
    User,
    Agent,
    Thought,
}

/// Whose turn the section written last is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Speaker {
    Nobody,
    User,
    Agent,
}

/// Writes Markdown for one session's updates, in order.
#[derive(Debug)]
pub struct Markdown {
    title: String,
    header: Vec<(&'static str, String)>,
    block: Block,
    speaker: Speaker,
    /// The last two bytes written, so blocks are kept a blank line apart.
    tail: [u8; 2],
    tools: HashMap<String, String>,
}

impl Markdown {
    /// A writer for `record`'s transcript.
    pub fn new(record: &SessionRecord) -> Self {
        let mut header = vec![
            ("Session", format!("`{}`", record.id)),
            ("Agent", record.agent.clone()),
            ("Working directory", format!("`{}`", record.cwd)),
            ("Created", when(record.created_at)),
        ];
        if record.message_count > 0 {
            header.push(("Prompts", record.message_count.to_string()));
        }
        Self {
            title: record.title.clone().unwrap_or_else(|| String::from("Untitled session")),
            header,
            block: Block::None,
            speaker: Speaker::Nobody,
            tail: *b"\n\n",
            tools: HashMap::new(),
        }
    }

    /// The title and what the session is.
    pub fn begin(&mut self, out: &mut String) {
        let title = one_line(&self.title);
        self.put(out, &format!("# {title}\n\n"));
        for (name, value) in std::mem::take(&mut self.header) {
            self.put(out, &format!("- {name}: {value}\n"));
        }
    }

    /// The end of the last block.
    pub fn end(&mut self, out: &mut String) {
        self.close(out);
    }

    /// One stored update (`stored_at`: epoch µs). Kinds a reader has no use for (the agent's
    /// command list, usage) and lines that are not JSON are left out.
    pub fn update(&mut self, stored_at: i64, line: &str, out: &mut String) {
        let Ok(u) = serde_json::from_str::<Value>(line) else {
            return;
        };
        match u["sessionUpdate"].as_str().unwrap_or("") {
            "user_message_chunk" => self.message(Block::User, stored_at, &u["content"], out),
            "agent_message_chunk" => self.message(Block::Agent, stored_at, &u["content"], out),
            "agent_thought_chunk" => self.message(Block::Thought, stored_at, &u["content"], out),
            "tool_call" => self.tool_call(&u, true, stored_at, out),
            "tool_call_update" => self.tool_call(&u, false, stored_at, out),
            "plan" => self.plan(&u, stored_at, out),
            "current_mode_update" => {
                if let Some(mode) = u["currentModeId"].as_str() {
                    self.note(&format!("*Mode: {}*", one_line(mode)), out);
                }
            }
            "session_info_update" => {
                if let Some(title) = u["title"].as_str() {
                    self.note(&format!("*Renamed: {}*", one_line(title)), out);
                }
            }
            _ => {}
        }
    }

    fn message(&mut self, block: Block, stored_at: i64, content: &Value, out: &mut String) {
        if self.block != block {
            self.close(out);
            let who = if block == Block::User {
                Speaker::User
            } else {
                Speaker::Agent
            };
            self.turn(who, stored_at, out);
            self.blank_line(out);
            if block == Block::Thought {
                self.put(out, "> *Thinking*\n>\n> ");
            }
            self.block = block;
        }
        match content["type"].as_str() {
            Some("text") => {
                let text = content["text"].as_str().unwrap_or("");
                if block == Block::Thought {
                    self.put(out, &text.replace('\n', "\n> "));
                } else {
                    self.put(out, text);
                }
            }
            _ => {
                // Attachments and links on lines of their own, between the text around them.
                let piece = content_piece(content);
                if block == Block::Thought {
                    self.put(out, &piece.replace('\n', "\n> "));
                } else {
                    self.blank_line(out);
                    self.put(out, &piece);
                    self.put(out, "\n\n");
                }
            }
        }
    }

    fn tool_call(&mut self, u: &Value, first: bool, stored_at: i64, out: &mut String) {
        let id = u["toolCallId"].as_str().unwrap_or("");
        if let Some(title) = u["title"].as_str()
            && (self.tools.len() < MAX_TOOL_TITLES || self.tools.contains_key(id))
        {
            self.tools.insert(id.to_string(), one_line(title));
        }
        let status = u["status"].as_str();
        let content = u["content"].as_array().filter(|c| !c.is_empty());
        if !first && status.is_none() && content.is_none() && u.get("title").is_none() {
            return; // nothing a reader would see changed
        }
        self.close(out);
        self.turn(Speaker::Agent, stored_at, out);
        self.blank_line(out);
        let title = self
            .tools
            .get(id)
            .cloned()
            .unwrap_or_else(|| format!("`{}`", one_line(id)));
        let mut line = format!("**Tool call:** {title}");
        if first && let Some(kind) = u["kind"].as_str() {
            let _ = write!(line, " ({})", one_line(kind));
        }
        if let Some(status) = status {
            let _ = write!(line, " — {}", status.replace('_', " "));
        }
        self.put(out, &line);
        self.put(out, "\n");
        if first && let Some(locations) = u["locations"].as_array() {
            for path in locations.iter().filter_map(|l| l["path"].as_str()) {
                self.put(out, &format!("- `{}`\n", one_line(path)));
            }
        }
        for item in content.into_iter().flatten() {
            self.blank_line(out);
            match item["type"].as_str() {
                Some("diff") => self.put(out, &diff(item)),
                Some("terminal") => {
                    let id = item["terminalId"].as_str().unwrap_or("");
                    self.put(out, &format!("*Terminal `{}`*\n", one_line(id)));
                }
                _ => {
                    let c = &item["content"];
                    if c["type"] == "text" {
                        self.put(out, &fenced("", c["text"].as_str().unwrap_or("")));
                    } else {
                        self.put(out, &content_piece(c));
                        self.put(out, "\n");
                    }
                }
            }
        }
    }

    fn plan(&mut self, u: &Value, stored_at: i64, out: &mut String) {
        self.close(out);
        self.turn(Speaker::Agent, stored_at, out);
        self.blank_line(out);
        self.put(out, "**Plan**\n\n");
        for entry in u["entries"].as_array().into_iter().flatten() {
            let text = one_line(entry["content"].as_str().unwrap_or(""));
            let line = match entry["status"].as_str() {
                Some("completed") => format!("- [x] {text}\n"),
                Some("in_progress") => format!("- [ ] {text} *(in progress)*\n"),
                _ => format!("- [ ] {text}\n"),
            };
            self.put(out, &line);
        }
    }

    fn note(&mut self, text: &str, out: &mut String) {
        self.close(out);
        self.blank_line(out);
        self.put(out, text);
        self.put(out, "\n");
    }

    /// A heading where the turn passes to `who` (the agent's turn begins with whatever it does
    /// first: thinking, a plan, a tool call or text).
    fn turn(&mut self, who: Speaker, stored_at: i64, out: &mut String) {
        if self.speaker == who {
            return;
        }
        self.speaker = who;
        self.blank_line(out);
        let name = if who == Speaker::User { "User" } else { "Agent" };
        self.put(out, &format!("## {name} · {}\n", when(stored_at)));
    }

    /// Ends a message block (its text may not end with a newline).
    fn close(&mut self, out: &mut String) {
        if self.block != Block::None {
            self.line_start(out);
            self.block = Block::None;
        }
    }

    fn line_start(&mut self, out: &mut String) {
        if self.tail[1] != b'\n' {
            self.put(out, "\n");
        }
    }

    fn blank_line(&mut self, out: &mut String) {
        self.line_start(out);
        if self.tail != *b"\n\n" {
            self.put(out, "\n");
        }
    }

    fn put(&mut self, out: &mut String, s: &str) {
        match s.as_bytes() {
            [] => return,
            [b] => self.tail = [self.tail[1], *b],
            [.., a, b] => self.tail = [*a, *b],
        }
        out.push_str(s);
    }
}

/// A content block that is not text: an image or audio as what it is (the export is text; the
/// JSON Lines export keeps the data), an embedded text resource as a fenced block, a link.
fn content_piece(c: &Value) -> String {
    let size = |data: &Value| {
        data.as_str().map_or(0, |d| {
            (d.len() / 4 * 3).saturating_sub(d.bytes().rev().take_while(|b| *b == b'=').count())
        })
    };
    match c["type"].as_str().unwrap_or("") {
        "image" | "audio" => format!(
            "*[{} {}, {} bytes]*",
            c["type"].as_str().unwrap_or(""),
            one_line(c["mimeType"].as_str().unwrap_or("")),
            size(&c["data"])
        ),
        "resource" => {
            let r = &c["resource"];
            let uri = one_line(r["uri"].as_str().unwrap_or(""));
            match r["text"].as_str() {
                Some(text) => format!("`{uri}`\n\n{}", fenced("", text).trim_end()),
                None => format!("*[file `{uri}`, {} bytes]*", size(&r["blob"])),
            }
        }
        "resource_link" => format!(
            "[{}]({})",
            one_line(c["name"].as_str().unwrap_or("link")),
            one_line(c["uri"].as_str().unwrap_or(""))
        ),
        other => format!("*[{}]*", one_line(other)),
    }
}

/// A diff item as a unified diff of the file's old and new text (a new file: from nothing).
fn diff(item: &Value) -> String {
    let path = item["path"].as_str().unwrap_or("");
    let old = item["oldText"].as_str();
    let new = item["newText"].as_str().unwrap_or("");
    if old.map_or(0, str::len) + new.len() > MAX_DIFF_BYTES {
        return format!(
            "`{}`: a diff of {} bytes, too large to show here (the JSON Lines export has it)\n",
            one_line(path),
            old.map_or(0, str::len) + new.len()
        );
    }
    // Myers' algorithm is quadratic at worst: past the deadline it settles for a coarser diff.
    let text = similar::TextDiff::configure()
        .timeout(DIFF_DEADLINE)
        .diff_lines(old.unwrap_or(""), new);
    let from = if old.is_some() {
        format!("a{path}")
    } else {
        String::from("/dev/null")
    };
    let mut body = text
        .unified_diff()
        .context_radius(3)
        .header(&from, &format!("b{path}"))
        .to_string();
    if !body.ends_with('\n') {
        body.push('\n');
    }
    format!("`{}`\n\n{}", one_line(path), fenced("diff", &body))
}

/// `text` in a fenced code block whose fence is longer than any run of backticks inside it.
fn fenced(lang: &str, text: &str) -> String {
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest.max(2) + 1);
    let nl = if text.ends_with('\n') { "" } else { "\n" };
    format!("{fence}{lang}\n{text}{nl}{fence}\n")
}

/// A value that must stay on one line (a heading, a list item).
fn one_line(s: &str) -> String {
    s.split(['\r', '\n'])
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Epoch µs as `2026-11-26 16:30:02 UTC`.
fn when(micros: i64) -> String {
    chrono::DateTime::from_timestamp_micros(micros)
        .unwrap_or_default()
        .format("%Y-%m-%d %H:%M:%S UTC")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_outgrow_the_backticks_inside() {
        assert_eq!(fenced("", "a"), "```\na\n```\n");
        assert_eq!(fenced("", "x ```` y\n"), "`````\nx ```` y\n`````\n");
    }

    #[test]
    fn one_line_joins_lines() {
        assert_eq!(one_line("a\r\nb\n\nc"), "a b c");
    }
}
