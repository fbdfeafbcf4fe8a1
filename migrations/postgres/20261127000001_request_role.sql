-- Row-level security as a real second wall (README "Postgres roles and row-level security").
--
-- Until now the gateway's login role owned the tables with FORCEd row-level security, and the
-- policies let a transaction see whichever user it named in `acp_gateway.user`, or everything
-- when it set `acp_gateway.system`: settings any statement may set. That caught a query that
-- forgot its owner condition, nothing more.
--
-- From here on:
-- - Request work (what the gateway does for one user: create, get, list, delete a session, read
--   its transcript, sum its stored bytes) runs as `acp_gateway_request`: no login, not a
--   superuser, no BYPASSRLS, owns nothing, inherits nothing, and may only read, insert and delete
--   sessions and read transcripts. Its policies admit the owner named by a *signed* identity:
--       acp_gateway.user = <hex HMAC-SHA256(key, owner)> ':' <owner>
--   keyed with a random key of this database in `request_identity_key`, which only the tables'
--   owner can read. A statement that names another user without the key's signature names
--   nobody: it sees no row and can write none.
-- - System work (the transcript writer, leases, replica messages and watchers, the cursor key,
--   migrations) runs as the login role, the tables' owner. Row-level security no longer applies
--   to the owner (NO FORCE), so system work sets nothing, and `acp_gateway.system` means nothing.
--
-- The gateway switches to the request role at the start of each request transaction
-- (`set_config('role', 'acp_gateway_request', true)`), so its login role must be a member. This
-- migration creates the role when it may (CREATEROLE or superuser); otherwise an operator creates
-- it once per cluster, as the error below says. Roles belong to the cluster: gateways on several
-- databases of one cluster share the role, each database with its own key.

-- The request role. Several databases of one cluster may migrate at once (the tests do): a
-- concurrent CREATE ROLE fails with duplicate_object or unique_violation, and the role exists.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'acp_gateway_request') THEN
        BEGIN
            CREATE ROLE acp_gateway_request NOLOGIN NOSUPERUSER NOBYPASSRLS NOINHERIT;
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN NULL;
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION '%', format('role acp_gateway_request does not exist and %I may not create it. '
                    'As a superuser, run once per cluster: CREATE ROLE acp_gateway_request NOLOGIN NOSUPERUSER '
                    'NOBYPASSRLS NOINHERIT; GRANT acp_gateway_request TO %I; then start the gateway again',
                    current_user, current_user);
        END;
    END IF;
END $$;

-- The login role must be able to switch to it. A superuser could without membership; it is
-- granted anyway, so that the gateway keeps working if the role stops being a superuser.
DO $$
DECLARE
    member boolean;
BEGIN
    SELECT CASE WHEN r.rolsuper THEN
               EXISTS (SELECT 1 FROM pg_auth_members m
                       WHERE m.roleid = 'acp_gateway_request'::regrole AND m.member = r.oid)
           ELSE pg_has_role(current_user, 'acp_gateway_request', 'MEMBER') END
    INTO member
    FROM pg_roles r WHERE r.rolname = current_user;
    IF NOT member THEN
        BEGIN
            EXECUTE format('GRANT acp_gateway_request TO %I', current_user);
        EXCEPTION
            -- Granted meanwhile by a concurrent migration of another database.
            WHEN duplicate_object OR unique_violation THEN NULL;
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION '%', format('%I is not a member of role acp_gateway_request and may not make '
                    'itself one. As a superuser, run: GRANT acp_gateway_request TO %I; then start the gateway again',
                    current_user, current_user);
        END;
    END IF;
END $$;

-- The key identities are signed with: 32 bytes from pg_strong_random (four random UUIDs, 488
-- random bits, hashed), stored with HMAC's inner and outer pads already applied (key XOR 0x36…,
-- key XOR 0x5c…, 64 bytes each) so that checking a signature is two sha256 calls. The gateway
-- reads `key`; nobody but the tables' owner (and superusers) can read this table. To change the
-- key, replace the row (the same way) and restart every replica.
CREATE TABLE request_identity_key (
    only_row  BOOLEAN PRIMARY KEY DEFAULT true CHECK (only_row),
    key       BYTEA   NOT NULL,
    inner_pad BYTEA   NOT NULL,
    outer_pad BYTEA   NOT NULL
);
ALTER TABLE request_identity_key ENABLE ROW LEVEL SECURITY;
REVOKE ALL ON request_identity_key FROM PUBLIC;

DO $$
DECLARE
    k    bytea := sha256(convert_to(gen_random_uuid()::text || gen_random_uuid()::text
                                    || gen_random_uuid()::text || gen_random_uuid()::text, 'UTF8'));
    ipad bytea := decode(repeat('36', 64), 'hex');
    opad bytea := decode(repeat('5c', 64), 'hex');
