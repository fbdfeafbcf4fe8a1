//! `--showcase`: a demo agent that uses every part of an ACP client, so a new user sees the
//! whole web UI with no real agent installed.
//!
//! `session/new` (and `load` / `resume`) answers with `modes` (ask, code, plan) and
//! `configOptions` (a model and a reasoning effort), then sends `available_commands_update`
//! (`/explain`, `/diff`, `/test`, `/plan`); `session/set_mode` and `session/set_config_option`
//! change them and echo `current_mode_update` / `config_option_update` (see
//! [`modes`](super::modes)). A prompt streams, paced
//! by the delay: thoughts, a plan that progresses, a `read` tool call with a location, an `edit`
//! tool call with `diff` content that really writes `acp-demo/hello.rs` under the session's cwd
//! (see [`super::workspace`]), an `execute` tool call with ANSI-coloured `cargo test`
//! output, a Markdown answer cut into chunks at arbitrary places, and a `usage_update`.
//!
//! Modes: `ask` asks permission before the edit and the command, `code` (the default) does not,
//! `plan` reads and answers with a plan, nothing else. The prompt's words "ask me" or
//! "permission" ask before the first step that acts. A prompt starting with a slash command
//! does only that part: `/diff` the edit, `/test` the command, `/plan` the plan, `/explain` the
//! answer.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};

use super::content::{self, Facts, Outcome};
use super::modes::{ASK, EFFORTS, MODELS, MODES, PLAN, State, save};
use super::workspace::FileError;
use super::{Controls, Decision, ECHO_MAX, Stop, Turn, lock, workspace};

/// Reply pieces when neither `--chunks` nor `[chunks=N]` says.
const SHOWCASE_CHUNKS: u64 = 40;
/// Most answer pieces a showcase turn streams (each needs about two characters of answer).
const MAX_PIECES: u64 = 100_000;
/// The context window `usage_update` reports, in tokens.
const CONTEXT_SIZE: u64 = 200_000;

/// A slash command at the start of a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Command {
    Explain,
    Diff,
    Test,
    Plan,
}

impl Command {
    /// The command the prompt starts with, if any.
    fn of(text: &str) -> Option<Self> {
        let word = text.trim_start().strip_prefix('/')?.split_whitespace().next()?;
        Some(match word {
            "explain" => Command::Explain,
            "diff" => Command::Diff,
            "test" => Command::Test,
            "plan" => Command::Plan,
            _ => return None,
        })
    }
}

/// One step of a turn, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Read,
    Edit,
    Execute,
    Answer,
}

impl Step {
    /// The step's plan entry and its priority.
    fn entry(self, plan_mode: bool) -> (&'static str, &'static str) {
        match self {
            Step::Read => ("Read acp-demo/hello.rs", "high"),
            Step::Edit => ("Change the greeting in acp-demo/hello.rs", "high"),
            Step::Execute => ("Run cargo test", "medium"),
            Step::Answer if plan_mode => ("Write up the plan", "low"),
            Step::Answer => ("Explain what changed", "low"),
        }
    }
}

/// What a turn does, from the mode, the slash command and the prompt's words.
#[derive(Debug, PartialEq, Eq)]
struct Script {
    /// Stream thoughts first.
    think: bool,
    /// Send a plan (and re-send it as steps finish).
    plan: bool,
    /// The steps, in order.
    steps: Vec<Step>,
    /// Ask permission before these steps.
    ask: Vec<Step>,
    /// Say this instead of doing anything (a command the mode does not allow).
    refuse: Option<&'static str>,
}

