-- session/list's `search` (a case-insensitive substring of the title or the metadata) through
-- pg_trgm indexes instead of an ILIKE over every one of the user's sessions.
--
-- Why a copy of title and meta, and not indexes on `sessions`: `sessions` has FORCEd row-level
-- security, and Postgres only uses an index for a user's condition when its operator is
-- LEAKPROOF, or the policy's own condition would run after it. ILIKE (texticlike) is not, and
-- only a superuser can mark a function LEAKPROOF. So under the policy an index on sessions.title
-- is never used (measured: the planner reads all 100,000 of a user's rows either way).
-- `session_search` has row-level security ENABLEd but not FORCEd: its owner, the gateway's
-- role, reads it directly and the indexes work; any other role sees only what the policy lets
-- it. The list query takes only ids from it (`id IN (SELECT id FROM session_search ...)`); the
-- rows it returns still come from `sessions`, under its policy.
--
-- The copy is kept by triggers in the same transaction as each change to `sessions`, so it is
-- exact. Without pg_trgm (not installed, or this role may not create it) the table and triggers
-- still exist but the indexes do not, and searches scan each user's sessions as before; the
-- gateway says so at start-up. To add the indexes later, as a role that may:
--     CREATE EXTENSION pg_trgm;
--     CREATE INDEX session_search_title_trgm ON session_search USING gin (title gin_trgm_ops);
--     CREATE INDEX session_search_meta_trgm ON session_search USING gin (meta gin_trgm_ops);
-- and restart the gateway.

-- The backfill below reads every user's sessions (FORCE applies to the owner, too).
SELECT set_config('acp_gateway.system', 'on', true);

CREATE TABLE session_search (
    id    TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    title TEXT,
    meta  TEXT NOT NULL
);

ALTER TABLE session_search ENABLE ROW LEVEL SECURITY;
CREATE POLICY session_search_owner ON session_search
    USING (
        current_setting('acp_gateway.system', true) = 'on'
        OR owner = NULLIF(current_setting('acp_gateway.user', true), '')
    )
    WITH CHECK (
        current_setting('acp_gateway.system', true) = 'on'
        OR owner = NULLIF(current_setting('acp_gateway.user', true), '')
    );

-- SECURITY DEFINER: the copy is written as the table owner whoever changes `sessions` (a role
-- granted rights on `sessions` alone still can); it only ever copies the changed row.
CREATE FUNCTION session_search_copy() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO session_search (id, owner, title, meta) VALUES (NEW.id, NEW.owner, NEW.title, NEW.meta);
    ELSIF TG_OP = 'UPDATE' THEN
        UPDATE session_search SET title = NEW.title, meta = NEW.meta WHERE id = NEW.id;
    ELSE
        DELETE FROM session_search WHERE id = OLD.id;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER session_search_insert AFTER INSERT ON sessions
    FOR EACH ROW EXECUTE FUNCTION session_search_copy();
-- The transcript writer names `title` in every metadata UPDATE (COALESCE keeps it as it is), so
-- the copy is only touched when a value really changes.
CREATE TRIGGER session_search_update AFTER UPDATE OF title, meta ON sessions
    FOR EACH ROW WHEN (OLD.title IS DISTINCT FROM NEW.title OR OLD.meta IS DISTINCT FROM NEW.meta)
    EXECUTE FUNCTION session_search_copy();
CREATE TRIGGER session_search_delete AFTER DELETE ON sessions
    FOR EACH ROW EXECUTE FUNCTION session_search_copy();

INSERT INTO session_search (id, owner, title, meta) SELECT id, owner, title, meta FROM sessions;

-- pg_trgm is a trusted extension (Postgres 13+): a role with CREATE on the database may add it.
-- When it cannot be created, carry on without the indexes rather than fail start-up.
DO $$
BEGIN
    CREATE EXTENSION IF NOT EXISTS pg_trgm;
EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'pg_trgm is not available (%): session/list searches will scan each user''s sessions', SQLERRM;
END $$;

-- Wherever pg_trgm lives (it may be in a schema not on the search path).
DO $$
DECLARE
    trgm name;
BEGIN
    SELECT n.nspname INTO trgm
    FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
    WHERE e.extname = 'pg_trgm';
    IF trgm IS NOT NULL THEN
        EXECUTE format('CREATE INDEX session_search_title_trgm ON session_search USING gin (title %I.gin_trgm_ops)', trgm);
        EXECUTE format('CREATE INDEX session_search_meta_trgm ON session_search USING gin (meta %I.gin_trgm_ops)', trgm);
    END IF;
END $$;

ANALYZE session_search;
