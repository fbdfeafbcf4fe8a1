//! The JSON-RPC peer's own tests: an in-memory pipe plays the agent.

use super::*;
use crate::agents::pool::AgentProcess;
use crate::protocol::Kind;
use tokio::io::{AsyncBufReadExt, BufReader, DuplexStream, Lines};
use tokio_util::sync::CancellationToken;

/// A peer whose writer feeds an in-memory pipe; the test plays the agent at its other end.
fn peer() -> (Arc<Rpc>, Lines<BufReader<DuplexStream>>) {
    let (ours, theirs) = tokio::io::duplex(4096);
    let (rpc, input) = Rpc::new(Arc::from("test-agent"), Box::new(ours), 1 << 20);
    tokio::spawn(write_lines(input, CancellationToken::new()));
    (Arc::new(rpc), BufReader::new(theirs).lines())
}

/// Reads the next request the agent gets: its id, method and params.
async fn next_request(agent: &mut Lines<BufReader<DuplexStream>>) -> (u64, String, serde_json::Value) {
    let line = agent.next_line().await.expect("read").expect("a line");
    let v: serde_json::Value = serde_json::from_str(&line).expect("JSON");
    let id = v["id"].as_u64().expect("numeric id");
    (
        id,
        v["method"].as_str().expect("method").to_owned(),
        v["params"].clone(),
    )
}

/// The agent's `line`, handed to the peer as the answer it is.
fn answer(rpc: &Rpc, line: &str) {
    let (msg, kind) = Incoming::parse(line).expect("JSON-RPC");
    assert_eq!(kind, Kind::Response);
    rpc.on_response(&msg);
}

/// A session that records the answers routed to it.
#[derive(Default)]
struct Recorder(Mutex<Vec<String>>);

#[async_trait::async_trait]
impl SessionRoute for Recorder {
    fn session_id(&self) -> &str {
        "s1"
    }
    async fn publish(&self, _: &RawValue, _: Option<&RawValue>) {}
    fn agent_request(self: Arc<Self>, _: &Arc<AgentProcess>, _: Box<RawValue>, _: &str, _: String) {}
    fn respond(&self, _: &Outbox, _: &RawValue, frame: Utf8Bytes) {
        lock(&self.0).push(frame.to_string());
    }
    fn unbound(&self, _: u64) {}
}

fn forward_to(route: &Arc<Recorder>, client_id: &str) -> Pending {
    let (to, _) = crate::infra::outbox::outbox(8, 1 << 20);
    Pending::Forward {
        route: route.clone(),
        to,
        client_id: RawValue::from_string(client_id.to_owned()).expect("raw id"),
        _slot: None,
    }
}

