//! What `acp-gateway connect` keeps between the editor and the gateway, without I/O: which
//! sessions are open and how far each was passed on (`seq`), which requests are in flight each
//! way, and what to do when the connection drops and comes back. The editor sees the gateway's
//! frames as they are, except:
//! - `initialize` offers the remote agent no `fs/*` or `terminal/*` (the agent's files are on
//!   the gateway's host), unless the user passes them through;
//! - a `cwd` outside the user's workspace roots is replaced, and the editor told which;
//! - after a reconnect, every session is loaded again after the last `seq` passed on, so each
//!   update reaches the editor once and in order; a prompt that was running is answered from how
//!   its turn ended (`_meta.gateway.turn` of the load's answer, or the `_gateway/queue` notice at
//!   its end); a prompt the gateway never got is sent again; a permission asked again is matched
//!   to the one the editor already has (and its answer, if given meanwhile, sent on);
//! - requests the gateway asks of the editor carry ids of the bridge's own, so asks of two
//!   connections never collide.

use std::collections::{HashMap, VecDeque};

use serde_json::{Value, json};

use crate::protocol::peek::{Peek, peek};

/// Ids of the bridge's own requests to the gateway (never an editor's: editors number theirs).
const OWN: &str = "acp-gateway-connect:";
/// Most frames held for the gateway while it is unreachable, and their bytes.
const HELD_FRAMES: usize = 1024;
const HELD_BYTES: usize = 16 << 20;

/// A frame for one side.
#[derive(Debug, PartialEq, Eq)]
pub enum Out {
    Gateway(String),
    Editor(String),
}

/// How the bridge rewrites what the editor sends.
#[derive(Debug, Default, Clone)]
pub struct Options {
    /// Offer the editor's `fs` and `terminal` capabilities to the remote agent.
    pub pass_client_capabilities: bool,
    /// The user's workspace roots on the gateway (`GET /api/me`).
    pub roots: Vec<String>,
    /// Where a session whose editor `cwd` is not on the gateway works (else the first root).
    pub cwd: Option<String>,
}

#[derive(Debug)]
struct Request {
    method: String,
    frame: String,
    session: Option<String>,
    /// A prompt: the last `seq` passed on in its session when it was sent, and whether its own
    /// `user_message_chunk` came back since (the gateway got it).
    prompt: Option<(u64, bool)>,
    /// The prompt waits for its turn's end (the gateway got it, the connection dropped).
    awaiting_end: bool,
    /// Where the session works instead of the editor's `cwd`: told after the answer.
    note: Option<String>,
    /// In the order the editor sent them.
    order: u64,
    /// The connection it was last sent on (0: not sent yet).
    sent: u64,
}

#[derive(Debug)]
struct Session {
    last_seq: u64,
    /// The `session/load` params to attach again with.
    cwd: String,
}

/// A request the gateway asked of the editor, not answered yet.
#[derive(Debug)]
struct Asked {
    /// The id the editor knows it by (the bridge's own).
    editor_id: u64,
    /// The id of the gateway's latest ask of it (a reconnect asks again, with another id).
    gateway_id: Option<Value>,
    /// What it asks: method and params, to match a second ask.
    key: String,
    /// The editor's answer, given while the gateway was unreachable.
    answer: Option<Value>,
}

/// The bridge's state.
#[derive(Debug, Default)]
pub struct Bridge {
    opts: Options,
    /// The editor's `initialize` params, rewritten: what a reconnect initializes with.
    init: Option<Value>,
    requests: HashMap<String, Request>,
    sessions: HashMap<String, Session>,
    asked: Vec<Asked>,
    next_ask: u64,
    next_order: u64,
    /// Connections made so far: the current one's number.
    connection: u64,
    /// Connected and initialized: frames go straight to the gateway.
    live: bool,
    held: VecDeque<String>,
    held_bytes: usize,
    /// Past `--reconnect-for` (or the token refused): requests are answered with this error at
    /// once while down.
    gave_up: Option<(i64, String)>,
}

fn id_key(id: &Value) -> String {
    id.to_string()
}

fn error_frame(id: &Value, code: i64, message: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}).to_string()
}

impl Bridge {
    pub fn new(opts: Options) -> Self {
        Self {
            opts,
            ..Self::default()
        }
    }

