-- People signed in through the identity provider (OpenID Connect): one row per sign-in, named by
-- the `sid` in the gateway's cookie. `sealed` holds the provider's refresh and ID tokens, sealed by
-- the gateway (src/secrets.rs); it is used to check the person again every oidc.recheck_secs. A
-- revoked row ends the sign-in on every replica. The gateway's own work only: the request role
-- has no grant on it.
CREATE TABLE web_sessions (
    id             TEXT   PRIMARY KEY,
    owner          TEXT   NOT NULL,
    key_id         TEXT   NOT NULL,
    nonce          BYTEA  NOT NULL,
    sealed         BYTEA  NOT NULL,
    created_at     BIGINT NOT NULL,
    expires_at     BIGINT NOT NULL,
    checked_at     BIGINT NOT NULL,
    revoked_at     BIGINT,
    revoked_reason TEXT
);
ALTER TABLE web_sessions ENABLE ROW LEVEL SECURITY;
CREATE INDEX web_sessions_due ON web_sessions (checked_at) WHERE revoked_at IS NULL;
