//! A session's controls as the agent last described them: its `modes`, `configOptions` and
//! `models` (ACP `NewSessionResponse`). Taken from the agent's `session/new` answer (and its
//! answer to a restore), kept current from the answers to `session/set_mode`,
//! `session/set_config_option` and `session/set_model` and from the agent's
//! `current_mode_update` / `config_option_update`, stored with the session, and answered to
//! `session/load` and `session/resume`, so a page that reloads (or another tab) shows the mode and
//! model pickers as they are.
//!
//! Each part is kept as the agent's raw JSON; only a change of the current mode or model rewrites
//! one (those are rare: a user's click).

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

/// The controls of one session; a part the agent never sent is `None`.
#[derive(Debug, Default, Clone)]
pub struct Controls {
    /// `SessionModeState`: `currentModeId`, `availableModes`.
    modes: Option<Box<RawValue>>,
    /// `SessionConfigOption[]`.
    config_options: Option<Box<RawValue>>,
    /// `SessionModelState` (unstable in ACP): `currentModelId`, `availableModels`.
    models: Option<Box<RawValue>>,
}

/// The parts of an answer (or of the stored object), borrowed.
#[derive(Deserialize)]
struct Parts<'a> {
    #[serde(borrow, default)]
    modes: Option<&'a RawValue>,
    #[serde(rename = "configOptions", borrow, default)]
    config_options: Option<&'a RawValue>,
    #[serde(borrow, default)]
    models: Option<&'a RawValue>,
}

/// A raw part, unless it is `null`.
fn part(raw: Option<&RawValue>) -> Option<Box<RawValue>> {
    raw.filter(|r| r.get() != "null").map(ToOwned::to_owned)
}

impl Controls {
    /// The controls in an agent's `session/new`, `session/load` or `session/resume` result, or in
    /// what [`Controls::to_json`] stored. Nothing when it names none (or is not an object).
    pub fn from_result(result: &str) -> Self {
        match serde_json::from_str::<Parts<'_>>(result) {
            Ok(p) => Self {
                modes: part(p.modes),
                config_options: part(p.config_options),
                models: part(p.models),
            },
            Err(_) => Self::default(),
        }
    }

    /// Whether the agent described none.
    pub fn is_empty(&self) -> bool {
        self.modes.is_none() && self.config_options.is_none() && self.models.is_none()
    }

    /// Takes the parts `newer` has; whether anything changed.
    pub fn merge(&mut self, newer: Controls) -> bool {
        let mut changed = false;
        for (mine, theirs) in [
            (&mut self.modes, newer.modes),
            (&mut self.config_options, newer.config_options),
            (&mut self.models, newer.models),
        ] {
            if let Some(theirs) = theirs
                && mine.as_ref().is_none_or(|m| m.get() != theirs.get())
            {
                *mine = Some(theirs);
                changed = true;
            }
        }
        changed
    }

    /// The JSON object `session/load` answers with and the store keeps:
    /// `{"modes": …, "configOptions": …, "models": …}`, each only when known.
    pub fn to_json(&self) -> String {
        let mut out = String::from("{");
        for (name, raw) in [
            ("modes", &self.modes),
            ("configOptions", &self.config_options),
            ("models", &self.models),
        ] {
            if let Some(raw) = raw {
                if out.len() > 1 {
                    out.push(',');
                }
                out.push('"');
                out.push_str(name);
                out.push_str("\":");
                out.push_str(raw.get());
            }
        }
        out.push('}');
        out
    }

    /// The agent answered a client's `method` (with `params`) with `result`: what that changed.
    /// Only the methods that change controls are looked at.
    pub fn apply_answer(&mut self, method: &str, params: &str, result: &str) -> bool {
        #[derive(Deserialize)]
        struct Ids {
            #[serde(rename = "modeId")]
            mode_id: Option<String>,
            #[serde(rename = "modelId")]
            model_id: Option<String>,
        }
        match method {
            "session/set_mode" => serde_json::from_str::<Ids>(params)
                .ok()
                .and_then(|p| p.mode_id)
                .is_some_and(|id| set_current(&mut self.modes, "currentModeId", &id)),
            "session/set_model" => serde_json::from_str::<Ids>(params)
                .ok()
                .and_then(|p| p.model_id)
                .is_some_and(|id| set_current(&mut self.models, "currentModelId", &id)),
            "session/set_config_option" => {
                let options = Controls::from_result(result).config_options;
                options.is_some_and(|o| replace(&mut self.config_options, o))
            }
            _ => false,
        }
    }

    /// An agent's `session/update` (the `update` object): what a `current_mode_update` or a
    /// `config_option_update` changed. Callers pass only updates that may be one of those.
    pub fn apply_update(&mut self, update: &str) -> bool {
        #[derive(Deserialize)]
        struct Update<'a> {
            #[serde(rename = "sessionUpdate")]
            kind: String,
            #[serde(rename = "currentModeId")]
            mode_id: Option<String>,
            #[serde(rename = "configOptions", borrow, default)]
            config_options: Option<&'a RawValue>,
        }
        let Ok(u) = serde_json::from_str::<Update<'_>>(update) else {
            return false;
        };
        match (u.kind.as_str(), u.mode_id, part(u.config_options)) {
            ("current_mode_update", Some(id), _) => set_current(&mut self.modes, "currentModeId", &id),
            ("config_option_update", _, Some(options)) => replace(&mut self.config_options, options),
            _ => false,
        }
    }
}

