-- Archived sessions are hidden from the default session/list and can be restored (issue 21).
ALTER TABLE sessions ADD COLUMN archived_at BIGINT;

-- Retention finds the sessions not updated for N days, oldest first, across users.
CREATE INDEX sessions_updated ON sessions (updated_at);

-- Its owner archives and restores a session (row-level security admits only their rows); the
-- rest of the row stays the transcript writer's.
GRANT UPDATE (archived_at) ON sessions TO acp_gateway_request;
