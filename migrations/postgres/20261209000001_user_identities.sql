-- Which account at an identity provider a user name belongs to: bound on the name's first
-- sign-in through a provider (`issuer`, `subject` = the token's `iss` and `sub`), so that another
-- account whose claims name the same user later (a reused e-mail address, a changed
-- `preferred_username`, a second issuer) is refused. An operator moves a name to another account
-- by deleting its row. The gateway's own work only: the request role has no grant on it.
CREATE TABLE user_identities (
    user_name TEXT   PRIMARY KEY,
    issuer    TEXT   NOT NULL,
    subject   TEXT   NOT NULL,
    bound_at  BIGINT NOT NULL
);
ALTER TABLE user_identities ENABLE ROW LEVEL SECURITY;
