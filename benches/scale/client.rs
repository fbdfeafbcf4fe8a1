//! WebSocket clients of the gateway: connect, call, close, and the figures read from it.

use super::*;

pub(crate) async fn connect(addr: SocketAddr, token: &str) -> Result<Ws> {
    let tcp = TcpStream::connect(addr).await.context("TCP connect")?;
    tcp.set_nodelay(true)?;
    let mut req = format!("ws://{addr}/acp").into_client_request()?;
    req.headers_mut()
        .insert("authorization", format!("Bearer {token}").parse()?);
    // Small client buffers: ten thousand sockets live in this process too.
    let config = WebSocketConfig::default().read_buffer_size(4096);
    let (ws, resp) = tokio::time::timeout(
        STEP,
        tokio_tungstenite::client_async_with_config(req, tcp, Some(config)),
    )
    .await
    .context("handshake timed out")?
    .context("WebSocket handshake")?;
    ensure!(resp.status().as_u16() == 101, "upgrade answered {}", resp.status());
    Ok(ws)
}

pub(crate) async fn next_text(ws: &mut Ws) -> Result<Value> {
    loop {
        let frame = tokio::time::timeout(STEP, ws.next())
            .await
            .context("no message in time")?
            .context("connection ended")?
            .context("reading")?;
        match frame {
            Message::Text(t) => return serde_json::from_str(&t).context("not JSON"),
            Message::Close(c) => bail!("closed by the gateway: {c:?}"),
            _ => {}
        }
    }
}

/// Sends a request and returns its result; notifications before the answer are skipped.
pub(crate) async fn call(ws: &mut Ws, id: u64, method: &str, params: Value) -> Result<Value> {
    let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    ws.send(Message::text(msg.to_string())).await?;
    loop {
        let v = next_text(ws).await?;
        if v["id"] == json!(id) {
            if let Some(e) = v.get("error") {
                bail!("{method} failed: {e}");
            }
            return Ok(v["result"].clone());
        }
    }
}

/// Connects and initializes; returns the socket and the user's first workspace root.
pub(crate) async fn open(addr: SocketAddr, token: &str) -> Result<(Ws, Value)> {
    let mut ws = connect(addr, token).await?;
    let init = call(&mut ws, 1, "initialize", json!({"protocolVersion": 1})).await?;
    let cwd = init["_meta"]["gateway"]["workspaceRoots"][0].clone();
    ensure!(cwd.is_string(), "initialize named no workspace root: {init}");
    Ok((ws, cwd))
}

/// How a client-initiated close went.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Closed {
    /// The connection ended (end of stream or reset) after our close frame.
    pub(crate) ended: bool,
    /// The gateway answered with a close frame of its own (RFC 6455 5.5.1).
    pub(crate) acknowledged: bool,
}

/// Sends a close frame and reads until the connection ends.
pub(crate) async fn close(ws: &mut Ws) -> Closed {
    let mut closed = Closed::default();
    if ws.close(None).await.is_err() {
        return closed;
    }
    let drained = tokio::time::timeout(STEP, async {
        while let Some(frame) = ws.next().await {
            match frame {
                Ok(Message::Close(_)) => closed.acknowledged = true,
                Ok(_) => {}
                Err(_) => break,
            }
        }
    })
    .await;
    closed.ended = drained.is_ok();
    closed
}

/// The gateway's `acp_gateway_connections` gauge, from `/metrics`.
pub(crate) async fn connections_gauge(addr: SocketAddr) -> Result<f64> {
    let text = reqwest::get(format!("http://{addr}/metrics")).await?.text().await?;
    text.lines()
        .find_map(|l| l.strip_prefix("acp_gateway_connections "))
        .and_then(|v| v.trim().parse().ok())
        .context("no acp_gateway_connections gauge in /metrics")
}

pub(crate) fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}