    /// The user's workspace roots on the gateway, once known.
    pub fn set_roots(&mut self, roots: Vec<String>) {
        self.opts.roots = roots;
    }

    /// The editor's `initialize` params, answered elsewhere (signed out): what connecting
    /// initializes with.
    pub fn set_init(&mut self, params: &Value) {
        let mut params = params.clone();
        self.withhold_capabilities(&mut params);
        self.init = Some(params);
    }

    /// Offers the remote agent none of the editor's files or terminals (unless passed through).
    fn withhold_capabilities(&self, params: &mut Value) {
        if !self.opts.pass_client_capabilities
            && let Some(caps) = params.get_mut("clientCapabilities").and_then(Value::as_object_mut)
        {
            caps.insert("fs".into(), json!({"readTextFile": false, "writeTextFile": false}));
            caps.insert("terminal".into(), json!(false));
        }
    }

    /// Whether frames go straight to the gateway.
    pub fn is_live(&self) -> bool {
        self.live
    }

    /// A line from the editor.
    pub fn from_editor(&mut self, line: &str) -> Vec<Out> {
        let Ok(mut msg) = serde_json::from_str::<Value>(line) else {
            // Not JSON: the gateway answers it as it does any client's.
            return self.hold_or_send(line.to_string());
        };
        let method = msg.get("method").and_then(Value::as_str).map(str::to_string);
        let id = msg.get("id").cloned();
        match (method, id) {
            (Some(method), Some(id)) => self.editor_request(&method, id, &mut msg),
            (None, Some(id)) => self.editor_answer(id, msg),
            _ => self.hold_or_send(msg.to_string()),
        }
    }

    fn editor_request(&mut self, method: &str, id: Value, msg: &mut Value) -> Vec<Out> {
        let mut note = None;
        let params = msg.get_mut("params");
        let mut session = params
            .as_ref()
            .and_then(|p| p.get("sessionId"))
            .and_then(Value::as_str)
            .map(str::to_string);
        match (method, params) {
            ("initialize", Some(p)) => {
                self.withhold_capabilities(p);
                self.init = Some(p.clone());
            }
            ("session/new" | "session/load" | "session/resume", Some(p)) => {
                note = self.fix_cwd(p);
            }
            _ => {}
        }
        if method == "session/new" {
            session = None;
        }
        if method == "session/load"
            && let Some(sid) = &session
        {
            // The editor asked for the replay from where it says: that is what it has.
            let after = msg["params"]["_meta"]["gateway"]["afterSeq"].as_u64().unwrap_or(0);
            self.track(sid).last_seq = after;
        }
        let prompt = (method == "session/prompt").then(|| {
            let last = session
                .as_deref()
                .and_then(|s| self.sessions.get(s))
                .map_or(0, |s| s.last_seq);
            (last, false)
        });
        if let Some((code, message)) = self.gave_up.as_ref().filter(|_| !self.live) {
            return vec![Out::Editor(error_frame(&id, *code, message))];
        }
        let frame = msg.to_string();
        self.next_order += 1;
        self.requests.insert(
            id_key(&id),
            Request {
                method: method.to_string(),
                frame: frame.clone(),
                session,
                prompt,
                awaiting_end: false,
                note,
                order: self.next_order,
                sent: if self.live { self.connection } else { 0 },
            },
        );
        // While the gateway is unreachable it waits here, and goes once it is back.
        if self.live {
            vec![Out::Gateway(frame)]
        } else {
            Vec::new()
        }
    }

    /// Replaces a `cwd` that is not inside the user's roots; the path it works in instead.
    fn fix_cwd(&self, params: &mut Value) -> Option<String> {
        let cwd = params.get("cwd").and_then(Value::as_str)?;
        if self.opts.roots.is_empty() || self.opts.roots.iter().any(|r| inside(cwd, r)) {
            return None;
        }
        let instead = self.opts.cwd.clone().or_else(|| self.opts.roots.first().cloned())?;
        params["cwd"] = json!(instead);
        Some(instead)
    }

    fn editor_answer(&mut self, id: Value, mut msg: Value) -> Vec<Out> {
        let Some(at) = self.asked.iter().position(|a| Some(a.editor_id) == id.as_u64()) else {
            return Vec::new();
        };
        if self.live
            && let Some(gw) = self.asked[at].gateway_id.clone()
        {
            self.asked.remove(at);
            msg["id"] = gw;
            return vec![Out::Gateway(msg.to_string())];
        }
        // Sent when the gateway asks again after the reconnect.
        self.asked[at].answer = Some(msg);
        Vec::new()
    }

