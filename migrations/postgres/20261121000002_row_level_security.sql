-- Row-level security: a second wall behind the gateway's own owner checks.
--
-- Every query the gateway makes for a user runs in a transaction that first does
--     SELECT set_config('acp_gateway.user', <user>, true)
-- and then sees and changes only that user's rows, even if the query itself forgot its
-- `owner = …` condition. The transcript writer and the cursor key act for every user; they set
--     SELECT set_config('acp_gateway.system', 'on', true)
-- instead. With neither set, no row is visible.
--
-- FORCE makes the policies apply to the tables' owner too (the role the gateway normally runs
-- as). Superusers and roles with BYPASSRLS still bypass them: run the gateway as an ordinary
-- role. This guards against query bugs, not against SQL injection (injected SQL could call
-- set_config itself).

ALTER TABLE sessions ENABLE ROW LEVEL SECURITY;
ALTER TABLE sessions FORCE ROW LEVEL SECURITY;
CREATE POLICY sessions_owner ON sessions
    USING (
        current_setting('acp_gateway.system', true) = 'on'
        OR owner = NULLIF(current_setting('acp_gateway.user', true), '')
    )
    WITH CHECK (
        current_setting('acp_gateway.system', true) = 'on'
        OR owner = NULLIF(current_setting('acp_gateway.user', true), '')
    );

-- Events belong to their session's owner (a session never changes owner). The sub-select is
-- itself filtered by the policy above.
ALTER TABLE session_events ENABLE ROW LEVEL SECURITY;
ALTER TABLE session_events FORCE ROW LEVEL SECURITY;
CREATE POLICY session_events_owner ON session_events
    USING (
        current_setting('acp_gateway.system', true) = 'on'
        OR EXISTS (
            SELECT 1 FROM sessions s
            WHERE s.id = session_events.session_id
              AND s.owner = NULLIF(current_setting('acp_gateway.user', true), '')
        )
    )
    WITH CHECK (
        current_setting('acp_gateway.system', true) = 'on'
        OR EXISTS (
            SELECT 1 FROM sessions s
            WHERE s.id = session_events.session_id
              AND s.owner = NULLIF(current_setting('acp_gateway.user', true), '')
        )
    );

-- The cursor-signing key is nobody's row: only system work reads it.
ALTER TABLE gateway_settings ENABLE ROW LEVEL SECURITY;
ALTER TABLE gateway_settings FORCE ROW LEVEL SECURITY;
CREATE POLICY gateway_settings_system ON gateway_settings
    USING (current_setting('acp_gateway.system', true) = 'on')
    WITH CHECK (current_setting('acp_gateway.system', true) = 'on');