BEGIN
    FOR i IN 0 .. length(k) - 1 LOOP
        ipad := set_byte(ipad, i, get_byte(ipad, i) # get_byte(k, i));
        opad := set_byte(opad, i, get_byte(opad, i) # get_byte(k, i));
    END LOOP;
    INSERT INTO request_identity_key (key, inner_pad, outer_pad) VALUES (k, ipad, opad);
END $$;

-- request_owner(): the owner named by this transaction's `acp_gateway.user` if its signature is
-- right, else NULL. SECURITY DEFINER (it runs as the tables' owner) so that the request role can
-- check signatures without reading the key. Its search path is pg_catalog then pg_temp, and the
-- key table is named with its schema: with any other path a caller could put a function or a
-- temporary table of its own in front of ours (pg_temp comes first unless it is named last).
-- Everything it calls is in pg_catalog, present since Postgres 11. PL/pgSQL, not SQL: a session
-- keeps its plan, where an SQL function with SET is planned again in every statement (measured:
-- about 15 µs a call instead of 80).
DO $do$
DECLARE
    s name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE c.oid = 'request_identity_key'::regclass);
BEGIN
    EXECUTE format($f$
        CREATE FUNCTION %1$I.request_owner() RETURNS text
        LANGUAGE plpgsql STABLE SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        AS $body$
        DECLARE
            claim text := current_setting('acp_gateway.user', true);
            ipad  bytea;
            opad  bytea;
        BEGIN
            IF claim IS NULL OR length(claim) <= 65 OR substr(claim, 65, 1) <> ':' THEN
                RETURN NULL;
            END IF;
            SELECT k.inner_pad, k.outer_pad INTO ipad, opad FROM %1$I.request_identity_key k;
            IF substr(claim, 1, 64) = encode(sha256(opad
                    || sha256(ipad || convert_to(substr(claim, 66), 'UTF8'))), 'hex') THEN
                RETURN substr(claim, 66);
            END IF;
            RETURN NULL;
        END
        $body$$f$, s);
    EXECUTE format('REVOKE ALL ON FUNCTION %I.request_owner() FROM PUBLIC', s);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %I.request_owner() TO acp_gateway_request', s);
    -- The tables live in this schema; with Postgres 15's defaults PUBLIC may use `public`, but an
    -- operator's own schema may not be open to everyone.
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO acp_gateway_request', s);
END $do$;

-- The old policies go, and row-level security no longer applies to the owner. ENABLE stays on
-- every table: a role that is neither the owner nor the request role sees nothing even if it is
-- granted a table (there is no policy for it).
DROP POLICY sessions_owner ON sessions;
DROP POLICY session_events_owner ON session_events;
DROP POLICY session_search_owner ON session_search;
DROP POLICY gateway_settings_system ON gateway_settings;
DROP POLICY session_leases_system ON session_leases;
DROP POLICY replica_messages_system ON replica_messages;
DROP POLICY session_watchers_system ON session_watchers;
ALTER TABLE sessions NO FORCE ROW LEVEL SECURITY;
ALTER TABLE session_events NO FORCE ROW LEVEL SECURITY;
ALTER TABLE gateway_settings NO FORCE ROW LEVEL SECURITY;
ALTER TABLE session_leases NO FORCE ROW LEVEL SECURITY;
ALTER TABLE replica_messages NO FORCE ROW LEVEL SECURITY;
ALTER TABLE session_watchers NO FORCE ROW LEVEL SECURITY;

-- What request work needs, and no more: no UPDATE (only the transcript writer changes a
-- session), no counters or stored bytes in an INSERT, nothing of session_search (searches that
-- start from its index run as system work: src/store/postgres.rs says why), the settings, the
-- key, leases or replica tables. A session's transcript, lease and watcher rows go with it by
-- ON DELETE CASCADE, which Postgres runs as the tables' owner; session_search's copy is kept by
-- its SECURITY DEFINER triggers.
REVOKE ALL ON sessions, session_events, session_search, gateway_settings, session_leases,
              replica_messages, session_watchers FROM acp_gateway_request;
GRANT SELECT, DELETE ON sessions TO acp_gateway_request;
GRANT INSERT (id, owner, agent, agent_session_id, cwd, additional_dirs, meta, created_at, updated_at)
    ON sessions TO acp_gateway_request;
GRANT SELECT ON session_events TO acp_gateway_request;

-- The sub-select makes request_owner() an InitPlan: checked once per statement, and the
-- owner comparison can use the owner indexes as before. FOR ALL, so that a privilege granted
-- later is walled too.
CREATE POLICY sessions_request ON sessions TO acp_gateway_request
    USING (owner = (SELECT request_owner()))
    WITH CHECK (owner = (SELECT request_owner()));

-- Events belong to their session's owner (a session never changes owner). The sub-select runs
-- as the request role too, so it sees only the sessions the policy above admits: no second
-- request_owner() of its own.
CREATE POLICY session_events_request ON session_events TO acp_gateway_request
    USING (EXISTS (SELECT 1 FROM sessions s WHERE s.id = session_events.session_id))
    WITH CHECK (EXISTS (SELECT 1 FROM sessions s WHERE s.id = session_events.session_id));