impl Script {
    fn new(mode: usize, command: Option<Command>, asked: bool) -> Self {
        let plan_mode = mode == PLAN;
        let (think, plan, mut steps) = match command {
            None if plan_mode => (true, true, vec![Step::Read, Step::Answer]),
            None => (true, true, vec![Step::Read, Step::Edit, Step::Execute, Step::Answer]),
            Some(Command::Explain) => (false, false, vec![Step::Answer]),
            Some(Command::Plan) => (false, true, vec![]),
            Some(Command::Diff) => (false, false, vec![Step::Edit]),
            Some(Command::Test) => (false, false, vec![Step::Execute]),
        };
        let refuse = match command {
            Some(Command::Diff) if plan_mode => Some("Plan mode is read-only: `/diff` needs the Code or Ask mode."),
            Some(Command::Test) if plan_mode => Some("Plan mode runs nothing: `/test` needs the Code or Ask mode."),
            _ => None,
        };
        if refuse.is_some() {
            steps.clear();
        }
        let mut ask: Vec<Step> = if mode == ASK {
            steps
                .iter()
                .copied()
                .filter(|s| matches!(s, Step::Edit | Step::Execute))
                .collect()
        } else {
            vec![]
        };
        if asked && ask.is_empty() && refuse.is_none() {
            // Asked in words: before the first step that acts, or before a read added for it.
            match steps.iter().find(|s| matches!(s, Step::Edit | Step::Execute)) {
                Some(&step) => ask.push(step),
                None => {
                    if !steps.contains(&Step::Read) {
                        steps.insert(0, Step::Read);
                    }
                    ask.push(Step::Read);
                }
            }
        }
        Script {
            think,
            plan,
            steps,
            ask,
            refuse,
        }
    }
}

/// A fresh tool call id.
fn call_id() -> String {
    format!("call-{}", uuid::Uuid::new_v4().simple())
}

/// Tool call content: one text block.
fn text_content(text: &str) -> Value {
    json!([{"type": "content", "content": {"type": "text", "text": text}}])
}

/// Runs a file operation off the async threads; a panic there becomes an error sentence.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, FileError> + Send + 'static,
) -> Result<T, FileError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(FileError::Task(e.to_string())))
}

