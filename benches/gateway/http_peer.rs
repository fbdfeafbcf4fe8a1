//! The benchmark's Streamable HTTP client of the gateway's `/acp`, over HTTP/2 with prior
//! knowledge (one TCP connection for the POSTs and the SSE streams, as the transport RFD asks):
//! `initialize` answered in the POST's body, everything else `202` with the answer on a stream,
//! a session's stream opened before the first message that names the session.

use std::collections::HashSet;
use std::net::SocketAddr;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::transport::Transport;

/// A Streamable HTTP client: POSTs messages, and reads the events of its streams in order of
/// arrival.
pub struct HttpPeer {
    http: reqwest::Client,
    url: String,
    token: String,
    conn: Option<String>,
    opened: HashSet<String>,
    tx: mpsc::UnboundedSender<String>,
    rx: mpsc::UnboundedReceiver<String>,
    last: String,
}

impl HttpPeer {
    pub fn new(addr: SocketAddr, token: &str) -> Result<Self> {
        let http = reqwest::Client::builder()
            .http2_prior_knowledge()
            .tcp_nodelay(true)
            .build()?;
        let (tx, rx) = mpsc::unbounded_channel();
        Ok(Self {
            http,
            url: format!("http://{addr}/acp"),
            token: token.into(),
            conn: None,
            opened: HashSet::new(),
            tx,
            rx,
            last: String::new(),
        })
    }

    /// Opens a stream (the connection's, or `session`'s) and reads it into the inbox.
    async fn open(&mut self, session: Option<&str>) -> Result<()> {
        let conn = self.conn.as_deref().context("not initialized")?;
        let mut req = self
            .http
            .get(&self.url)
            .bearer_auth(&self.token)
            .header("accept", "text/event-stream")
            .header("acp-connection-id", conn);
        if let Some(s) = session {
            req = req.header("acp-session-id", s);
        }
        let mut res = req.send().await?;
        if res.status() != reqwest::StatusCode::OK {
            bail!("GET answered {}", res.status());
        }
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let mut buf = String::new();
            while let Ok(Some(bytes)) = res.chunk().await {
                buf.push_str(&String::from_utf8_lossy(&bytes));
                while let Some(end) = buf.find("\n\n") {
                    let block: String = buf.drain(..end + 2).collect();
                    let data: Vec<&str> = block.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
                    if !data.is_empty() && tx.send(data.join("\n")).is_err() {
                        return;
                    }
                }
            }
        });
        Ok(())
    }
}

impl Transport for HttpPeer {
    async fn send(&mut self, msg: &str) -> Result<()> {
        let v: Value = serde_json::from_str(msg)?;
        if v["method"] == "initialize" {
            let res = self
                .http
                .post(&self.url)
                .bearer_auth(&self.token)
                .header("content-type", "application/json")
                .body(msg.to_string())
                .send()
                .await?;
            if res.status() != reqwest::StatusCode::OK {
                bail!("initialize answered {}", res.status());
            }
            let conn = res
                .headers()
                .get("acp-connection-id")
                .and_then(|v| v.to_str().ok())
                .context("no Acp-Connection-Id")?
                .to_string();
            self.conn = Some(conn);
            let _ = self.tx.send(res.text().await?);
            return self.open(None).await;
        }
        let session = v["params"]["sessionId"].as_str().map(str::to_string);
        if let Some(s) = &session
            && self.opened.insert(s.clone())
        {
            self.open(Some(s)).await?;
        }
        let mut req = self
            .http
            .post(&self.url)
            .bearer_auth(&self.token)
            .header("content-type", "application/json")
            .header("acp-connection-id", self.conn.as_deref().context("not initialized")?)
            .body(msg.to_string());
        if let Some(s) = &session {
            req = req.header("acp-session-id", s);
        }
        let status = req.send().await?.status();
        if status != reqwest::StatusCode::ACCEPTED {
            bail!("POST answered {status}");
        }
        Ok(())
    }

    async fn recv(&mut self) -> Result<&[u8]> {
        self.last = self.rx.recv().await.context("streams ended")?;
        Ok(self.last.as_bytes())
    }
}
