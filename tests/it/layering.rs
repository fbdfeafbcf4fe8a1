//! The house's layering, held by a test (docs/architecture.md, "Layers"): every `crate::` path in
//! `src/` points down the core, or from a feature down into the core, or from the top (state,
//! connection, routes, start-up) down, never up and never sideways between features. What main still breaks is listed by name in [`DEBT`]; a new break fails this
//! test, and so does a listed one that is gone (the list only shrinks).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The core's layers, bottom first: each may use those before it.
const CORE: [&str; 6] = ["protocol", "infra", "store", "tenancy", "agents", "session"];
/// The features: each may use the core, none another feature or anything on top.
const FEATURES: [&str; 11] = [
    "audit",
    "editor",
    "export",
    "identity",
    "push",
    "replica",
    "retention",
    "settings",
    "sharing",
    "signin",
    "usage",
];
/// On top of the features, bottom first: the state handlers reach, one connection, the routes,
/// start-up, the command line.
const TOP: [&str; 5] = ["gateway", "connection", "http", "app", "cli"];

/// Edges that break the layering today (area → area), named in the architecture review of
/// f4e9437 or found by this test when it was written. Remove an entry when its edge is gone.
const DEBT: &[(&str, &str)] = &[];

/// The area of a file under `src/`: its top module (`lib.rs` and `main.rs` are none).
fn area_of(path: &Path) -> Option<String> {
    let rel = path.strip_prefix(src()).ok()?;
    let first = rel.iter().next()?.to_string_lossy().trim_end_matches(".rs").to_string();
    (first != "lib" && first != "main").then_some(first)
}

/// The area a `crate::…` path names: its first segment.
fn area_named(path: &str) -> String {
    path.split("::").next().unwrap_or_default().to_string()
}

/// How high an area sits (the features share one rank, between the core and the top).
fn rank(area: &str) -> usize {
    if let Some(i) = CORE.iter().position(|a| *a == area) {
        i
    } else if FEATURES.contains(&area) {
        CORE.len()
    } else if let Some(i) = TOP.iter().position(|a| *a == area) {
        CORE.len() + 1 + i
    } else {
        panic!("src/{area} is in no layer: add it to CORE, FEATURES or TOP (docs/architecture.md)")
    }
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every (from, to) area edge in `src/`, with a file that makes it.
fn edges() -> Vec<(String, String, PathBuf)> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut found = Vec::new();
    for file in files {
        let Some(from) = area_of(&file) else { continue };
        let text = std::fs::read_to_string(&file).expect("read");
        for (at, _) in text.match_indices("crate::") {
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
                continue;
            }
            let rest: String = text[at + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let to = area_named(&rest);
            if to.is_empty() || to == from {
                continue;
            }
            found.push((from.clone(), to, file.clone()));
        }
    }
    found
}

fn allowed(from: &str, to: &str) -> bool {
    let (f, t) = (rank(from), rank(to));
    t < f && !(FEATURES.contains(&from) && FEATURES.contains(&to))
}

#[test]
fn imports_point_down_the_core_and_never_sideways_between_features() {
    let edges = edges();
    assert!(edges.len() > 100, "the scan found the imports ({} edges)", edges.len());
    let debt: BTreeSet<(&str, &str)> = DEBT.iter().copied().collect();
    let mut broken = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for (from, to, file) in &edges {
        if allowed(from, to) {
            continue;
        }
        if debt.contains(&(from.as_str(), to.as_str())) {
            seen.insert((from.clone(), to.clone()));
        } else {
            broken.insert(format!("{from} -> {to} ({})", file.display()));
        }
    }
    assert!(
        broken.is_empty(),
        "imports that point up or sideways:\n{}",
        Vec::from_iter(broken).join("\n")
    );
    let gone: Vec<_> = debt
        .iter()
        .filter(|(f, t)| !seen.contains(&(f.to_string(), t.to_string())))
        .collect();
    assert!(
        gone.is_empty(),
        "edges listed in DEBT that no longer exist (remove them): {gone:?}"
    );
}

#[test]
fn the_rule_itself_holds_what_the_review_asks() {
    assert!(allowed("session", "store"));
    assert!(allowed("sharing", "session"));
    assert!(allowed("http", "push"));
    assert!(allowed("connection", "gateway"));
    assert!(!allowed("store", "identity"), "the store imports no identity");
    assert!(!allowed("store", "session"), "nor anything above it");
    assert!(!allowed("session", "push"), "sessions import no feature");
    assert!(!allowed("agents", "usage"), "the pool imports no feature");
    assert!(!allowed("push", "settings"), "no feature reaches sideways");
    assert!(!allowed("retention", "gateway"), "no feature takes the server state");
}
