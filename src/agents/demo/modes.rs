//! The showcase's session controls: its modes (ask, code, plan), model and reasoning effort,
//! as `session/new` offers them and `session/set_mode` / `session/set_config_option` change
//! them, kept in a state file under the agent's home so that `session/load` finds them again.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::{Session, lock};

/// One choice of a mode or a select option: id, display name, description.
pub(super) struct Choice {
    pub(super) id: &'static str,
    pub(super) name: &'static str,
    pub(super) description: &'static str,
}

/// The session modes, as offered in `modes.availableModes`.
pub(super) const MODES: [Choice; 3] = [
    Choice {
        id: "ask",
        name: "Ask",
        description: "Asks before editing files or running commands",
    },
    Choice {
        id: "code",
        name: "Code",
        description: "Edits and runs without asking",
    },
    Choice {
        id: "plan",
        name: "Plan",
        description: "Read-only: answers with a plan, no edits",
    },
];
pub(super) const ASK: usize = 0;
pub(super) const CODE: usize = 1;
pub(super) const PLAN: usize = 2;

/// The `model` select.
pub(super) const MODELS: [Choice; 2] = [
    Choice {
        id: "demo-swift",
        name: "Demo Swift",
        description: "Quick, thinks once",
    },
    Choice {
        id: "demo-deep",
        name: "Demo Deep",
        description: "Thinks twice, costs more",
    },
];

/// The `effort` select (category `thought_level`).
pub(super) const EFFORTS: [Choice; 3] = [
    Choice {
        id: "low",
        name: "Low",
        description: "Short thoughts",
    },
    Choice {
        id: "medium",
        name: "Medium",
        description: "Balanced",
    },
    Choice {
        id: "high",
        name: "High",
        description: "Long thoughts, more tokens",
    },
];

/// A session's showcase choices and running usage.
#[derive(Debug, Clone)]
pub(super) struct State {
    /// Index into [`MODES`].
    pub(super) mode: usize,
    /// Index into [`MODELS`].
    pub(super) model: usize,
    /// Index into [`EFFORTS`].
    pub(super) effort: usize,
    /// Tokens "in context" so far (reported as `used`).
    pub(super) used: u64,
    /// Session cost so far, in millionths of a US dollar (summed exactly, reported in dollars).
    pub(super) cost_micros: u64,
}

impl Default for State {
    fn default() -> Self {
        Self {
            mode: CODE,
            model: 0,
            effort: 1,
            used: 0,
            cost_micros: 0,
        }
    }
}

/// The `modes` and `configOptions` of a `session/new|load|resume` answer.
pub(super) fn session_state(s: &Session) -> Value {
    let state = lock(&s.show).clone();
    json!({"modes": modes(&state), "configOptions": config_options(&state)})
}

/// `modes`: a `SessionModeState`.
fn modes(state: &State) -> Value {
    let available: Vec<Value> = MODES
        .iter()
        .map(|m| json!({"id": m.id, "name": m.name, "description": m.description}))
        .collect();
    json!({"currentModeId": MODES.get(state.mode).map_or("code", |m| m.id), "availableModes": available})
}

/// `configOptions`: the model and reasoning-effort selects with their current values.
fn config_options(state: &State) -> Value {
    let select = |id: &str, name: &str, description: &str, category: &str, choices: &[Choice], current: usize| {
        let options: Vec<Value> = choices
            .iter()
            .map(|c| json!({"value": c.id, "name": c.name, "description": c.description}))
            .collect();
        json!({
            "id": id, "name": name, "description": description, "category": category,
            "type": "select", "currentValue": choices.get(current).map_or("", |c| c.id), "options": options,
        })
    };
    json!([
        select(
            "model",
            "Model",
            "Which demo model answers",
            "model",
            &MODELS,
            state.model
        ),
        select(
            "effort",
            "Reasoning effort",
            "How long the model thinks",
            "thought_level",
            &EFFORTS,
            state.effort
        ),
    ])
}

/// The `available_commands_update` sent after `session/new|load|resume`.
pub(super) fn commands_update() -> Value {
    json!({"sessionUpdate": "available_commands_update", "availableCommands": [
        {"name": "explain", "description": "Explain the demo file, as a Markdown answer only",
         "input": {"hint": "what to explain"}},
        {"name": "diff", "description": "Only edit acp-demo/hello.rs (shows the diff)"},
        {"name": "test", "description": "Only run cargo test (coloured terminal output)"},
        {"name": "plan", "description": "Only make a plan", "input": {"hint": "what to plan"}},
    ]})
}

