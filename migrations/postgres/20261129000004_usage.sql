-- What each person spends: agents' usage_update costs (cumulative per session) summed per user,
-- agent, UTC day and currency. usage_sessions keeps each session's last cumulative cost, so a
-- restart counts only what is new. The gateway's own work: the request role has no grant.
CREATE TABLE usage_daily (
    owner    TEXT             NOT NULL,
    agent    TEXT             NOT NULL,
    day      TEXT             NOT NULL,
    currency TEXT             NOT NULL,
    cost     DOUBLE PRECISION NOT NULL DEFAULT 0,
    updates  BIGINT           NOT NULL DEFAULT 0,
    PRIMARY KEY (owner, agent, day, currency)
);
ALTER TABLE usage_daily ENABLE ROW LEVEL SECURITY;
CREATE TABLE usage_sessions (
    session_id TEXT             PRIMARY KEY,
    currency   TEXT             NOT NULL,
    last_cost  DOUBLE PRECISION NOT NULL
);
ALTER TABLE usage_sessions ENABLE ROW LEVEL SECURITY;