    fn hold_or_send(&mut self, frame: String) -> Vec<Out> {
        if self.live {
            return vec![Out::Gateway(frame)];
        }
        if self.held.len() >= HELD_FRAMES || self.held_bytes + frame.len() > HELD_BYTES {
            // Dropped: a request among them is answered when the connection is given up on.
            return Vec::new();
        }
        self.held_bytes += frame.len();
        self.held.push_back(frame);
        Vec::new()
    }

    /// A text frame from the gateway.
    pub fn from_gateway(&mut self, text: &str) -> Vec<Out> {
        // The bulk of a stream: an update, read for its session, seq and kind only, and passed
        // on as it came.
        if let Some(update) = peek(text).filter(Peek::is_update)
            && let Some(sid) = update.session_id.as_deref()
        {
            return match self.passes(sid, update.seq, update.kind.as_deref()) {
                true => vec![Out::Editor(text.to_string())],
                false => Vec::new(),
            };
        }
        let Ok(mut msg) = serde_json::from_str::<Value>(text) else {
            return Vec::new();
        };
        let method = msg.get("method").and_then(Value::as_str).map(str::to_string);
        let id = msg.get("id").cloned();
        match (method, id) {
            (None, Some(id)) => self.gateway_answer(&id, &msg),
            (Some(method), Some(id)) => self.gateway_request(&method, id, &mut msg),
            (Some(method), None) => self.gateway_notification(&method, &mut msg),
            (None, None) => Vec::new(),
        }
    }

    fn gateway_answer(&mut self, id: &Value, msg: &Value) -> Vec<Out> {
        if let Some(own) = id.as_str().and_then(|s| s.strip_prefix(OWN)) {
            return self.own_answer(own, msg);
        }
        let Some(request) = self.requests.remove(&id_key(id)) else {
            return vec![Out::Editor(msg.to_string())];
        };
        let (method, note) = (request.method.as_str(), request.note.as_deref());
        let mut out = vec![Out::Editor(msg.to_string())];
        let result = msg.get("result");
        let opened = match method {
            "session/new" => result
                .and_then(|r| r.get("sessionId"))
                .and_then(Value::as_str)
                .map(str::to_string),
            "session/load" | "session/resume" if result.is_some() => request.session.clone(),
            _ => None,
        };
        if let Some(sid) = opened {
            let cwd = serde_json::from_str::<Value>(&request.frame)
                .ok()
                .and_then(|f| f["params"]["cwd"].as_str().map(str::to_string))
                .unwrap_or_default();
            self.track(&sid).cwd = cwd;
            if let Some(note) = note {
                out.push(Out::Editor(note_frame(&sid, note)));
            }
        }
        if matches!(method, "session/close" | "session/delete")
            && let Some(sid) = &request.session
        {
            self.sessions.remove(sid);
        }
        out
    }

    fn gateway_request(&mut self, method: &str, id: Value, msg: &mut Value) -> Vec<Out> {
        let key = format!(
            "{method}\n{}",
            msg.get("params").map(Value::to_string).unwrap_or_default()
        );
        if let Some(asked) = self.asked.iter_mut().find(|a| a.key == key) {
            // Asked again after a reconnect: the editor has it already.
            asked.gateway_id = Some(id.clone());
            if let Some(mut answer) = asked.answer.take() {
                answer["id"] = id;
                let editor_id = asked.editor_id;
                self.asked.retain(|a| a.editor_id != editor_id);
                return vec![Out::Gateway(answer.to_string())];
            }
            return Vec::new();
        }
        self.next_ask += 1;
        self.asked.push(Asked {
            editor_id: self.next_ask,
            gateway_id: Some(id),
            key,
            answer: None,
        });
        msg["id"] = json!(self.next_ask);
        vec![Out::Editor(msg.to_string())]
    }