/// Where a session's choices outlive the agent process (the gateway restores a session on a
/// new process with `session/resume` or `session/load`, and a user's mode must not silently
/// fall back to Code): `<dir>/sessions/<id>.json`. `None` for an id that is not a plain name.
fn state_file(dir: Option<&Path>, sid: &str) -> Option<PathBuf> {
    let plain =
        !sid.is_empty() && sid.len() <= 128 && sid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    Some(dir.filter(|_| plain)?.join("sessions").join(format!("{sid}.json")))
}

/// Keeps the session's choices and usage (best effort: a failure is logged).
pub(super) fn save(s: &Session, dir: Option<&Path>) {
    use std::os::unix::fs::DirBuilderExt as _;
    let Some(path) = state_file(dir, &s.id) else {
        return;
    };
    let state = lock(&s.show).clone();
    let text = json!({
        "mode": MODES.get(state.mode).map(|c| c.id),
        "model": MODELS.get(state.model).map(|c| c.id),
        "effort": EFFORTS.get(state.effort).map(|c| c.id),
        "used": state.used,
        "costMicros": state.cost_micros,
    })
    .to_string();
    let saved = path
        .parent()
        .map_or(Ok(()), |d| {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(d)
        })
        .and_then(|()| std::fs::write(&path, text));
    if let Err(e) = saved {
        eprintln!(
            "demo-agent: cannot keep the session's choices in {}: {e}",
            path.display()
        );
    }
}

/// Takes back what [`save`] kept for this session, if anything.
pub(super) fn restore(s: &Session, dir: Option<&Path>) {
    let Some(v) = state_file(dir, &s.id)
        .and_then(|path| std::fs::read_to_string(path).ok())
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
    else {
        return;
    };
    let find = |table: &[Choice], key: &str| {
        let id = v.get(key).and_then(Value::as_str)?;
        table.iter().position(|c| c.id == id)
    };
    let mut state = lock(&s.show);
    state.mode = find(&MODES, "mode").unwrap_or(state.mode);
    state.model = find(&MODELS, "model").unwrap_or(state.model);
    state.effort = find(&EFFORTS, "effort").unwrap_or(state.effort);
    state.used = v.get("used").and_then(Value::as_u64).unwrap_or(0);
    state.cost_micros = v.get("costMicros").and_then(Value::as_u64).unwrap_or(0);
}

/// `session/set_mode`: the answer and the update to send after it.
pub(super) fn set_mode(s: &Session, params: &Value) -> Result<(Value, Value), (i64, &'static str)> {
    let id = params
        .get("modeId")
        .and_then(Value::as_str)
        .ok_or((-32602, "invalid params: missing modeId"))?;
    let mode = MODES
        .iter()
        .position(|m| m.id == id)
        .ok_or((-32602, "invalid params: unknown modeId"))?;
    lock(&s.show).mode = mode;
    Ok((
        json!({}),
        json!({"sessionUpdate": "current_mode_update", "currentModeId": id}),
    ))
}

/// `session/set_config_option`: the answer (every option, as the schema's response has it)
/// and the update to send after it.
pub(super) fn set_config_option(s: &Session, params: &Value) -> Result<(Value, Value), (i64, &'static str)> {
    let config = params
        .get("configId")
        .and_then(Value::as_str)
        .ok_or((-32602, "invalid params: missing configId"))?;
    let choices: &[Choice] = match config {
        "model" => &MODELS,
        "effort" => &EFFORTS,
        _ => return Err((-32602, "invalid params: unknown configId")),
    };
    let value = params
        .get("value")
        .and_then(Value::as_str)
        .ok_or((-32602, "invalid params: value must be one of the option's values"))?;
    let index = choices
        .iter()
        .position(|c| c.id == value)
        .ok_or((-32602, "invalid params: unknown value for this option"))?;
    let options = {
        let mut state = lock(&s.show);
        if config == "model" {
            state.model = index;
        } else {
            state.effort = index;
        }
        config_options(&state)
    };
    Ok((
        json!({"configOptions": options}),
        json!({"sessionUpdate": "config_option_update", "configOptions": options}),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_ids_name_a_state_file() {
        let dir = Some(Path::new("/h"));
        assert_eq!(
            state_file(dir, "demo-1_a"),
            Some(PathBuf::from("/h/sessions/demo-1_a.json"))
        );
        for bad in ["", "../x", "a/b", "a.json", &"x".repeat(129)] {
            assert_eq!(state_file(dir, bad), None, "{bad}");
        }
        assert_eq!(state_file(None, "ok"), None);
    }
}
