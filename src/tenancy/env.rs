//! Which environment variables a value that did not come from the operator may set: a user's
//! stored keys, a sign-in method's `env`. The gateway sets some itself (the contract's
//! "Tenancy"); others change what programs load and run.

/// Variables no user value may set: the gateway sets them itself (the contract's "Tenancy"), or
/// they change what the agent's programs load and run.
pub const RESERVED: [&str; 9] = [
    "PATH", "HOME", "USER", "TMPDIR", "LANG", "LC_ALL", "TERM", "TZ", "SHELL",
];

/// Whether a user may set `name`: an environment variable's usual spelling (`[A-Z_][A-Z0-9_]*`,
/// at most 128 bytes), not reserved, not one of the dynamic loader's.
pub fn user_may_set(name: &str) -> bool {
    let mut chars = name.chars();
    let first = chars.next();
    first.is_some_and(|c| c.is_ascii_uppercase() || c == '_')
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        && name.len() <= 128
        && !RESERVED.contains(&name)
        && !name.starts_with("LD_")
        && !name.starts_with("ACP_GATEWAY_")
        && name != "DATABASE_URL"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_unreserved_names_may_be_set() {
        for ok in ["OPENAI_API_KEY", "CODEX_API_KEY", "_X", "A1"] {
            assert!(user_may_set(ok), "{ok}");
        }
        for bad in [
            "",
            "PATH",
            "HOME",
            "LD_PRELOAD",
            "ACP_GATEWAY_JWT_SECRET",
            "DATABASE_URL",
            "a",
            "1A",
            "A-B",
            "A=B",
        ] {
            assert!(!user_may_set(bad), "{bad}");
        }
    }
}
