-- A session shared by its owner with a teammate: by name (`grantee`) or by link (`token_hash`, the
-- SHA-256 of a token shown once to the owner; the token itself is never stored). `role` is
-- `observer` (sees it, read-only) or `controller` (may also prompt and answer). A link share gains
-- members as people open it; deleting a share (revoking it) removes them with it. Times are
-- microseconds since the epoch; `expires_at` NULL never expires.
CREATE TABLE session_shares (
    id          TEXT    PRIMARY KEY,
    session_id  TEXT    NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    owner       TEXT    NOT NULL,
    grantee     TEXT,
    token_hash  BLOB    UNIQUE,
    role        TEXT    NOT NULL CHECK (role IN ('observer', 'controller')),
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER,
    CHECK ((grantee IS NULL) <> (token_hash IS NULL))
);
CREATE INDEX session_shares_session ON session_shares (session_id);
CREATE INDEX session_shares_grantee ON session_shares (grantee) WHERE grantee IS NOT NULL;

CREATE TABLE share_members (
    share_id   TEXT    NOT NULL REFERENCES session_shares (id) ON DELETE CASCADE,
    member     TEXT    NOT NULL,
    joined_at  INTEGER NOT NULL,
    PRIMARY KEY (share_id, member)
);
CREATE INDEX share_members_member ON share_members (member);
