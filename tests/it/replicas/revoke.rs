//! A device signed in on one replica and revoked on another: its connection on the first closes
//! within the few seconds the replicas look sign-ins up (no identity provider configured).

use std::time::Duration;

use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use super::Cluster;
use crate::common::Client;

const GRANT: &str = "urn:ietf:params:oauth:grant-type:device_code";

/// A device token of `user`, signed in through replica `at` (`host:port`) with the device flow.
async fn device_token(at: &str, approver: &str) -> String {
    let http = reqwest::Client::new();
    let started: Value = http
        .post(format!("http://{at}/auth/device"))
        .form(&[("client_id", "acp-gateway"), ("client_name", "laptop")])
        .send()
        .await
        .expect("start")
        .json()
        .await
        .expect("json");
    let approved = http
        .post(format!("http://{at}/api/device/approve"))
        .bearer_auth(approver)
        .json(&json!({"userCode": started["user_code"], "approve": true}))
        .send()
        .await
        .expect("approve");
    assert_eq!(approved.status(), 200);
    // RFC 8628's interval (5 s) before the poll that gets the token.
    for _ in 0..10 {
        let r = http
            .post(format!("http://{at}/auth/device/token"))
            .form(&[
                ("grant_type", GRANT),
                ("device_code", started["device_code"].as_str().expect("code")),
            ])
            .send()
            .await
            .expect("poll");
        let body: Value = r.json().await.expect("json");
        if let Some(token) = body["access_token"].as_str() {
            return token.to_string();
        }
        assert_eq!(body["error"], "slow_down", "{body}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    panic!("no token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_revoked_on_one_replica_is_closed_on_the_other() {
    let cluster = Cluster::new().await;
    let (a, b) = (cluster.replica("a").await, cluster.replica("b").await);
    let token = device_token(&a.addr, &a.token("alice")).await;
    // The device works on B.
    let mut device = Client::connect(&b.ws_url(), &token).await.expect("connects to B");
    device.initialize().await;
    // Alice revokes it on A.
    let http = reqwest::Client::new();
    let listed: Value = http
        .get(format!("http://{}/api/devices", a.addr))
        .bearer_auth(a.token("alice"))
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    let id = listed["devices"][0]["id"].as_str().expect("a device").to_string();
    let revoked = http
        .delete(format!("http://{}/api/devices/{id}", a.addr))
        .bearer_auth(a.token("alice"))
        .send()
        .await
        .expect("revoke");
    assert_eq!(revoked.status(), 204);
    let started = std::time::Instant::now();
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match device.recv_frame().await {
                Some(Message::Close(frame)) => return frame.map(|f| u16::from(f.code)),
                None => return None,
                Some(_) => {}
            }
        }
    })
    .await
    .expect("B closes the revoked device's connection within 10 s");
    assert_eq!(closed, Some(1008));
    eprintln!("closed on B {:?} after the revocation on A", started.elapsed());
    assert!(Client::connect(&b.ws_url(), &token).await.is_err(), "and refuses it");
}
