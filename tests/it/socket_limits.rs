//! The socket layer: a half-sent request does not hold a socket, one client address cannot take
//! every connection, and connections that never finish a request are capped. Real gateway, raw
//! TCP and real WebSocket clients.

use crate::common;

use std::time::{Duration, Instant};

use common::{Client, Db, TestGateway};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads until the server closes the connection; how long that took.
async fn closed_by_server(mut stream: TcpStream) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(common::WAIT, stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return started.elapsed(),
            Ok(Ok(_)) => {}
            Err(_) => panic!("the server kept the connection open"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_headers_never_finish_is_closed() {
    let gw = TestGateway::start(Db::Sqlite, |c| c.limits.header_read_timeout_secs = 1).await;
    let mut slow = TcpStream::connect(gw.addr).await.expect("connect");
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("write");
    let took = closed_by_server(slow).await;
    assert!(took < Duration::from_secs(5), "closed after {took:?}");
    // A complete request on a new connection is served as usual.
    let r = reqwest::get(gw.http_url("/healthz")).await.expect("http");
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_every_connection() {
    let gw = TestGateway::start(Db::Sqlite, |c| c.limits.max_connections_per_ip = 2).await;
    // Two WebSockets from 127.0.0.1 hold both of its slots for as long as they are open.
    let a = gw.client("alice").await;
    let _b = gw.client("bob").await;
    let third = TcpStream::connect(gw.addr).await.expect("tcp connect");
    let took = closed_by_server(third).await;
    assert!(took < Duration::from_secs(2), "refused at once: {took:?}");
    let refused = Client::connect(&gw.ws_url(), &gw.token("carol")).await;
    assert!(refused.is_err(), "a third WebSocket from the same address is refused");
    // A slot comes back when a connection ends.
    a.close().await;
    let deadline = Instant::now() + common::WAIT;
    loop {
        if Client::connect(&gw.ws_url(), &gw.token("carol")).await.is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "the address's slot never came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_have_not_upgraded_are_capped_but_websockets_are_not() {
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.limits.max_pending_connections = 2;
        c.limits.header_read_timeout_secs = 30;
    })
    .await;
    // Two WebSockets: upgraded, they no longer count as pending.
    let mut a = gw.client("alice").await;
    let _b = gw.client("alice").await;
    // Two idle TCP connections fill the pending cap...
    let idle1 = TcpStream::connect(gw.addr).await.expect("connect");
    let idle2 = TcpStream::connect(gw.addr).await.expect("connect");
    let mut ready = false;
    let deadline = Instant::now() + common::WAIT;
    while !ready {
        // ...so a third is closed at once (wait until both idle ones are accepted).
        let third = TcpStream::connect(gw.addr).await.expect("connect");
        ready = closed_by_server(third).await < Duration::from_millis(500);
        assert!(Instant::now() < deadline, "the pending cap never applied");
    }
    // The WebSockets still work.
    let r = a.request("session/list", serde_json::json!({})).await;
    assert!(r.get("result").is_some(), "{r}");
    drop((idle1, idle2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_each_forwarded_address_is_capped_on_its_own() {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let gw = TestGateway::start(Db::Sqlite, |c| {
        c.limits.max_connections_per_ip = 2;
        c.limits.trusted_proxies = vec!["127.0.0.1".parse().expect("ip")];
    })
    .await;
    let through_proxy = |forwarded_for: &'static str, user: &str| {
        let mut req = gw.ws_url().into_client_request().expect("request");
        let h = req.headers_mut();
        h.insert(
            "authorization",
            format!("Bearer {}", gw.token(user)).parse().expect("header"),
        );
        h.insert("x-forwarded-for", forwarded_for.parse().expect("header"));
        Client::connect_request(req)
    };
    // The proxy itself (127.0.0.1) is not capped: its clients are, by the address it forwards.
    let a1 = through_proxy("203.0.113.7", "alice").await.expect("first");
    let _a2 = through_proxy("198.51.100.1, 203.0.113.7", "bob").await.expect("second");
    let refused = through_proxy("203.0.113.7", "carol")
        .await
        .err()
        .expect("a third is refused");
    assert!(refused.to_string().contains("429"), "{refused}");
    // A different client address of the same proxy still gets in, as does a spoofed left part.
    let _b = through_proxy("203.0.113.8", "carol").await.expect("another address");
    let _c = through_proxy("203.0.113.7, 203.0.113.9", "carol")
        .await
        .expect("its own slot");
    // A slot comes back when its WebSocket ends.
    a1.close().await;
    let deadline = Instant::now() + common::WAIT;
    while through_proxy("203.0.113.7", "dave").await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the forwarded address's slot never came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_and_bodies_that_stop_are_closed() {
    let gw = TestGateway::start(Db::Sqlite, |c| c.limits.header_read_timeout_secs = 1).await;
    // Nothing at all; the start of an HTTP/2 preface (the server must not wait to tell the two
    // apart); a login form whose body never finishes. None needs a token.
    let silent = TcpStream::connect(gw.addr).await.expect("connect");
    let mut preface = TcpStream::connect(gw.addr).await.expect("connect");
    preface.write_all(b"PRI * HTTP/2.0\r\n").await.expect("write");
    let mut body = TcpStream::connect(gw.addr).await.expect("connect");
    body.write_all(
        b"POST /auth/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\nt",
    )
    .await
    .expect("write");
    for (what, stream) in [("silent", silent), ("preface", preface), ("body", body)] {
        let took = closed_by_server(stream).await;
        assert!(took < Duration::from_secs(5), "{what}: closed after {took:?}");
    }
    let r = reqwest::get(gw.http_url("/healthz")).await.expect("http");
    assert_eq!(r.status(), 200);
}
