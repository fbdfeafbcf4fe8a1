-- session/list's `search` (a case-insensitive substring of the title or the metadata) through a
-- trigram index instead of a LIKE over every one of the user's sessions.
--
-- An FTS5 table with the trigram tokenizer indexes every run of three characters (case-folded) of
-- each session's title and meta. A quoted phrase of three or more characters then finds the rows
-- that contain it as a substring, whatever their owner; the list query keeps its LIKE as the exact
-- test and its owner condition (src/store/sql.rs, list_query). Shorter searches cannot use it.
--
-- External content: the table stores only the index; the text stays in `sessions`, and the
-- triggers below keep the two in step, keyed by the sessions' rowid (`id` is a TEXT key, so rowid
-- is implicit; VACUUM keeps it, as it copies rows with their rowids). If the index is ever out of
-- step, INSERT INTO session_search(session_search) VALUES ('rebuild') rebuilds it from `sessions`.
CREATE VIRTUAL TABLE session_search USING fts5(
    title,
    meta,
    content = 'sessions',
    content_rowid = 'rowid',
    tokenize = 'trigram',
    -- No per-row token counts: they only serve ranking (bm25), which the list never uses.
    columnsize = 0
);

CREATE TRIGGER session_search_insert AFTER INSERT ON sessions
BEGIN
    INSERT INTO session_search (rowid, title, meta) VALUES (NEW.rowid, NEW.title, NEW.meta);
END;

CREATE TRIGGER session_search_delete AFTER DELETE ON sessions
BEGIN
    INSERT INTO session_search (session_search, rowid, title, meta) VALUES ('delete', OLD.rowid, OLD.title, OLD.meta);
END;

-- The transcript writer names `title` in every metadata UPDATE (COALESCE keeps it as it is), so
-- the index is only touched when a value really changes.
CREATE TRIGGER session_search_update AFTER UPDATE OF title, meta ON sessions
WHEN OLD.title IS NOT NEW.title OR OLD.meta IS NOT NEW.meta
BEGIN
    INSERT INTO session_search (session_search, rowid, title, meta) VALUES ('delete', OLD.rowid, OLD.title, OLD.meta);
    INSERT INTO session_search (rowid, title, meta) VALUES (NEW.rowid, NEW.title, NEW.meta);
END;

-- Sessions stored before this migration.
INSERT INTO session_search (session_search) VALUES ('rebuild');
