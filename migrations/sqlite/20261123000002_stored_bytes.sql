-- Each session's stored transcript bytes, for the per-user cap on them: the trigger that advances
-- a session when one of its chunks is stored now also adds the chunk's payload bytes, in the same
-- statement, and a user's total is a sum over their sessions (Store::stored_bytes), not over
-- their events. A deleted session's bytes go with its row. Chunks are never deleted on their own.
ALTER TABLE sessions ADD COLUMN stored_bytes INTEGER NOT NULL DEFAULT 0;

-- octet_length: bytes of the UTF-8 text, read from the record header (the payload is not loaded).
UPDATE sessions SET stored_bytes = (
    SELECT sum(octet_length(payload)) FROM session_events WHERE session_id = sessions.id
)
WHERE id IN (SELECT session_id FROM session_events);

DROP TRIGGER session_events_advance_session;
CREATE TRIGGER session_events_advance_session AFTER INSERT ON session_events
BEGIN
    UPDATE sessions SET
        last_seq = MAX(last_seq, NEW.seq_to),
        updated_at = MAX(updated_at, NEW.created_at),
        stored_bytes = stored_bytes + octet_length(NEW.payload)
    WHERE id = NEW.session_id;
END;
