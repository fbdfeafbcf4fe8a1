-- The sign-ins users completed on their agents (a terminal login that exited 0, an
-- `authenticate` the agent accepted): what /api/agents shows as "signed in". Only the method's id
-- and when: the credentials stay where the agent keeps them, in the user's HOME.
CREATE TABLE agent_logins (
    owner        TEXT    NOT NULL,
    agent        TEXT    NOT NULL,
    method_id    TEXT    NOT NULL,
    signed_in_at INTEGER NOT NULL,
    PRIMARY KEY (owner, agent)
) WITHOUT ROWID;