#[tokio::test]
async fn a_request_gets_its_answer_or_the_agents_error() {
    let (rpc, mut agent) = peer();
    let asking = tokio::spawn({
        let rpc = rpc.clone();
        async move { rpc.request("initialize", r#"{"v":1}"#, Duration::from_secs(30)).await }
    });
    let (id, method, params) = next_request(&mut agent).await;
    assert_eq!(
        (id, method.as_str(), params),
        (0, "initialize", serde_json::json!({"v": 1}))
    );
    assert!(rpc.is_pending(0) && rpc.is_waiting());
    answer(&rpc, r#"{"jsonrpc":"2.0","id":0,"result":{"ok":true}}"#);
    assert_eq!(asking.await.expect("task").expect("answer").get(), r#"{"ok":true}"#);
    assert!(!rpc.is_waiting());

    let asking = tokio::spawn({
        let rpc = rpc.clone();
        async move { rpc.request("session/new", "{}", Duration::from_secs(30)).await }
    });
    let (id, ..) = next_request(&mut agent).await;
    assert_eq!(id, 1, "ids are never reused");
    answer(
        &rpc,
        r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"auth required","data":{"m":1}}}"#,
    );
    let err = asking.await.expect("task").expect_err("the agent's error");
    assert_eq!(
        (err.code, &*err.message, err.data.as_deref()),
        (-32000, "auth required", Some(r#"{"m":1}"#))
    );
}

#[tokio::test]
async fn a_request_not_answered_in_time_is_forgotten() {
    let (rpc, mut agent) = peer();
    let err = rpc
        .request("slow", "{}", Duration::from_millis(10))
        .await
        .expect_err("no answer");
    assert_eq!((err.code, &*err.message), (-32603, "agent timed out"));
    assert!(!rpc.is_waiting());
    // A late answer finds nobody waiting and is dropped.
    let (id, ..) = next_request(&mut agent).await;
    answer(&rpc, &format!(r#"{{"jsonrpc":"2.0","id":{id},"result":null}}"#));
}

#[tokio::test]
async fn forwarded_answers_go_to_the_route_under_the_clients_id() {
    let (rpc, mut agent) = peer();
    let route = Arc::new(Recorder::default());
    let first = rpc
        .forward("session/prompt", "{}", forward_to(&route, r#""c-1""#))
        .expect("queued");
    let second = rpc
        .forward("session/set_mode", "{}", forward_to(&route, "7"))
        .expect("queued");
    assert_eq!(next_request(&mut agent).await.0, first);
    assert_eq!(next_request(&mut agent).await.0, second);
    answer(
        &rpc,
        &format!(r#"{{"jsonrpc":"2.0","id":{first},"result":{{"stopReason":"end_turn"}}}}"#),
    );
    answer(
        &rpc,
        &format!(r#"{{"jsonrpc":"2.0","id":{second},"error":{{"code":-32602,"message":"no"}}}}"#),
    );
    let frames: Vec<serde_json::Value> = lock(&route.0)
        .iter()
        .map(|f| serde_json::from_str(f).expect("JSON"))
        .collect();
    assert_eq!(frames[0]["id"], "c-1");
    assert_eq!(frames[0]["result"]["stopReason"], "end_turn");
    assert_eq!(frames[1]["id"], 7);
    assert_eq!(frames[1]["error"]["code"], -32602);
    assert!(!rpc.is_pending(first) && !rpc.is_pending(second));
}

#[tokio::test]
async fn only_forwarded_prompts_are_watched_for_silence() {
    let (rpc, mut agent) = peer();
    let route = Arc::new(Recorder::default());
    rpc.forward("session/set_mode", "{}", forward_to(&route, "1"))
        .expect("queued");
    assert_eq!(rpc.oldest_prompt(), None, "not a prompt");
    let before = Instant::now();
    let prompt = rpc
        .forward("session/prompt", "{}", forward_to(&route, "2"))
        .expect("queued");
    assert!(rpc.oldest_prompt().is_some_and(|t| t >= before));
    let _ = (next_request(&mut agent).await, next_request(&mut agent).await);
    answer(
        &rpc,
        &format!(r#"{{"jsonrpc":"2.0","id":{prompt},"result":{{"stopReason":"end_turn"}}}}"#),
    );
    assert_eq!(rpc.oldest_prompt(), None, "answered");

    // A timed-out peer answers what waits with the contract's words.
    rpc.forward("session/prompt", "{}", forward_to(&route, "3"))
        .expect("queued");
    rpc.set_gone_error(timed_out("test-agent"));
    rpc.fail_all();
    // `fail_all` answers everything still waiting (the set_mode too), in no set order.
    let last: serde_json::Value = lock(&route.0)
        .iter()
        .map(|f| serde_json::from_str::<serde_json::Value>(f).expect("JSON"))
        .find(|f| f["id"] == 3)
        .expect("the prompt was answered");
    assert_eq!(
        (&last["error"]["code"], &last["error"]["message"]),
        (&serde_json::json!(-32603), &serde_json::json!("agent timed out"))
    );
}

#[tokio::test]
async fn forwarded_requests_but_prompts_time_out_and_late_answers_are_dropped() {
    let (rpc, mut agent) = peer();
    let route = Arc::new(Recorder::default());
    let prompt = rpc
        .forward("session/prompt", "{}", forward_to(&route, "1"))
        .expect("queued");
    let set_mode = rpc
        .forward("session/set_mode", "{}", forward_to(&route, r#""m""#))
        .expect("queued");
    let _ = (next_request(&mut agent).await, next_request(&mut agent).await);
    assert!(
        rpc.expire_forwarded(Duration::from_secs(60)).is_empty(),
        "nothing has waited a minute"
    );
    assert_eq!(
        rpc.expire_forwarded(Duration::ZERO),
        vec![set_mode],
        "only the set_mode"
    );
    assert!(rpc.is_pending(prompt) && !rpc.is_pending(set_mode));
    let frames: Vec<serde_json::Value> = lock(&route.0)
        .iter()
        .map(|f| serde_json::from_str(f).expect("JSON"))
        .collect();
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert_eq!(frames[0]["id"], "m");
    assert_eq!(
        (&frames[0]["error"]["code"], &frames[0]["error"]["message"]),
        (&serde_json::json!(-32603), &serde_json::json!("agent timed out"))
    );
    // The agent's late answer reaches nobody.
    answer(&rpc, &format!(r#"{{"jsonrpc":"2.0","id":{set_mode},"result":{{}}}}"#));
    assert_eq!(lock(&route.0).len(), 1);
    // The gateway's own requests are not this one's to time out.
    let own = {
        let rpc = rpc.clone();
        tokio::spawn(async move { rpc.request("session/close", "{}", Duration::from_secs(30)).await })
    };
    let (own_id, ..) = next_request(&mut agent).await;
    assert!(rpc.expire_forwarded(Duration::ZERO).is_empty());
    answer(&rpc, &format!(r#"{{"jsonrpc":"2.0","id":{own_id},"result":{{}}}}"#));
    own.await.expect("join").expect("answered");
}

#[tokio::test]
async fn a_full_input_queue_refuses_at_once_and_an_ended_peer_fails_everything() {
    // The agent is not reading, and nobody drains the queue: the first line goes to the pipe
    // at once (which takes one byte of it), the next ones fill the queue.
    let (ours, _theirs) = tokio::io::duplex(1);
    let (rpc, rx) = Rpc::new(Arc::from("test-agent"), Box::new(ours), 1 << 20);
    let route = Arc::new(Recorder::default());
    for _ in 0..=STDIN_QUEUE {
        rpc.forward("m", "{}", forward_to(&route, "1")).expect("room");
    }
    let err = rpc.forward("m", "{}", forward_to(&route, "2")).expect_err("queue full");
    assert!(err.message.contains("not reading its input"), "{}", err.message);
    assert!(!rpc.is_pending(STDIN_QUEUE as u64 + 1));

    rpc.set_gone_error(RpcError::internal("agent process exited (exit code 3)"));
    rpc.fail_all();
    assert!(!rpc.is_waiting());
    let failed = std::mem::take(&mut *lock(&route.0));
    assert_eq!(failed.len(), STDIN_QUEUE + 1);
    assert!(failed.iter().all(|f| f.contains("exit code 3")));

    drop(rx);
    let err = rpc.request("m", "{}", Duration::from_secs(30)).await.expect_err("gone");
    assert!(err.message.contains("exit code 3"), "{}", err.message);
}

#[tokio::test]
async fn the_input_queue_is_bounded_in_bytes_and_written_lines_give_room_back() {
    // A pipe of one byte that the agent does not read yet: the first line goes to it at once and
    // waits there, the next ones queue.
    let (ours, theirs) = tokio::io::duplex(1);
    let (rpc, input) = Rpc::new(Arc::from("test-agent"), Box::new(ours), 1000);
    let route = Arc::new(Recorder::default());
    let big = format!(r#"{{"text":"{}"}}"#, "x".repeat(600));
    rpc.forward("m", &big, forward_to(&route, "0"))
        .expect("written at once");
    rpc.forward("m", &big, forward_to(&route, "1")).expect("room");
    let err = rpc
        .forward("m", &big, forward_to(&route, "2"))
        .expect_err("two 660-byte lines queued are over 1,000 bytes");
    assert!(err.message.contains("not reading its input"), "{}", err.message);
    assert!(!rpc.is_pending(2), "a refused request is not waited for");
    rpc.forward("m", "{}", forward_to(&route, "3"))
        .expect("a small one still fits");
    // Once the agent reads, the bytes come back.
    tokio::spawn(write_lines(input, CancellationToken::new()));
    let mut agent = BufReader::new(theirs).lines();
    // In the order sent (the refused one's id, 2, was never used).
    for expected in [0, 1, 3] {
        assert_eq!(next_request(&mut agent).await.0, expected, "in the order sent");
    }
    rpc.forward("m", &big, forward_to(&route, "4")).expect("room again");
}

#[tokio::test]
async fn lines_keep_their_order_whether_written_at_once_or_queued() {
    // A pipe of 64 bytes, read in batches: in the even batches the first line goes to the pipe at
    // once, the second finds it full and stays in the writer's buffer, and the rest queue behind
    // it; in the odd ones the first line, with nothing queued, is exactly as long as the writer's
    // buffer. The fourth of each batch is longer than the buffer. Those two are always queued,
    // whole, and the lines after them must not pass them.
    let (ours, theirs) = tokio::io::duplex(64);
    let (rpc, input) = Rpc::new(Arc::from("test-agent"), Box::new(ours), 1 << 20);
    tokio::spawn(write_lines(input, CancellationToken::new()));
    let mut agent = BufReader::new(theirs).lines();
    let route = Arc::new(Recorder::default());
    for batch in 0..8u64 {
        for i in batch * 10..batch * 10 + 10 {
            let bare = protocol::request(i, "m", &format!(r#"{{"n":{i},"pad":""}}"#)).len() + 1;
            let pad = match (batch % 2, i % 10) {
                (1, 0) => (64 << 10) - bare,
                (_, 3) => 70_000,
                _ => 20,
            };
            let params = format!(r#"{{"n":{i},"pad":"{}"}}"#, "p".repeat(pad));
            rpc.forward("m", &params, forward_to(&route, &i.to_string()))
                .expect("room");
        }
        for i in batch * 10..batch * 10 + 10 {
            let (id, _, params) = next_request(&mut agent).await;
            assert_eq!((id, params["n"].as_u64()), (i, Some(i)), "line {i} in its place");
        }
    }
}
