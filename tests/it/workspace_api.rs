//! The web UI's workspace routes (`/api/fs/dirs`, `/api/fs/file`). Real gateway, real agent
//! processes, real HTTP and WebSocket clients.

use crate::common;

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use common::{Db, TestGateway};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Plain HTTP, no cookies kept.
fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

/// `user`'s first workspace root (created).
fn root(gw: &TestGateway, user: &str) -> PathBuf {
    gw.gw.agents.tenancy.roots(user).expect("roots").remove(0)
}

fn p(path: &Path) -> String {
    path.to_str().expect("utf-8").to_string()
}

/// `GET` as `user` (bearer token); the status and the JSON body.
async fn get(gw: &TestGateway, user: &str, route: &str, query: &[(&str, &str)]) -> (StatusCode, Value) {
    let res = http()
        .get(gw.http_url(route))
        .query(query)
        .bearer_auth(gw.token(user))
        .send()
        .await
        .expect("request");
    let status = res.status();
    assert_eq!(
        res.headers().get("cache-control").and_then(|v| v.to_str().ok()),
        Some("no-store"),
        "{route} {query:?}"
    );
    (status, res.json().await.expect("JSON body"))
}

/// `POST /api/fs/dirs` as `user`.
async fn mkdir(gw: &TestGateway, user: &str, path: &str) -> (StatusCode, Value) {
    let res = http()
        .post(gw.http_url("/api/fs/dirs"))
        .bearer_auth(gw.token(user))
        .json(&json!({ "path": path }))
        .send()
        .await
        .expect("request");
    (res.status(), res.json().await.expect("JSON body"))
}

