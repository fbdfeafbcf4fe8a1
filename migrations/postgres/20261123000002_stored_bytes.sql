-- Each session's stored transcript bytes, for the per-user cap on them: the transcript writer's
-- UPDATE that advances a session's last_seq when it stores a chunk also adds the chunk's payload
-- bytes (src/store/sql.rs, write_batch), and a user's total is a sum over their sessions
-- (Store::stored_bytes), not over their events. A deleted session's bytes go with its row.
-- Chunks are never deleted on their own.

-- The backfill reads every user's rows (FORCE row-level security applies to the owner, too).
SELECT set_config('acp_gateway.system', 'on', true);

-- A constant default: no table rewrite.
ALTER TABLE sessions ADD COLUMN stored_bytes BIGINT NOT NULL DEFAULT 0;

UPDATE sessions s SET stored_bytes = e.bytes
FROM (
    SELECT session_id, sum(octet_length(payload)) AS bytes FROM session_events GROUP BY session_id
) e
WHERE e.session_id = s.id;
