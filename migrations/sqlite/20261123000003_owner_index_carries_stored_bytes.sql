-- Store::stored_bytes sums a user's sessions' stored_bytes. Read from the table that is one row
-- lookup per session (measured: 130-500 ms for a user with 100,000 sessions); with stored_bytes
-- in the owner's list index the sum reads only that index. The index moves a session's entry
-- whenever its updated_at changes, which is with nearly every chunk stored, so carrying
-- stored_bytes adds next to nothing to the writer's commits.
DROP INDEX sessions_owner_updated;
CREATE INDEX sessions_owner_updated ON sessions (owner, updated_at DESC, id DESC, stored_bytes);
