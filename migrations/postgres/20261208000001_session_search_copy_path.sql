-- session_search_copy() runs as the tables' owner (SECURITY DEFINER) whoever changes `sessions`.
-- Its search path was the one current when it was made, with pg_temp searched first for
-- relations: a session of the request role (which inserts and deletes `sessions`, and may create
-- temporary tables) could put a temporary `session_search` in front of ours and have the owner's
-- trigger write into it. Now, as request_owner() does: pg_catalog, then pg_temp named last, and
-- our table named with its schema.
DO $do$
DECLARE
    s name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE c.oid = 'session_search'::regclass);
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION %1$I.session_search_copy() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        AS $body$
        BEGIN
            IF TG_OP = 'INSERT' THEN
                INSERT INTO %1$I.session_search (id, owner, title, meta) VALUES (NEW.id, NEW.owner, NEW.title, NEW.meta);
            ELSIF TG_OP = 'UPDATE' THEN
                UPDATE %1$I.session_search SET title = NEW.title, meta = NEW.meta WHERE id = NEW.id;
            ELSE
                DELETE FROM %1$I.session_search WHERE id = OLD.id;
            END IF;
            RETURN NULL;
        END $body$
    $f$, s);
END
$do$;
