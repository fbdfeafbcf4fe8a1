-- Keys users give their agents (an agent's env_var sign-in methods), sealed by the gateway
-- (src/secrets.rs): the ciphertext, its nonce and the fingerprint of the key that sealed it.
-- Never the value itself.
CREATE TABLE user_secrets (
    owner      TEXT    NOT NULL,
    agent      TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    key_id     TEXT    NOT NULL,
    nonce      BLOB    NOT NULL,
    ciphertext BLOB    NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (owner, agent, name)
) WITHOUT ROWID;
