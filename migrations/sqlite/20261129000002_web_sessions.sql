-- People signed in through the identity provider (OpenID Connect): one row per sign-in, named by
-- the `sid` in the gateway's cookie. `sealed` holds the provider's refresh and ID tokens, sealed by
-- the gateway (src/secrets.rs); it is used to check the person again every oidc.recheck_secs. A
-- revoked row ends the sign-in on every replica.
CREATE TABLE web_sessions (
    id             TEXT    PRIMARY KEY NOT NULL,
    owner          TEXT    NOT NULL,
    key_id         TEXT    NOT NULL,
    nonce          BLOB    NOT NULL,
    sealed         BLOB    NOT NULL,
    created_at     INTEGER NOT NULL,
    expires_at     INTEGER NOT NULL,
    checked_at     INTEGER NOT NULL,
    revoked_at     INTEGER,
    revoked_reason TEXT
) WITHOUT ROWID;
CREATE INDEX web_sessions_due ON web_sessions (checked_at) WHERE revoked_at IS NULL;