impl Turn<'_> {
    /// A showcase turn, from recording the user's message to the usage update.
    pub(super) async fn showcase(&mut self, blocks: &[Value], text: &str, c: &Controls) -> Result<(), Stop> {
        self.begin(blocks, c, "crashing now").await?;
        let state = lock(&self.session.show).clone();
        let cwd = lock(&self.session.cwd).clone();
        let command = Command::of(text);
        let script = Script::new(state.mode, command, c.permission);
        let plan_mode = state.mode == PLAN;
        let model = MODELS.get(state.model).map_or("Demo", |m| m.name);
        let echo = text
            .char_indices()
            .nth(ECHO_MAX)
            .and_then(|(i, _)| text.get(..i))
            .unwrap_or(text);

        if script.think {
            let mode = MODES.get(state.mode).map_or("", |m| m.name);
            let what = if plan_mode {
                "look at `acp-demo/hello.rs` and say what I would change, without touching it"
            } else {
                "read `acp-demo/hello.rs`, change its greeting, then run the tests"
            };
            let first = format!("The user wrote \"{echo}\". In {mode} mode I will {what}.");
            self.thought(&first).await?;
            if state.model == 1 || state.effort == 2 {
                let second = format!(
                    "Thinking it over once more ({model}, {} effort): keep the diff small so it reads at a glance, \
                     and run the tests after the edit, not before.",
                    EFFORTS.get(state.effort).map_or("", |e| e.id)
                );
                self.thought(&second).await?;
            }
        }
        let plan_steps: Vec<Step> = if command == Some(Command::Plan) {
            Script::new(state.mode, None, false).steps
        } else {
            script.steps.clone()
        };
        if script.plan {
            // `/plan` shows the whole plan, nothing started; a turn starts its first step.
            let current = if command == Some(Command::Plan) { None } else { Some(0) };
            self.plan(&plan_steps, current, plan_mode).await?;
        }
        if c.hang {
            self.flush().await?;
            self.token.cancelled().await;
            return Err(Stop::Cancelled);
        }
        if let Some(refusal) = script.refuse {
            self.chunk(refusal).await?;
            return self.usage(&state, text.len(), refusal.len()).await;
        }

        let path = cwd.as_deref().map_or_else(
            || PathBuf::from(workspace::DIR).join(workspace::FILE),
            workspace::display_path,
        );
        let old = match &cwd {
            Some(cwd) => {
                let cwd = cwd.clone();
                blocking(move || workspace::read(&cwd)).await.map_err(Arc::new)
            }
            None => Err(Arc::new(FileError::NoCwd)),
        };
        let next = content::next_hello(old.as_ref().ok().and_then(Option::as_deref), text, model);
        let (mut read, mut edit, mut test) = (Outcome::Skipped, Outcome::Skipped, Outcome::Skipped);
        let mut answer_len = 0;
        for (i, &step) in script.steps.iter().enumerate() {
            if script.plan && i > 0 {
                self.plan(&plan_steps, Some(i), plan_mode).await?;
            }
            let ask = script.ask.contains(&step);
            match step {
                Step::Read => read = self.read_step(&path, &old, ask).await?,
                Step::Edit => edit = self.edit_step(&path, cwd.as_deref(), &old, &next, ask).await?,
                Step::Execute => {
                    let fresh = !matches!(edit, Outcome::Failed(_));
                    let revision = content::revision_of(if fresh {
                        &next
                    } else {
                        old.as_ref().ok().and_then(Option::as_deref).unwrap_or("")
                    });
                    test = self.execute_step(&path, revision.max(1), fresh, ask).await?;
                }
                Step::Answer => {
                    let n = c
                        .chunks
                        .or(self.agent.opts.chunks)
                        .unwrap_or(SHOWCASE_CHUNKS)
                        .min(MAX_PIECES);
                    let facts = Facts {
                        model,
                        effort: EFFORTS.get(state.effort).map_or("", |e| e.id),
                        mode: MODES.get(state.mode).map_or("", |m| m.name),
                        plan_mode,
                        read: read.clone(),
                        edit: edit.clone(),
                        test: test.clone(),
                        code: content::greeting_fn(&next),
                        echo,
                        min_chars: usize::try_from(n.saturating_mul(2)).unwrap_or(usize::MAX),
                    };
                    let md = content::answer(&facts);
                    answer_len = md.len();
                    let seed = content::revision_of(&next) ^ u64::try_from(text.len()).unwrap_or(0);
                    for piece in content::split(&md, n, seed) {
                        self.chunk(piece).await?;
                    }
                }
            }
        }
        if script.plan && command != Some(Command::Plan) && !script.steps.is_empty() {
            self.plan(&plan_steps, Some(plan_steps.len()), plan_mode).await?;
        }
        self.usage(&state, text.len(), answer_len).await
    }

    /// Sends one `agent_thought_chunk`.
    async fn thought(&mut self, text: &str) -> Result<(), Stop> {
        self.emit_json(&json!({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": text}}))
            .await
    }

    /// Sends the plan: steps before `current` completed, `current` in progress, the rest
    /// pending (`None`: all pending).
    async fn plan(&mut self, steps: &[Step], current: Option<usize>, plan_mode: bool) -> Result<(), Stop> {
        let entries: Vec<Value> = steps
            .iter()
            .enumerate()
            .map(|(i, step)| {
                let (content, priority) = step.entry(plan_mode);
                let status = match current {
                    Some(c) if i < c => "completed",
                    Some(c) if i == c => "in_progress",
                    _ => "pending",
                };
                json!({"content": content, "priority": priority, "status": status})
            })
            .collect();
        self.emit_json(&json!({"sessionUpdate": "plan", "entries": entries}))
            .await
    }

    /// Asks permission for `tool_call`; `Ok(false)` when refused (the tool call is then failed
    /// with `why`).
    async fn allowed(&mut self, tool_call: &Value, why: &str) -> Result<bool, Stop> {
        self.flush().await?;
        match self.agent.ask_permission(self.session, tool_call, self.token).await? {
            Decision::Allow => Ok(true),
            Decision::Cancelled => Err(Stop::Cancelled),
            Decision::Reject => {
                self.emit_json(
                    &json!({"sessionUpdate": "tool_call_update", "toolCallId": tool_call["toolCallId"],
                    "status": "failed", "content": text_content(why)}),
                )
                .await?;
                Ok(false)
            }
        }
    }

    /// The `read` tool call: a location on the greeting, and the file's text.
    async fn read_step(
        &mut self,
        path: &Path,
        old: &Result<Option<String>, Arc<FileError>>,
        ask: bool,
    ) -> Result<Outcome, Stop> {
        let id = call_id();
        let line = old
            .as_ref()
            .ok()
            .and_then(Option::as_deref)
            .and_then(|t| content::line_of(t, content::GREETING_FN))
            .unwrap_or(1);
        let call = json!({"toolCallId": id, "title": "Read acp-demo/hello.rs", "kind": "read",
            "status": "pending", "locations": [{"path": path, "line": line}], "rawInput": {"path": path}});
        self.emit_json(&with_kind(&call, "tool_call")).await?;
        if ask && !self.allowed(&call, "You said no: the file was not read.").await? {
            return Ok(Outcome::Failed("you said no".into()));
        }
        let (status, text, outcome) = match old {
            Ok(Some(text)) => (
                "completed",
                text.clone(),
                Outcome::Done(format!("{} lines", text.lines().count())),
            ),
            Ok(None) => (
                "completed",
                "acp-demo/hello.rs does not exist yet: the edit will create it.".to_owned(),
                Outcome::Done("not there yet".into()),
            ),
            Err(e) => ("failed", e.to_string(), Outcome::Failed(e.to_string())),
        };
        self.emit_json(
            &json!({"sessionUpdate": "tool_call_update", "toolCallId": id, "status": status,
            "content": text_content(&text)}),
        )
        .await?;
        Ok(outcome)
    }

    /// The `edit` tool call: `diff` content, and the file really written under the cwd.
    async fn edit_step(
        &mut self,
        path: &Path,
        cwd: Option<&Path>,
        old: &Result<Option<String>, Arc<FileError>>,
        next: &str,
        ask: bool,
    ) -> Result<Outcome, Stop> {
        let id = call_id();
        let old_text = old.as_ref().ok().and_then(Option::as_deref);
        let line = content::line_of(next, content::GREETING_FN).unwrap_or(1);
        let diff = json!([{"type": "diff", "path": path, "oldText": old_text, "newText": next}]);
        let call = json!({"toolCallId": id, "title": "Edit acp-demo/hello.rs", "kind": "edit", "status": "pending",
            "locations": [{"path": path, "line": line}], "content": diff, "rawInput": {"path": path}});
        self.emit_json(&with_kind(&call, "tool_call")).await?;
        if ask
            && !self
                .allowed(&call, "You rejected this edit: acp-demo/hello.rs is unchanged.")
                .await?
        {
            return Ok(Outcome::Failed("rejected by you".into()));
        }
        self.emit_json(&json!({"sessionUpdate": "tool_call_update", "toolCallId": id, "status": "in_progress"}))
            .await?;
        let written = match (old, cwd) {
            (Err(e), _) => Err(e.clone()),
            (Ok(_), None) => Err(Arc::new(FileError::NoCwd)),
            (Ok(_), Some(cwd)) => {
                let (cwd, next) = (cwd.to_path_buf(), next.to_owned());
                blocking(move || workspace::write(&cwd, &next)).await.map_err(Arc::new)
            }
        };
        match written {
            Ok(()) => {
                self.emit_json(
                    &json!({"sessionUpdate": "tool_call_update", "toolCallId": id, "status": "completed",
                    "content": diff}),
                )
                .await?;
                let from = old_text.map_or(0, content::revision_of);
                Ok(Outcome::Done(format!(
                    "revision {from} → {}",
                    content::revision_of(next)
                )))
            }
            Err(e) => {
                let why = format!("Could not write the file: {e}");
                self.emit_json(
                    &json!({"sessionUpdate": "tool_call_update", "toolCallId": id, "status": "failed",
                    "content": text_content(&why)}),
                )
                .await?;
                Ok(Outcome::Failed(e.to_string()))
            }
        }
    }

    /// The `execute` tool call: `cargo test`, its coloured output streamed in two parts.
    async fn execute_step(&mut self, path: &Path, revision: u64, fresh: bool, ask: bool) -> Result<Outcome, Stop> {
        let id = call_id();
        let dir = path.parent().unwrap_or(path);
        let call = json!({"toolCallId": id, "title": "cargo test", "kind": "execute", "status": "pending",
            "rawInput": {"command": "cargo test", "cwd": dir}});
        self.emit_json(&with_kind(&call, "tool_call")).await?;
        if ask && !self.allowed(&call, "You rejected running `cargo test`.").await? {
            return Ok(Outcome::Failed("rejected by you".into()));
        }
        let (building, all, code) = content::cargo_test(revision, fresh, &dir.to_string_lossy());
        self.emit_json(
            &json!({"sessionUpdate": "tool_call_update", "toolCallId": id, "status": "in_progress",
            "content": text_content(&building)}),
        )
        .await?;
        let status = if code == 0 { "completed" } else { "failed" };
        self.emit_json(
            &json!({"sessionUpdate": "tool_call_update", "toolCallId": id, "status": status,
            "content": text_content(&all), "rawOutput": {"exitCode": code}}),
        )
        .await?;
        Ok(if code == 0 {
            Outcome::Done("2 passed, 1 ignored".into())
        } else {
            Outcome::Failed(format!("exit code {code}: the edit is not on disk"))
        })
    }

    /// Adds this turn's tokens and cost to the session and sends a `usage_update`.
    async fn usage(&mut self, state: &State, prompt_bytes: usize, answer_bytes: usize) -> Result<(), Stop> {
        let tokens = 900 + (prompt_bytes as u64 + answer_bytes as u64) / 4;
        let thinking = [200, 600, 1800].get(state.effort).copied().unwrap_or(600);
        let per_k_micros = if state.model == 1 { 15_000 } else { 2_000 };
        let turn_micros = (tokens + thinking) * per_k_micros / 1000;
        let (used, cost_micros) = {
            let mut s = lock(&self.session.show);
            s.used = (s.used + tokens).min(CONTEXT_SIZE);
            s.cost_micros += turn_micros;
            (s.used, s.cost_micros)
        };
        save(self.session, self.agent.state_dir().as_deref());
        let amount = cost_micros as f64 / 1e6;
        self.emit_json(
            &json!({"sessionUpdate": "usage_update", "used": used, "size": CONTEXT_SIZE,
            "cost": {"amount": amount, "currency": "USD"}}),
        )
        .await
    }
}

/// `call` as a `session/update` of kind `kind`.
fn with_kind(call: &Value, kind: &str) -> Value {
    let mut update = call.clone();
    update["sessionUpdate"] = json!(kind);
    update
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::demo::modes::CODE;

    #[test]
    fn scripts_follow_mode_command_and_words() {
        use Step::{Answer, Edit, Execute, Read};
        let all = vec![Read, Edit, Execute, Answer];
        assert_eq!(Script::new(CODE, None, false).steps, all);
        assert!(Script::new(CODE, None, false).ask.is_empty());
        assert_eq!(Script::new(ASK, None, false).ask, [Edit, Execute]);
        assert_eq!(Script::new(CODE, None, true).ask, [Edit]);
        assert_eq!(Script::new(PLAN, None, false).steps, [Read, Answer]);
        assert_eq!(Script::new(PLAN, None, true).ask, [Read]);
        assert_eq!(Script::new(CODE, Some(Command::Test), true).ask, [Execute]);
        assert_eq!(Script::new(CODE, Some(Command::Explain), true).steps, [Read, Answer]);
        let refused = Script::new(PLAN, Some(Command::Diff), true);
        assert!(refused.refuse.is_some() && refused.steps.is_empty() && refused.ask.is_empty());
        assert_eq!(Command::of("  /test now"), Some(Command::Test));
        assert_eq!(Command::of("/testing"), None);
        assert_eq!(Command::of("say /plan"), None);
    }
}
