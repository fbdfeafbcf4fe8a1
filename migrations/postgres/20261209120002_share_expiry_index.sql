-- Ended shares are purged in the background (every hour, by their end: `expires_at`), across
-- every session; without this index each pass would read the whole table.
CREATE INDEX session_shares_expires ON session_shares (expires_at) WHERE expires_at IS NOT NULL;
