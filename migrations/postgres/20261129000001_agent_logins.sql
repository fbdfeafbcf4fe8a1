-- The sign-ins users completed on their agents (a terminal login that exited 0, an
-- `authenticate` the agent accepted): what /api/agents shows as "signed in". Only the method's id
-- and when: the credentials stay where the agent keeps them, in the user's HOME. Request work
-- reads and writes the rows its signed identity names, nothing else.
CREATE TABLE agent_logins (
    owner        TEXT   NOT NULL,
    agent        TEXT   NOT NULL,
    method_id    TEXT   NOT NULL,
    signed_in_at BIGINT NOT NULL,
    PRIMARY KEY (owner, agent)
);
ALTER TABLE agent_logins ENABLE ROW LEVEL SECURITY;
GRANT SELECT, INSERT, UPDATE, DELETE ON agent_logins TO acp_gateway_request;
CREATE POLICY agent_logins_owner ON agent_logins TO acp_gateway_request
    USING (owner = (SELECT request_owner()))
    WITH CHECK (owner = (SELECT request_owner()));
