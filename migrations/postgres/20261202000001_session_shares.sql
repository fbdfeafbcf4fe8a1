-- A session shared by its owner with a teammate: by name (`grantee`) or by link (`token_hash`, the
-- SHA-256 of a token shown once to the owner; the token itself is never stored). `role` is
-- `observer` (sees it, read-only) or `controller` (may also prompt and answer). A link share gains
-- members as people open it; deleting a share (revoking it) removes them with it. Times are
-- microseconds since the epoch; `expires_at` NULL never expires.
--
-- Who may reach a session through a share is the gateway's own check, made before it reads the
-- session as its owner: the request role has no grant on these tables.
CREATE TABLE session_shares (
    id          TEXT   PRIMARY KEY,
    session_id  TEXT   NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    owner       TEXT   NOT NULL,
    grantee     TEXT,
    token_hash  BYTEA  UNIQUE,
    role        TEXT   NOT NULL CHECK (role IN ('observer', 'controller')),
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT,
    CHECK ((grantee IS NULL) <> (token_hash IS NULL))
);
ALTER TABLE session_shares ENABLE ROW LEVEL SECURITY;
CREATE INDEX session_shares_session ON session_shares (session_id);
CREATE INDEX session_shares_grantee ON session_shares (grantee) WHERE grantee IS NOT NULL;

CREATE TABLE share_members (
    share_id   TEXT   NOT NULL REFERENCES session_shares (id) ON DELETE CASCADE,
    member     TEXT   NOT NULL,
    joined_at  BIGINT NOT NULL,
    PRIMARY KEY (share_id, member)
);
ALTER TABLE share_members ENABLE ROW LEVEL SECURITY;
CREATE INDEX share_members_member ON share_members (member);
