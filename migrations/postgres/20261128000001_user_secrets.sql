-- Keys users give their agents (an agent's env_var sign-in methods), sealed by the gateway
-- (src/secrets.rs): the ciphertext, its nonce and the fingerprint of the key that sealed it.
-- Never the value itself. Only request work touches them, as the user they belong to: the
-- request role may read, write and delete the rows its signed identity names, nothing else.
CREATE TABLE user_secrets (
    owner      TEXT   NOT NULL,
    agent      TEXT   NOT NULL,
    name       TEXT   NOT NULL,
    key_id     TEXT   NOT NULL,
    nonce      BYTEA  NOT NULL,
    ciphertext BYTEA  NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (owner, agent, name)
);
ALTER TABLE user_secrets ENABLE ROW LEVEL SECURITY;
GRANT SELECT, INSERT, UPDATE, DELETE ON user_secrets TO acp_gateway_request;
CREATE POLICY user_secrets_owner ON user_secrets TO acp_gateway_request
    USING (owner = (SELECT request_owner()))
    WITH CHECK (owner = (SELECT request_owner()));
