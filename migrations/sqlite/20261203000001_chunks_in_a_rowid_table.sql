-- The transcript's chunks move from a WITHOUT ROWID table to a rowid table with a unique index on
-- (session_id, seq_from). A WITHOUT ROWID table keeps each whole row in its primary key's b-tree,
-- and a chunk (a run of updates, kilobytes to megabytes) spills into overflow pages there: every
-- insert's seek through that b-tree read the whole payload of each cell it compared against
-- (SQLite reads an index cell's overflow before comparing keys), so a stream's commit read back
-- tens of kilobytes of earlier chunks from disk (measured: a third of the SQLite writer's time,
-- 4% of the gateway's CPU while streaming). SQLite's own advice: WITHOUT ROWID only for rows well
-- under a twentieth of a page. Now the index holds only the keys, and a chunk's row is appended.
-- Same columns, same uniqueness (the writer's ON CONFLICT (session_id, seq_from)), same cascade.
CREATE TABLE session_events_rows (
    session_id TEXT    NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    seq_from   INTEGER NOT NULL,
    seq_to     INTEGER NOT NULL,
    payload    TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    CHECK (seq_to >= seq_from)
);

INSERT INTO session_events_rows (session_id, seq_from, seq_to, payload, created_at)
    SELECT session_id, seq_from, seq_to, payload, created_at FROM session_events ORDER BY session_id, seq_from;

DROP TABLE session_events;

ALTER TABLE session_events_rows RENAME TO session_events;

CREATE UNIQUE INDEX session_events_session_seq ON session_events (session_id, seq_from);
