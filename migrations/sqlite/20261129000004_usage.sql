-- What each person spends: agents' usage_update costs (cumulative per session) summed per user,
-- agent, UTC day and currency. usage_sessions keeps each session's last cumulative cost, so a
-- restart counts only what is new.
CREATE TABLE usage_daily (
    owner    TEXT    NOT NULL,
    agent    TEXT    NOT NULL,
    day      TEXT    NOT NULL,
    currency TEXT    NOT NULL,
    cost     REAL    NOT NULL DEFAULT 0,
    updates  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (owner, agent, day, currency)
) WITHOUT ROWID;
CREATE TABLE usage_sessions (
    session_id TEXT PRIMARY KEY NOT NULL,
    currency   TEXT NOT NULL,
    last_cost  REAL NOT NULL
) WITHOUT ROWID;