    fn gateway_notification(&mut self, method: &str, msg: &mut Value) -> Vec<Out> {
        match method {
            "session/update" => {
                let params = &msg["params"];
                let sid = params["sessionId"].as_str().unwrap_or_default().to_string();
                let seq = params["_meta"]["gateway"]["seq"].as_u64();
                if !self.passes(&sid, seq, params["update"]["sessionUpdate"].as_str()) {
                    return Vec::new();
                }
            }
            "$/cancel_request" => {
                let gw = msg["params"]["requestId"].clone();
                let Some(asked) = self.asked.iter().find(|a| a.gateway_id.as_ref() == Some(&gw)) else {
                    return Vec::new();
                };
                msg["params"]["requestId"] = json!(asked.editor_id);
                let editor_id = asked.editor_id;
                self.asked.retain(|a| a.editor_id != editor_id);
            }
            "_gateway/queue" => {
                let params = &msg["params"];
                if params["running"] == false
                    && let Some(last) = params.get("lastAnswer")
                {
                    let sid = params["sessionId"].as_str().unwrap_or_default().to_string();
                    let mut out = self.end_waiting_prompts(&sid, last);
                    out.push(Out::Editor(msg.to_string()));
                    return out;
                }
            }
            _ => {}
        }
        vec![Out::Editor(msg.to_string())]
    }

    /// Whether update `seq` of `sid` (of kind `kind`) goes to the editor: not when it was passed
    /// on already (a replay after a reconnect overlaps what came live). A user's chunk tells that
    /// the gateway got the prompts sent before it.
    fn passes(&mut self, sid: &str, seq: Option<u64>, kind: Option<&str>) -> bool {
        let Some(seq) = seq else { return true };
        let session = self.track(sid);
        if seq <= session.last_seq {
            return false;
        }
        session.last_seq = seq;
        if kind == Some("user_message_chunk") {
            for r in self.requests.values_mut() {
                if r.session.as_deref() == Some(sid)
                    && let Some((at, seen)) = &mut r.prompt
                    && *at < seq
                {
                    *seen = true;
                }
            }
        }
        true
    }

    /// Answers the prompts of `sid` that wait for their turn's end with how it ended.
    fn end_waiting_prompts(&mut self, sid: &str, last: &Value) -> Vec<Out> {
        let ids: Vec<String> = self
            .requests
            .iter()
            .filter(|(_, r)| r.awaiting_end && r.session.as_deref() == Some(sid))
            .map(|(id, _)| id.clone())
            .collect();
        ids.into_iter()
            .filter_map(|id| {
                self.requests.remove(&id)?;
                Some(turn_answer(&id, last))
            })
            .collect()
    }

    /// The session `sid` as the bridge keeps it (from its first update or answer).
    fn track(&mut self, sid: &str) -> &mut Session {
        self.sessions.entry(sid.to_string()).or_insert(Session {
            last_seq: 0,
            cwd: String::new(),
        })
    }

    /// The connection dropped.
    pub fn disconnected(&mut self) {
        self.live = false;
    }

    /// Connected again (or for the first time): the frames that initialize it. The rest follows
    /// the answer ([`Self::from_gateway`]).
    pub fn connected(&mut self) -> Vec<Out> {
        self.gave_up = None;
        self.connection += 1;
        match &self.init {
            Some(init) => vec![Out::Gateway(
                json!({"jsonrpc": "2.0", "id": format!("{OWN}init"), "method": "initialize", "params": init})
                    .to_string(),
            )],
            // The editor's own `initialize` is among what is held.
            None => self.go_live(),
        }
    }

    /// Sends what waited: requests in flight (their answers were lost with the connection, or
    /// they were never sent), in the editor's order, except prompts the gateway may have got
    /// (the loads' answers tell), then the editor's answers and notifications.
    fn go_live(&mut self) -> Vec<Out> {
        self.live = true;
        self.held_bytes = 0;
        let connection = self.connection;
        let mut again: Vec<&mut Request> = self
            .requests
            .values_mut()
            .filter(|r| r.prompt.is_none() || r.sent == 0)
            .collect();
        again.sort_by_key(|r| r.order);
        let mut out: Vec<Out> = again
            .into_iter()
            .map(|r| {
                r.sent = connection;
                Out::Gateway(r.frame.clone())
            })
            .collect();
        out.extend(self.held.drain(..).map(Out::Gateway));
        out
    }

