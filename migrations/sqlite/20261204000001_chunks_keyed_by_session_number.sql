-- The transcript's chunks are keyed by their rowid, `(session number << 32) | seq_from`, and the
-- unique index on (session_id, seq_from) goes. Every commit an update waits on wrote two b-trees,
-- the table's and that index's: two leaf pages into the WAL, two seeks. Now it writes one, and a
-- session's chunks are one range of the rowid, in seq order. Measured: the gateway benchmark's
-- mean transcript commit, which every round trip waits on, 78.6-84.5 µs before and 57.1-60.6 µs
-- after (four alternated pairs on one host); SQLite's Python binding on the two schemas, one
-- 900 B chunk a commit, 28.7 to 21.8 µs median on another.
--
-- A session's number is a column of its own, not the sessions table's rowid: VACUUM may renumber
-- the rowids of a table without an INTEGER PRIMARY KEY, and the keys of its chunks must not move.
-- A new session takes the next number (a deleted session's chunks go with it, so a number used
-- again finds none).
ALTER TABLE sessions ADD COLUMN num INTEGER;
UPDATE sessions SET num = rowid;
CREATE UNIQUE INDEX sessions_num ON sessions (num);
CREATE TRIGGER sessions_number AFTER INSERT ON sessions WHEN NEW.num IS NULL
BEGIN
    UPDATE sessions SET num = (SELECT COALESCE(MAX(num), 0) + 1 FROM sessions) WHERE rowid = NEW.rowid;
END;

-- Same columns as before, with the key in front. The checks keep the key honest: a seq_from past
-- 32 bits would run into the next session's range, and is refused instead.
CREATE TABLE session_events_keyed (
    key        INTEGER PRIMARY KEY,
    session_id TEXT    NOT NULL,
    seq_from   INTEGER NOT NULL,
    seq_to     INTEGER NOT NULL,
    payload    TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    CHECK (seq_to >= seq_from),
    CHECK (seq_from BETWEEN 0 AND 4294967295 AND (key & 4294967295) = seq_from)
);

INSERT INTO session_events_keyed (key, session_id, seq_from, seq_to, payload, created_at)
    SELECT (s.num << 32) | e.seq_from, e.session_id, e.seq_from, e.seq_to, e.payload, e.created_at
    FROM session_events e JOIN sessions s ON s.id = e.session_id
    ORDER BY 1;

DROP TABLE session_events;

ALTER TABLE session_events_keyed RENAME TO session_events;

-- The foreign key's cascade would have to find a session's chunks without an index on
-- session_id (a scan of every transcript per deleted session): a trigger deletes its range
-- instead, whether or not the connection enforces foreign keys.
CREATE TRIGGER sessions_delete_chunks AFTER DELETE ON sessions
BEGIN
    DELETE FROM session_events WHERE key BETWEEN OLD.num << 32 AND (OLD.num << 32) | 4294967295;
END;
