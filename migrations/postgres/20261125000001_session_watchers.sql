-- Which replicas have clients attached to a session (README "Several replicas"): the replica
-- serving a session asks an agent's request (`session/request_permission`, `fs/*`,
-- `terminal/*`) of clients on those replicas too, through `replica_messages`.
--
-- A replica adds its row when a client of its own attaches to the session and removes it when
-- asked on a session it no longer has clients of; the rows of a replica gone from the database
-- (no connection holds its advisory lock) are removed by the others. A stale row costs one
-- message that is ignored.

CREATE TABLE session_watchers (
    session_id TEXT        NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    replica    TEXT        NOT NULL,
    since      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, replica)
);
CREATE INDEX session_watchers_replica ON session_watchers (replica);
CREATE INDEX replica_messages_created ON replica_messages (created_at);

ALTER TABLE session_watchers ENABLE ROW LEVEL SECURITY;
ALTER TABLE session_watchers FORCE ROW LEVEL SECURITY;
CREATE POLICY session_watchers_system ON session_watchers
    USING (current_setting('acp_gateway.system', true) = 'on')
    WITH CHECK (current_setting('acp_gateway.system', true) = 'on');
