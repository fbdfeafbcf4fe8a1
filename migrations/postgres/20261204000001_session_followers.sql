-- Commits are announced only where someone listens (README "Several replicas").
--
-- The transcript writer used to NOTIFY `acp_session_committed` for every commit of a leased
-- session. A NOTIFY takes a database-wide lock at commit and wakes every listening replica:
-- ~70 µs of each prompt's round trip on a single replica, for nobody. Now a lease row says
-- whether another replica has clients of the session (`announce`), and only those sessions'
-- commits are announced.
--
-- `session_followers` names the replicas with clients (of any role; `session_watchers` keeps
-- only those that may answer an agent's request) of a session. A replica adds its row the first
-- time a client of its own attaches, then sets `announce` on the lease (the statement waits for
-- the holder's writes in flight, which hold the lease row `FOR SHARE`) and reads the store once:
-- every commit it was not told of is in that read, and every later one is announced. A replica
-- taking a lease sets `announce` from the rows of the others. Rows go with their session, or
-- with a replica gone from the database; `announce` stays set until the lease is given up.

CREATE TABLE session_followers (
    session_id TEXT        NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    replica    TEXT        NOT NULL,
    since      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, replica)
);
CREATE INDEX session_followers_replica ON session_followers (replica);

ALTER TABLE session_leases ADD COLUMN announce BOOLEAN NOT NULL DEFAULT false;
-- Leases taken before this migration keep announcing, as they did.
UPDATE session_leases SET announce = true;

-- Nobody's rows: only system work (the tables' owner) sees them; the request role is granted
-- nothing, and with no policy for it, would see nothing even if it were.
ALTER TABLE session_followers ENABLE ROW LEVEL SECURITY;
