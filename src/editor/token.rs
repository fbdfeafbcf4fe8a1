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
    let path = path()?;
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let tokens: HashMap<String, String> =
        serde_json::from_str(&text).with_context(|| format!("{} is not a JSON object of tokens", path.display()))?;
    Ok(tokens.get(&key(base)).cloned())
}