    fn own_answer(&mut self, own: &str, msg: &Value) -> Vec<Out> {
        if own == "init" {
            let mut out = Vec::new();
            // Attach every open session again after what was passed on.
            for (sid, s) in &self.sessions {
                let mut params = json!({"sessionId": sid, "mcpServers": [],
                    "_meta": {"gateway": {"afterSeq": s.last_seq}}});
                if !s.cwd.is_empty() {
                    params["cwd"] = json!(s.cwd);
                }
                out.push(Out::Gateway(
                    json!({"jsonrpc": "2.0", "id": format!("{OWN}load:{sid}"), "method": "session/load",
                        "params": params})
                    .to_string(),
                ));
            }
            // The editor's own `initialize`, if it was in flight, is answered by this one.
            let init: Vec<String> = self
                .requests
                .iter()
                .filter(|(_, r)| r.method == "initialize")
                .map(|(id, _)| id.clone())
                .collect();
            for id in init {
                self.requests.remove(&id);
                let mut answer = msg.clone();
                answer["id"] = serde_json::from_str(&id).unwrap_or(Value::Null);
                out.push(Out::Editor(answer.to_string()));
            }
            out.extend(self.go_live());
            return out;
        }
        let Some(sid) = own.strip_prefix("load:") else {
            return Vec::new();
        };
        let turn = &msg["result"]["_meta"]["gateway"]["turn"];
        let mut out = Vec::new();
        let mut ended = Vec::new();
        for (id, r) in &mut self.requests {
            let Some((_, seen)) = r.prompt else { continue };
            if r.session.as_deref() != Some(sid) || r.awaiting_end {
                continue;
            }
            if !seen {
                // The gateway never got it: again (unless it was sent on this connection, and
                // its chunk is still on the way).
                if r.sent != self.connection {
                    r.sent = self.connection;
                    out.push(Out::Gateway(r.frame.clone()));
                }
            } else if turn["running"] == true {
                r.awaiting_end = true;
            } else {
                ended.push(id.clone());
            }
        }
        let ended_turn = turn
            .get("lastAnswer")
            .cloned()
            .unwrap_or_else(|| json!({"result": {"stopReason": "end_turn"}}));
        for id in ended {
            self.requests.remove(&id);
            out.push(turn_answer(&id, &ended_turn));
        }
        if msg.get("error").is_some() {
            // The session is gone (deleted elsewhere): its prompts end with the gateway's error.
            self.sessions.remove(sid);
        }
        out
    }

    /// Past `--reconnect-for`: every request in flight ends with an error that says so, and
    /// new ones are refused at once until the gateway is back.
    pub fn give_up(&mut self) -> Vec<Out> {
        self.give_up_with(-32603, LOST)
    }

    /// [`Self::give_up`] with another error (the token was refused: `-32000`).
    pub fn give_up_with(&mut self, code: i64, message: &str) -> Vec<Out> {
        self.gave_up = Some((code, message.to_string()));
        self.held.clear();
        self.held_bytes = 0;
        let mut ids: Vec<String> = self.requests.keys().cloned().collect();
        ids.sort();
        self.requests.clear();
        ids.iter()
            .filter_map(|id| serde_json::from_str::<Value>(id).ok())
            .map(|id| Out::Editor(error_frame(&id, code, message)))
            .collect()
    }
}

/// The answer to the editor's request `id` (its key) from how a turn ended (`{"result": …}` or
/// `{"error": …}`).
fn turn_answer(id: &str, ended: &Value) -> Out {
    let mut answer = ended.clone();
    answer["jsonrpc"] = json!("2.0");
    answer["id"] = serde_json::from_str(id).unwrap_or(Value::Null);
    Out::Editor(answer.to_string())
}

/// What a request gets once the connection is given up on.
pub const LOST: &str =
    "the connection to the gateway was lost (acp-gateway connect gave up reconnecting; see --reconnect-for)";

/// Whether `path` is `root` or under it (by path components; the gateway resolves symlinks).
fn inside(path: &str, root: &str) -> bool {
    std::path::Path::new(path).starts_with(root)
}

/// The update that tells the editor where a session works instead of its `cwd`.
fn note_frame(sid: &str, cwd: &str) -> String {
    json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid, "update": {
        "sessionUpdate": "agent_message_chunk",
        "content": {"type": "text", "text": format!("(acp-gateway: this session works in {cwd} on the gateway; your editor's folder is not there.)\n")}}}})
    .to_string()
}

#[cfg(test)]
#[path = "bridge_tests.rs"]
mod tests;
