//! Where `acp-gateway login` keeps a machine's tokens: `acp-gateway/tokens.json` in the user's
//! config directory (`$XDG_CONFIG_HOME`, else `~/.config`), mode `0600`, one per gateway base URL.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::Context;

/// The tokens file.
pub fn path() -> anyhow::Result<PathBuf> {
    let config = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => {
            PathBuf::from(std::env::var_os("HOME").context("neither XDG_CONFIG_HOME nor HOME is set")?).join(".config")
        }
    };
    Ok(config.join("acp-gateway").join("tokens.json"))
}

/// The key a base URL's token is kept under: scheme, host and port, without a trailing slash.
fn key(base: &url::Url) -> String {
    base.as_str().trim_end_matches('/').to_string()
}

/// The token kept for `base`, if there is one.
pub fn stored(base: &url::Url) -> anyhow::Result<Option<String>> {
    Ok(read_all(&path()?)?.remove(&key(base)))
}

fn read_all(path: &std::path::Path) -> anyhow::Result<HashMap<String, String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            serde_json::from_str(&text).with_context(|| format!("{} is not a JSON object of tokens", path.display()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(HashMap::new()),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Writes the tokens file: its directory `0700`, the file `0600` from its first byte (written
/// beside it and renamed over it).
fn write_all(path: &std::path::Path, tokens: &HashMap<String, String>) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir = path.parent().context("the tokens file has no directory")?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    let tmp = path.with_extension("json.tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    file.write_all(serde_json::to_string_pretty(tokens)?.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// Keeps `token` for `base`.
pub fn save(base: &url::Url, token: &str) -> anyhow::Result<()> {
    let path = path()?;
    let mut tokens = read_all(&path)?;
    tokens.insert(key(base), token.to_string());
    write_all(&path, &tokens)
}

/// Forgets the token for `base`.
pub fn forget(base: &url::Url) -> anyhow::Result<()> {
    let path = path()?;
    let mut tokens = read_all(&path)?;
    if tokens.remove(&key(base)).is_some() {
        write_all(&path, &tokens)?;
    }
    Ok(())
}

/// The base URLs a token is kept for.
pub fn urls() -> anyhow::Result<Vec<url::Url>> {
    let mut urls: Vec<url::Url> = read_all(&path()?)?
        .keys()
        .filter_map(|k| url::Url::parse(k).ok())
        .collect();
    urls.sort();
    Ok(urls)
}
