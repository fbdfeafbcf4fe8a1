-- Replicas sharing sessions through this database (README "Several replicas").
--
-- A session is served live (on an agent process) by one replica at a time: the one holding its
-- lease. A replica takes a lease when it creates or restores a session, renews all of its leases
-- in one statement every third of the lease time, and gives them up on shutdown. Another replica
-- may take a lease once it has expired, or at once when its holder is gone from the database
-- (no connection of it holds its advisory lock: a killed process's connections close with it).
-- The transcript writer stores a session's updates only while its replica holds the lease
-- (a fence: a replica that lost a lease cannot write over the new holder's numbers).
--
-- `replica_messages` carries what one replica asks of another (a client's prompt, cancel or
-- permission answer for a session the other one serves) and the answers; NOTIFY wakes the
-- receiver. Both tables are nobody's rows: only system work sees them.

CREATE TABLE session_leases (
    session_id TEXT        PRIMARY KEY REFERENCES sessions (id) ON DELETE CASCADE,
    replica    TEXT        NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX session_leases_replica ON session_leases (replica);

CREATE TABLE replica_messages (
    id         BIGSERIAL   PRIMARY KEY,
    target     TEXT        NOT NULL,
    body       TEXT        NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX replica_messages_target ON replica_messages (target, id);

ALTER TABLE session_leases ENABLE ROW LEVEL SECURITY;
ALTER TABLE session_leases FORCE ROW LEVEL SECURITY;
CREATE POLICY session_leases_system ON session_leases
    USING (current_setting('acp_gateway.system', true) = 'on')
    WITH CHECK (current_setting('acp_gateway.system', true) = 'on');

ALTER TABLE replica_messages ENABLE ROW LEVEL SECURITY;
ALTER TABLE replica_messages FORCE ROW LEVEL SECURITY;
CREATE POLICY replica_messages_system ON replica_messages
    USING (current_setting('acp_gateway.system', true) = 'on')
    WITH CHECK (current_setting('acp_gateway.system', true) = 'on');