impl Controls {
    /// The requests that put an agent whose session controls are `agent` (what its restore
    /// answered) back to these: `(method, params)` for each mode, config option and model the
    /// agent still offers and has set otherwise. `session_id` is the agent's id for the session.
    pub fn reapply(&self, agent: &Controls, session_id: &str) -> Vec<(&'static str, String)> {
        let parse = |raw: &Option<Box<RawValue>>| -> Value {
            raw.as_ref()
                .and_then(|r| serde_json::from_str(r.get()).ok())
                .unwrap_or(Value::Null)
        };
        let mut out = Vec::new();
        let (want, have) = (parse(&self.modes), parse(&agent.modes));
        if let Some(id) = want.get("currentModeId").and_then(Value::as_str)
            && have
                .get("currentModeId")
                .and_then(Value::as_str)
                .is_some_and(|h| h != id)
            && have["availableModes"]
                .as_array()
                .is_some_and(|m| m.iter().any(|m| m["id"] == id))
        {
            out.push((
                "session/set_mode",
                serde_json::json!({ "sessionId": session_id, "modeId": id }).to_string(),
            ));
        }
        let (want, have) = (parse(&self.config_options), parse(&agent.config_options));
        for option in want.as_array().into_iter().flatten() {
            let (Some(id), Some(value)) = (option["id"].as_str(), option.get("currentValue")) else {
                continue;
            };
            let theirs = have.as_array().and_then(|h| h.iter().find(|o| o["id"] == id));
            if theirs.is_some_and(|t| t.get("currentValue").is_some_and(|v| v != value)) {
                out.push((
                    "session/set_config_option",
                    serde_json::json!({ "sessionId": session_id, "configId": id, "value": value }).to_string(),
                ));
            }
        }
        let (want, have) = (parse(&self.models), parse(&agent.models));
        if let Some(id) = want.get("currentModelId").and_then(Value::as_str)
            && have
                .get("currentModelId")
                .and_then(Value::as_str)
                .is_some_and(|h| h != id)
            && have["availableModels"]
                .as_array()
                .is_some_and(|m| m.iter().any(|m| m["modelId"] == id))
        {
            out.push((
                "session/set_model",
                serde_json::json!({ "sessionId": session_id, "modelId": id }).to_string(),
            ));
        }
        out
    }
}

/// Sets `key` of the object in `slot` to `id`; whether it changed. Nothing is invented when the
/// agent never described that part.
fn set_current(slot: &mut Option<Box<RawValue>>, key: &str, id: &str) -> bool {
    let Some(raw) = slot.as_ref() else { return false };
    let Ok(Value::Object(mut state)) = serde_json::from_str::<Value>(raw.get()) else {
        return false;
    };
    if state.get(key).and_then(Value::as_str) == Some(id) {
        return false;
    }
    state.insert(key.to_string(), Value::String(id.to_string()));
    match serde_json::value::to_raw_value(&state) {
        Ok(raw) => {
            *slot = Some(raw);
            true
        }
        Err(_) => false,
    }
}

