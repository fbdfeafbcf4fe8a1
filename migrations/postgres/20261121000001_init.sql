-- Sessions and their transcripts. Times are microseconds since the Unix epoch.
CREATE TABLE sessions (
    id               TEXT    PRIMARY KEY,
    owner            TEXT    NOT NULL,
    agent            TEXT    NOT NULL,
    agent_session_id TEXT,
    cwd              TEXT    NOT NULL,
    additional_dirs  TEXT    NOT NULL DEFAULT '[]',
    title            TEXT,
    meta             TEXT    NOT NULL DEFAULT '{}',
    message_count    BIGINT  NOT NULL DEFAULT 0,
    last_seq         BIGINT  NOT NULL DEFAULT 0,
    created_at       BIGINT  NOT NULL,
    updated_at       BIGINT  NOT NULL
);

-- session/list: one user's sessions, newest first, keyset-paginated on (updated_at, id).
CREATE INDEX sessions_owner_updated ON sessions (owner, updated_at DESC, id DESC);
CREATE INDEX sessions_owner_cwd_updated ON sessions (owner, cwd, updated_at DESC, id DESC);

-- The transcript, append-only: each row is a run of consecutive updates (seq_from..=seq_to),
-- one JSON object per line.
CREATE TABLE session_events (
    session_id TEXT   NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    seq_from   BIGINT NOT NULL,
    seq_to     BIGINT NOT NULL,
    payload    TEXT   NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (session_id, seq_from),
    CHECK (seq_to >= seq_from)
);

-- Values every replica shares (the key that signs list cursors).
CREATE TABLE gateway_settings (
    name  TEXT  PRIMARY KEY,
    value BYTEA NOT NULL
);