fn names(listing: &Value) -> Vec<&str> {
    listing["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| e["name"].as_str().expect("name"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directories_inside_the_roots_are_listed() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let root = root(&gw, "alice");
    for d in ["beta", "Alpha", "gamma/inner", ".hidden"] {
        std::fs::create_dir_all(root.join(d)).expect("mkdir");
    }
    std::fs::write(root.join("file.txt"), "hi").expect("write");
    symlink(root.join("gamma"), root.join("to-gamma")).expect("symlink");
    symlink("/etc", root.join("to-etc")).expect("symlink");
    symlink(root.join("nowhere"), root.join("dangling")).expect("symlink");

    // No path: the first root; directories only, sorted by name, no hidden ones, links followed
    // only where they stay inside.
    let (status, listing) = get(&gw, "alice", "/api/fs/dirs", &[]).await;
    assert_eq!(status, StatusCode::OK, "{listing}");
    assert_eq!(listing["path"], p(&root));
    assert_eq!(listing["parent"], Value::Null, "a root has no parent to go to");
    assert_eq!(listing["roots"], json!([p(&root)]));
    assert_eq!(listing["truncated"], false);
    assert_eq!(names(&listing), ["Alpha", "beta", "gamma", "to-gamma"]);
    let entries = listing["entries"].as_array().expect("entries");
    assert_eq!(entries[0]["path"], p(&root.join("Alpha")));
    assert_eq!(
        entries[3]["path"],
        p(&root.join("gamma")),
        "a link is named by where it leads"
    );

    let (_, with_hidden) = get(&gw, "alice", "/api/fs/dirs", &[("hidden", "1")]).await;
    assert_eq!(names(&with_hidden), [".hidden", "Alpha", "beta", "gamma", "to-gamma"]);

    // Inside: the parent is the root; `..` and `.` are resolved.
    let (status, inner) = get(&gw, "alice", "/api/fs/dirs", &[("path", &p(&root.join("gamma")))]).await;
    assert_eq!(status, StatusCode::OK, "{inner}");
    assert_eq!(inner["parent"], p(&root));
    assert_eq!(names(&inner), ["inner"]);
    let winding = format!("{}/beta/../gamma/./inner", p(&root));
    let (status, deep) = get(&gw, "alice", "/api/fs/dirs", &[("path", &winding)]).await;
    assert_eq!(status, StatusCode::OK, "{deep}");
    assert_eq!(deep["path"], p(&root.join("gamma/inner")));
    assert_eq!(deep["parent"], p(&root.join("gamma")));
    assert_eq!(deep["entries"], json!([]));

    // Missing inside: 404; a file: 400; relative: 400.
    let (status, _) = get(&gw, "alice", "/api/fs/dirs", &[("path", &p(&root.join("nope")))]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = get(&gw, "alice", "/api/fs/dirs", &[("path", &p(&root.join("file.txt")))]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = get(&gw, "alice", "/api/fs/dirs", &[("path", "gamma")]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_outside_the_roots_is_reachable_or_probed() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let alice = root(&gw, "alice");
    let bob = root(&gw, "bob");
    std::fs::create_dir_all(bob.join("secret-project")).expect("mkdir");
    std::fs::write(bob.join("notes.txt"), "bob's").expect("write");
    symlink("/etc", alice.join("to-etc")).expect("symlink");
    symlink(&bob, alice.join("to-bob")).expect("symlink");
    symlink("/etc/hostname", alice.join("hostname")).expect("symlink");

    let refused = [
        p(&bob),                                        // another user's workspace
        p(&bob.join("secret-project")),                 // ... and what is in it
        p(&bob.join("no-such-dir")),                    // ... and what is not
        format!("{}/../bob", p(&alice)),                // `..` out of the root
        format!("{}/../../../../../../etc", p(&alice)), // far out
        p(&alice.join("to-etc")),                       // a link out
        p(&alice.join("to-bob/secret-project")),        // a link into another user's
        String::from("/"),
        String::from("/nonexistent/deeper"),
        String::from("/etc/hostname/x"), // a file in the middle, outside
        // `..` after a missing directory, then a link out: an existing and a missing target
        format!("{}/nope/../to-etc/hostname", p(&alice)),
        format!("{}/nope/../to-etc/no-such-file", p(&alice)),
        format!("{}/nope/../to-bob/secret-project", p(&alice)),
    ];
    let mut bodies = Vec::new();
    for path in &refused {
        let (status, body) = get(&gw, "alice", "/api/fs/dirs", &[("path", path)]).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
        assert_eq!(body["roots"], json!([p(&alice)]), "{path}: the allowed roots are named");
        bodies.push(body);
        let (status, _) = get(&gw, "alice", "/api/fs/file", &[("path", path)]).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "file {path}");
    }
    assert!(
        bodies.windows(2).all(|w| w[0] == w[1]),
        "one answer whether the path exists or not: {bodies:?}"
    );
    for file in [
        p(&bob.join("notes.txt")),
        p(&alice.join("hostname")),
        "/etc/passwd".into(),
    ] {
        let (status, _) = get(&gw, "alice", "/api/fs/file", &[("path", &file)]).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{file}");
    }

    // Making directories: refused outside, and nothing is made there.
    for path in [
        p(&bob.join("planted")),
        format!("{}/../bob/planted2", p(&alice)),
        p(&alice.join("to-bob/planted3")),
        p(&alice.join("to-etc/planted4")),
        format!("{}/nope/../to-bob/planted5", p(&alice)),
        format!("{}/nope/../to-bob/secret-project", p(&alice)), // exists: no 409 either
    ] {
        let (status, body) = mkdir(&gw, "alice", &path).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
    }
    for name in ["planted", "planted2", "planted3", "planted5"] {
        assert!(!bob.join(name).exists(), "{name} was made in bob's workspace");
    }
    assert!(!Path::new("/etc/planted4").exists());
    gw.stop().await;
}

/// A shared root above the data directory (`/`, which docs/configuration.md offers) serves nothing the
/// sandbox hides: not the gateway's secrets, not another user's home, not the configuration
/// file, not through a link either; the caller's own home stays reachable. The answer is the one
/// for a path outside the roots (the review's F12).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_above_the_data_directory_serves_nothing_the_sandbox_hides() {
    let config_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let config = config_dir.path().canonicalize().expect("canon").join("gw.toml");
    std::fs::write(&config, "[jwt]\nsecret = \"config-file-jwt-secret-0123456789abcdef\"\n").expect("config");
    let mut data = PathBuf::new();
    let gw = TestGateway::start(Db::Sqlite, |c| {
        data = c.data_dir.canonicalize().expect("data");
        c.workspace_roots = vec![String::from("/")];
        c.config_file = Some(config.clone());
    })
    .await;
    std::fs::write(data.join("secrets-key-planted"), "sealing key").expect("plant");
    let bob_home = gw.gw.agents.tenancy.home(Some("bob")).expect("bob's home");
    std::fs::write(bob_home.join("cred.json"), "bob's credentials").expect("plant");
    let alice_home = gw.gw.agents.tenancy.home(Some("alice")).expect("alice's home");
    std::fs::write(alice_home.join("mine.txt"), "alice's own").expect("write");
    symlink(data.join("secrets-key-planted"), alice_home.join("to-key")).expect("symlink");

    // With `/` as the root nothing is outside it: the answer a path outside the roots gets.
    let outside = json!({ "error": "this path is outside your workspace roots", "roots": ["/"] });
    for path in [
        p(&data.join("secrets-key-planted")),
        p(&data.join("gw.db")),
        p(&bob_home.join("cred.json")),
        p(&alice_home.join("to-key")),
        format!("{}/../bob/cred.json", p(&alice_home)),
        p(&config),
        // The host's own, which no sandbox shows (and a device is never opened).
        String::from("/proc/self/environ"),
        String::from("/dev/null"),
    ] {
        let (status, body) = get(&gw, "alice", "/api/fs/file", &[("path", &path)]).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
        assert_eq!(body, outside, "{path}: the answer for a path outside the roots");
    }
    for dir in [p(&data), p(&data.join("homes")), p(&bob_home)] {
        let (status, body) = get(&gw, "alice", "/api/fs/dirs", &[("path", &dir), ("hidden", "1")]).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{dir}: {body}");
        let (status, body) = mkdir(&gw, "alice", &format!("{dir}/planted")).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{dir}: {body}");
    }
    assert!(!bob_home.join("planted").exists());
    let (status, body) = get(
        &gw,
        "alice",
        "/api/fs/file",
        &[("path", &p(&alice_home.join("mine.txt")))],
    )
    .await;
    assert_eq!(
        (status, &body["text"]),
        (StatusCode::OK, &json!("alice's own")),
        "{body}"
    );
    let (status, _) = get(&gw, "alice", "/api/fs/file", &[("path", "/etc/hostname")]).await;
    assert_eq!(status, StatusCode::OK, "the rest of `/` is served");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_signed_in_callers_from_our_own_pages() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let alice = root(&gw, "alice");
    std::fs::write(alice.join("a.txt"), "a").expect("write");
    for (route, query) in [
        ("/api/fs/dirs", vec![]),
        ("/api/fs/file", vec![("path", p(&alice.join("a.txt")))]),
    ] {
        let res = http()
            .get(gw.http_url(route))
            .query(&query)
            .send()
            .await
            .expect("request");
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{route}");
        let res = http()
            .get(gw.http_url(route))
            .query(&query)
            .bearer_auth("not-a-jwt")
            .send()
            .await
            .expect("request");
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{route}");
    }
    let res = http()
        .post(gw.http_url("/api/fs/dirs"))
        .json(&json!({ "path": p(&alice.join("anon")) }))
        .send()
        .await
        .expect("request");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);

    // The web UI's cookie works from our own pages, not from another site's (CSRF).
    let cookie = format!("acp_gateway_token={}", gw.token("alice"));
    let ours = format!("http://{}", gw.addr);
    for (origin, want) in [
        (ours.as_str(), StatusCode::CREATED),
        ("http://evil.example", StatusCode::UNAUTHORIZED),
    ] {
        let dir = alice.join(format!("from-{}", origin.len()));
        let res = http()
            .post(gw.http_url("/api/fs/dirs"))
            .header("cookie", &cookie)
            .header("origin", origin)
            .json(&json!({ "path": p(&dir) }))
            .send()
            .await
            .expect("request");
        assert_eq!(res.status(), want, "Origin {origin}");
        assert_eq!(dir.exists(), want == StatusCode::CREATED, "Origin {origin}");
    }
    let res = http()
        .get(gw.http_url("/api/fs/dirs"))
        .header("cookie", &cookie)
        .header("sec-fetch-site", "cross-site")
        .send()
        .await
        .expect("request");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_folders_are_private_and_made_once() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let alice = root(&gw, "alice");
    let deep = alice.join("projects/new-app/src");
    let (status, body) = mkdir(&gw, "alice", &p(&deep)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body, json!({ "path": p(&deep) }));
    for dir in [alice.join("projects"), alice.join("projects/new-app"), deep.clone()] {
        let mode = std::fs::metadata(&dir).expect("made").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", dir.display());
    }
    let (status, _) = mkdir(&gw, "alice", &p(&deep)).await;
    assert_eq!(status, StatusCode::CONFLICT, "it exists now");
    std::fs::write(alice.join("file"), "x").expect("write");
    let (status, _) = mkdir(&gw, "alice", &p(&alice.join("file/sub"))).await;
    assert!(
        status == StatusCode::BAD_REQUEST || status == StatusCode::FORBIDDEN,
        "a file in the middle: {status}"
    );
    let (status, _) = mkdir(&gw, "alice", "relative/path").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let res = http()
        .post(gw.http_url("/api/fs/dirs"))
        .bearer_auth(gw.token("alice"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("request");
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    // The new folder is what the picker lists, and a session can start in it.
    let (_, listing) = get(&gw, "alice", "/api/fs/dirs", &[("path", &p(&alice.join("projects")))]).await;
    assert_eq!(names(&listing), ["new-app"]);
    let mut client = gw.client("alice").await;
    let r = client
        .request("session/new", json!({ "cwd": p(&deep), "mcpServers": [] }))
        .await;
    assert!(r["result"]["sessionId"].is_string(), "{r}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_files_are_read_binary_ones_refused_big_ones_cut() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let alice = root(&gw, "alice");
    std::fs::create_dir_all(alice.join("src")).expect("mkdir");
    let text = "fn main() {\n    println!(\"héllo\");\n}\n";
    std::fs::write(alice.join("src/main.rs"), text).expect("write");
    let (status, file) = get(
        &gw,
        "alice",
        "/api/fs/file",
        &[("path", &p(&alice.join("src/main.rs")))],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{file}");
    assert_eq!(
        file,
        json!({ "path": p(&alice.join("src/main.rs")), "text": text, "size": text.len(), "truncated": false })
    );
    // Through a link that stays inside: named by where it leads.
    symlink(alice.join("src/main.rs"), alice.join("main-link.rs")).expect("symlink");
    let (status, linked) = get(
        &gw,
        "alice",
        "/api/fs/file",
        &[("path", &p(&alice.join("main-link.rs")))],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(linked["path"], p(&alice.join("src/main.rs")));

    let mut binary = b"\x7fELF".to_vec();
    binary.extend([0u8; 64]);
    std::fs::write(alice.join("a.out"), &binary).expect("write");
    std::fs::write(alice.join("latin1.txt"), b"caf\xe9\n").expect("write");
    for name in ["a.out", "latin1.txt"] {
        let (status, body) = get(&gw, "alice", "/api/fs/file", &[("path", &p(&alice.join(name)))]).await;
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{name}: {body}");
    }

    // 1.5 MiB of text with a two-byte character across the 1 MiB mark: cut before it.
    let mib = 1 << 20;
    let mut big = "a".repeat(mib - 1);
    big.push('é');
    big.push_str(&"b".repeat(mib / 2));
    std::fs::write(alice.join("big.log"), &big).expect("write");
    let (status, cut) = get(&gw, "alice", "/api/fs/file", &[("path", &p(&alice.join("big.log")))]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(cut["truncated"], true);
    assert_eq!(cut["size"], big.len());
    let got = cut["text"].as_str().expect("text");
    assert_eq!(got.len(), mib - 1, "cut at a character boundary");
    assert!(big.starts_with(got));

    let (status, _) = get(&gw, "alice", "/api/fs/file", &[("path", &p(&alice.join("src")))]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "a directory");
    let (status, _) = get(&gw, "alice", "/api/fs/file", &[("path", &p(&alice.join("nope.rs")))]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = get(&gw, "alice", "/api/fs/file", &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "no path");
    nix_mkfifo(&alice.join("pipe"));
    let (status, _) = get(&gw, "alice", "/api/fs/file", &[("path", &p(&alice.join("pipe")))]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "a FIFO is not read (nor waited on)");
    gw.stop().await;
}

/// Makes a FIFO with `mkfifo(1)`.
fn nix_mkfifo(path: &Path) {
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo runs")
        .success();
    assert!(ok, "mkfifo {}", path.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_stops_at_a_thousand() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let alice = root(&gw, "alice");
    let many = alice.join("many");
    for i in 0..1005 {
        std::fs::create_dir_all(many.join(format!("d{i:04}"))).expect("mkdir");
    }
    let (status, listing) = get(&gw, "alice", "/api/fs/dirs", &[("path", &p(&many))]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listing["truncated"], true);
    let got = names(&listing);
    assert_eq!(got.len(), 1000);
    assert_eq!(got[0], "d0000");
    assert_eq!(got[999], "d0999", "the first thousand by name");
    gw.stop().await;
}

// ---- Session controls: what session/load and session/resume answer with ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_longer_than_the_kernels_are_refused_before_any_work() {
    let gw = TestGateway::start(Db::Sqlite, |_| {}).await;
    let alice = root(&gw, "alice");
    // A million components would cost the resolver and the folder walk minutes of CPU.
    let long = format!("{}{}", p(&alice), "/a".repeat(3000));
    let (status, body) = mkdir(&gw, "alice", &long).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = get(&gw, "alice", "/api/fs/dirs", &[("path", &long)]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let deep = format!("{}{}", p(&alice), "/b".repeat(40));
    let (status, body) = mkdir(&gw, "alice", &deep).await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "at most 32 new folders at once: {body}"
    );
    assert_eq!(std::fs::read_dir(&alice).expect("root").count(), 0, "nothing was made");
    let mut client = gw.client("alice").await;
    let r = client
        .request("session/new", json!({ "cwd": long, "mcpServers": [] }))
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    gw.stop().await;
}
