-- Archived sessions are hidden from the default session/list and can be restored (issue 21).
ALTER TABLE sessions ADD COLUMN archived_at INTEGER;

-- Retention finds the sessions not updated for N days, oldest first, across users.
CREATE INDEX sessions_updated ON sessions (updated_at);
