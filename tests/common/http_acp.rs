//! A Streamable HTTP client of `/acp` for tests: POSTs JSON-RPC messages and reads SSE streams
//! event by event, the way the transport RFD's clients do, with every status code visible.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

/// One SSE event.
#[derive(Debug, Clone)]
pub struct Event {
    /// Its `id:`, if it had one.
    pub id: Option<String>,
    /// Its `data:`, as JSON.
    pub data: Value,
}

/// A connection made by `initialize`.
pub struct HttpAcp {
    pub http: reqwest::Client,
    pub url: String,
    pub token: String,
    /// `Acp-Connection-Id`.
    pub conn: String,
    /// `initialize`'s answer.
    pub init: Value,
    next_id: u64,
}

/// An open SSE stream.
pub struct Sse {
    res: reqwest::Response,
    buf: String,
}

impl Sse {
    /// The next event (keep-alive comments skipped), or `None` when the stream ended.
    pub async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut id = None;
                let mut data = Vec::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id: ") {
                        id = Some(v.to_string());
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data.push(v);
                    }
                }
                if data.is_empty() {
                    continue;
                }
                let data = serde_json::from_str(&data.join("\n")).expect("an event's data is JSON");
                return Some(Event { id, data });
            }
            match self.res.chunk().await {
                Ok(Some(bytes)) => self.buf.push_str(std::str::from_utf8(&bytes).expect("UTF-8")),
                _ => return None,
            }
        }
    }

    /// The next event within `limit`.
    pub async fn next_within(&mut self, limit: Duration) -> Option<Event> {
        tokio::time::timeout(limit, self.next()).await.ok().flatten()
    }

    /// Events until one matches `done` (included), within 20 s.
    pub async fn until(&mut self, done: impl Fn(&Value) -> bool) -> Vec<Event> {
        let mut out = Vec::new();
        loop {
            let e = self
                .next_within(Duration::from_secs(20))
                .await
                .unwrap_or_else(|| panic!("stream ended or stalled after {out:?}"));
            let stop = done(&e.data);
            out.push(e);
            if stop {
                return out;
            }
        }
    }
}

impl HttpAcp {
    /// `initialize` as `token`'s user; panics unless it is answered `200` with a connection id.
    pub async fn connect(base: &str, token: &str) -> Self {
        Self::connect_with(reqwest::Client::new(), base, token).await
    }

    /// [`HttpAcp::connect`] with `http` (HTTP/2 with prior knowledge, say).
    pub async fn connect_with(http: reqwest::Client, base: &str, token: &str) -> Self {
        let url = format!("{base}/acp");
        let res = http
            .post(&url)
            .bearer_auth(token)
            .json(&json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}))
            .send()
            .await
            .expect("initialize");
        assert_eq!(res.status(), StatusCode::OK);
        let conn = res
            .headers()
            .get("acp-connection-id")
            .expect("Acp-Connection-Id")
            .to_str()
            .expect("ascii")
            .to_string();
        let init = res.json().await.expect("JSON");
        Self {
            http,
            url,
            token: token.into(),
            conn,
            init,
            next_id: 1,
        }
    }

    /// POSTs `msg` on the connection, with `Acp-Session-Id` when `session` is given.
    pub async fn post(&self, msg: &Value, session: Option<&str>) -> StatusCode {
        let mut req = self
            .http
            .post(&self.url)
            .bearer_auth(&self.token)
            .header("acp-connection-id", &self.conn)
            .json(msg);
        if let Some(s) = session {
            req = req.header("acp-session-id", s);
        }
        req.send().await.expect("POST").status()
    }

    /// POSTs request `method` and returns its id (the answer comes on a stream).
    pub async fn request(&mut self, method: &str, params: Value, session: Option<&str>) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let status = self
            .post(
                &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
                session,
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{method}");
        id
    }

    /// Opens a stream: the connection's, or `session`'s, resuming after `last_event_id`.
    pub async fn open(&self, session: Option<&str>, last_event_id: Option<&str>) -> Result<Sse, StatusCode> {
        let mut req = self
            .http
            .get(&self.url)
            .bearer_auth(&self.token)
            .header("accept", "text/event-stream")
            .header("acp-connection-id", &self.conn);
        if let Some(s) = session {
            req = req.header("acp-session-id", s);
        }
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id);
        }
        let res = req.send().await.expect("GET");
        if res.status() != StatusCode::OK {
            return Err(res.status());
        }
        assert_eq!(
            res.headers().get("content-type").and_then(|v| v.to_str().ok()),
            Some("text/event-stream")
        );
        Ok(Sse {
            res,
            buf: String::new(),
        })
    }

    /// `DELETE`s the connection.
    pub async fn delete(&self) -> StatusCode {
        self.http
            .delete(&self.url)
            .bearer_auth(&self.token)
            .header("acp-connection-id", &self.conn)
            .send()
            .await
            .expect("DELETE")
            .status()
    }
}

/// Whether `v` answers request `id`.
pub fn answers(v: &Value, id: u64) -> bool {
    v.get("id").and_then(Value::as_u64) == Some(id) && v.get("method").is_none()
}
