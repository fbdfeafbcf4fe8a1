-- A stored chunk advances its session's last_seq and updated_at in the same statement, so the
-- transcript writer's common case (updates only, no new title or message) is one statement and
-- needs no explicit transaction: one round trip to SQLite per commit instead of four.
CREATE TRIGGER session_events_advance_session AFTER INSERT ON session_events
BEGIN
    UPDATE sessions SET
        last_seq = MAX(last_seq, NEW.seq_to),
        updated_at = MAX(updated_at, NEW.created_at)
    WHERE id = NEW.session_id;
END;
