-- A stored chunk no longer advances its session's row by trigger. The trigger rewrote the row and
-- both of the owner's list indexes (updated_at, stored_bytes) in the commit every update waits
-- on before a client sees it: two thirds of that commit's pages. The writer now stores chunks on
-- their own and advances the sessions they belong to (last_seq, updated_at, stored_bytes) once
-- the queue is quiet, in one transaction for all of them; last_seq and stored_bytes move
-- together, so a row's last_seq says which of its chunks its stored_bytes counts, and opening
-- the database accounts for chunks stored after it (a gateway killed before it advanced them).
DROP TRIGGER session_events_advance_session;