fn replace(slot: &mut Option<Box<RawValue>>, new: Box<RawValue>) -> bool {
    if slot.as_ref().is_some_and(|old| old.get() == new.get()) {
        return false;
    }
    *slot = Some(new);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NEW: &str = r#"{"sessionId":"s","modes":{"currentModeId":"ask","availableModes":[{"id":"ask","name":"Ask"},{"id":"code","name":"Code"}]},"configOptions":[{"id":"model","name":"Model","type":"select","currentValue":"a","options":[]}]}"#;

    fn parsed(c: &Controls) -> Value {
        serde_json::from_str(&c.to_json()).expect("JSON")
    }

    #[test]
    fn taken_from_an_answer_and_stored_as_one_object() {
        let c = Controls::from_result(NEW);
        let v = parsed(&c);
        assert_eq!(v["modes"]["currentModeId"], "ask");
        assert_eq!(v["configOptions"][0]["id"], "model");
        assert!(v.get("models").is_none(), "only what the agent sent");
        assert_eq!(parsed(&Controls::from_result(&c.to_json())), v, "round trip");
        assert!(Controls::from_result(r#"{"sessionId":"s"}"#).is_empty());
        assert!(Controls::from_result(r#"{"modes":null}"#).is_empty());
        assert!(Controls::from_result("[]").is_empty());
        assert_eq!(Controls::default().to_json(), "{}");
    }

    #[test]
    fn answers_and_updates_keep_them_current() {
        let mut c = Controls::from_result(NEW);
        assert!(c.apply_answer("session/set_mode", r#"{"sessionId":"s","modeId":"code"}"#, "{}"));
        assert_eq!(parsed(&c)["modes"]["currentModeId"], "code");
        assert_eq!(parsed(&c)["modes"]["availableModes"][1]["id"], "code");
        assert!(
            !c.apply_answer("session/set_mode", r#"{"modeId":"code"}"#, "{}"),
            "no change"
        );
        let options = json!({"configOptions": [{"id": "model", "currentValue": "b"}]}).to_string();
        assert!(c.apply_answer("session/set_config_option", "{}", &options));
        assert_eq!(parsed(&c)["configOptions"][0]["currentValue"], "b");
        assert!(
            !c.apply_answer("session/set_model", r#"{"modelId":"m"}"#, "{}"),
            "no models known"
        );
        assert!(!c.apply_answer("session/prompt", "{}", "{}"));

        assert!(c.apply_update(r#"{"sessionUpdate":"current_mode_update","currentModeId":"ask"}"#));
        assert_eq!(parsed(&c)["modes"]["currentModeId"], "ask");
        assert!(c.apply_update(r#"{"sessionUpdate":"config_option_update","configOptions":[]}"#));
        assert_eq!(parsed(&c)["configOptions"], json!([]));
        assert!(!c.apply_update(
            r#"{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"current_mode_update"}}"#
        ));
    }

    #[test]
    fn a_restored_agent_is_put_back_to_what_the_user_chose() {
        let mut chosen = Controls::from_result(NEW);
        chosen.apply_answer("session/set_mode", r#"{"modeId":"code"}"#, "{}");
        let options =
            json!({"configOptions": [{"id": "model", "currentValue": "b"}, {"id": "gone", "currentValue": "x"}]});
        chosen.apply_answer("session/set_config_option", "{}", &options.to_string());
        let agent = Controls::from_result(NEW);
        let calls = chosen.reapply(&agent, "agent-sid");
        let calls: Vec<(&str, Value)> = calls
            .iter()
            .map(|(m, p)| (*m, serde_json::from_str(p).expect("JSON")))
            .collect();
        assert_eq!(
            calls,
            [
                ("session/set_mode", json!({"sessionId": "agent-sid", "modeId": "code"})),
                (
                    "session/set_config_option",
                    json!({"sessionId": "agent-sid", "configId": "model", "value": "b"})
                ),
            ],
            "an option the agent no longer has is left alone"
        );
        assert!(chosen.reapply(&chosen, "s").is_empty(), "nothing differs");
        assert!(
            chosen.reapply(&Controls::default(), "s").is_empty(),
            "the agent said nothing"
        );
        let mut unknown_mode = Controls::from_result(NEW);
        unknown_mode.apply_answer("session/set_mode", r#"{"modeId":"plan"}"#, "{}");
        assert!(
            unknown_mode.reapply(&agent, "s").is_empty(),
            "a mode the agent does not offer"
        );
    }

    #[test]
    fn a_merge_takes_what_the_newer_has() {
        let mut c = Controls::from_result(NEW);
        assert!(!c.merge(Controls::from_result(NEW)));
        assert!(c.merge(Controls::from_result(
            r#"{"models":{"currentModelId":"x","availableModels":[]}}"#
        )));
        let v = parsed(&c);
        assert_eq!(v["modes"]["currentModeId"], "ask");
        assert_eq!(v["models"]["currentModelId"], "x");
    }
}
