//! Floods from one client: rate-limited and capped in flight, other users unaffected.

use super::*;

/// 10 000 small requests sent without reading a byte: each is answered exactly once, the ones
/// over the user's rate with `-32029` naming the cap; the connection lives, and another user's
/// prompt runs meanwhile as if nothing happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_requests_is_rate_limited_and_other_users_are_unaffected() {
    watch_panics();
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let mut bob = gw.client("bob").await;
    let sb = bob.new_session().await;

    let mut req = gw.ws_url().into_client_request().expect("request");
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", gw.token("flooder")).parse().expect("header"),
    );
    let (ws, _) = tokio_tungstenite::connect_async(req).await.expect("connects");
    let (mut tx, mut rx) = ws.split();
    tx.send(Message::text(
        json!({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {"protocolVersion": 1, "clientCapabilities": {}}}).to_string(),
    ))
    .await
    .expect("send");
    let n = 10_000;
    let flood = tokio::spawn(async move {
        for i in 0..n {
            let f = format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"x/flood","params":{{}}}}"#);
            tx.feed(Message::text(f)).await.expect("send");
        }
        tx.flush().await.expect("flush");
        tx
    });
    // Bob's prompt runs while the flooder's answers pile up unread (and, once its queue is full,
    // while the gateway stops reading the flooder).
    let started = Instant::now();
    let r = bob.prompt(&sb, "[chunks=20] during the flood").await;
    let took = started.elapsed();
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    assert!(took < Duration::from_secs(5), "bob waited {took:?}");

    // Now the flooder reads: every request answered once, or the connection closed with 1013.
    let mut seen: HashMap<u64, i64> = HashMap::new();
    let mut init = None;
    let mut closed = None;
    while seen.len() < n as usize {
        let m = tokio::time::timeout(WAIT, rx.next())
            .await
            .expect("answers keep coming")
            .expect("the connection lives")
            .expect("frame");
        let t = match m {
            Message::Text(t) => t,
            Message::Close(frame) => {
                closed = Some(frame.map(|f| u16::from(f.code)));
                break;
            }
            _ => continue,
        };
        let v: Value = serde_json::from_str(&t).expect("JSON");
        if v["id"] == "init" {
            init = Some(v);
            continue;
        }
        let id = v["id"].as_u64().unwrap_or_else(|| panic!("unexpected {v}"));
        let code = v["error"]["code"]
            .as_i64()
            .unwrap_or_else(|| panic!("not an error: {v}"));
        if code == -32029 {
            assert_eq!(v["error"]["data"]["cap"], "requests_per_second", "{v}");
        } else {
            assert_eq!(code, -32601, "{v}");
        }
        assert!(seen.insert(id, code).is_none(), "answered twice: {v}");
    }
    assert!(init.is_some_and(|i| i.get("result").is_some()), "initialize answered");
    let limited = seen.values().filter(|c| **c == -32029).count();
    if let Some(code) = closed {
        assert_eq!(code, Some(1013), "a flooder is closed with 1013 if at all");
        let _ = flood.await;
        let mut again = gw.client("flooder").await;
        assert!(again.request("session/list", json!({})).await.get("result").is_some());
        let live = bob.take_updates(&sb);
        assert_replay_holds(&gw, "bob", &sb, &live).await;
        finish(gw).await;
        return;
    }
    assert!(limited > 0, "10 000 requests at once are over the rate");
    assert!(limited < n as usize, "the burst is served");
    let mut tx = tokio::time::timeout(WAIT, flood)
        .await
        .expect("the flood was sent")
        .expect("task");

    // The flooder's connection still serves it, once the rate allows.
    let deadline = Instant::now() + WAIT;
    loop {
        tx.send(Message::text(
            json!({"jsonrpc": "2.0", "id": "after", "method": "session/list", "params": {}}).to_string(),
        ))
        .await
        .expect("send");
        let v = loop {
            let m = tokio::time::timeout(WAIT, rx.next())
                .await
                .expect("answer")
                .expect("open")
                .expect("frame");
            if let Message::Text(t) = m {
                break serde_json::from_str::<Value>(&t).expect("JSON");
            }
        };
        assert_eq!(v["id"], "after", "{v}");
        if v.get("result").is_some() {
            break;
        }
        assert_eq!(v["error"]["code"], -32029, "{v}");
        assert!(Instant::now() < deadline, "still limited");
        // The rate limiter refills with time; there is no event to wait on.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let live = bob.take_updates(&sb);
    assert_eq!(chunk_texts(&live).len(), 20);
    assert_replay_holds(&gw, "bob", &sb, &live).await;
    finish(gw).await;
}

/// Within the rate, a flood of requests the gateway answers from its database meets the
/// connection's in-flight cap: every request is answered exactly once (a result, or an error),
/// and the connection and other users carry on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_within_the_rate_meets_the_in_flight_cap() {
    watch_panics();
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.limits.requests_per_second_per_user = 1_000_000;
        c.limits.request_burst_per_user = 1_000_000;
        c.limits.max_inflight_per_connection = 16;
    })
    .await;
    let mut bob = gw.client("bob").await;
    let sb = bob.new_session().await;
    let mut c = gw.client("flooder").await;
    let n = 2000;
    for i in 0..n {
        c.send_text(&format!(
            r#"{{"jsonrpc":"2.0","id":{i},"method":"session/list","params":{{}}}}"#
        ))
        .await;
    }
    let r = bob.prompt(&sb, "during the flood").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let mut seen: HashMap<u64, Value> = HashMap::new();
    while seen.len() < n {
        let v = c.next().await;
        let id = v["id"].as_u64().unwrap_or_else(|| panic!("unexpected {v}"));
        assert!(v["result"]["sessions"].is_array() || v["error"]["code"].is_i64(), "{v}");
        assert!(seen.insert(id, v).is_none(), "answered twice");
    }
    let refused: Vec<&Value> = seen.values().filter(|v| v.get("error").is_some()).collect();
    assert!(
        !refused.is_empty(),
        "2000 requests at once are over a cap of 16 in flight"
    );
    for v in &refused {
        assert_eq!(v["error"]["code"], -32029, "{v}");
        assert_eq!(v["error"]["data"]["cap"], "requests_in_flight", "{v}");
        assert!(
            v["error"]["message"].as_str().is_some_and(|m| m.contains("in flight")),
            "{v}"
        );
    }
    let r = c.request("session/list", json!({})).await;
    assert!(r.get("result").is_some(), "{r}");
    let live = bob.take_updates(&sb);
    assert_replay_holds(&gw, "bob", &sb, &live).await;
    finish(gw).await;
}
