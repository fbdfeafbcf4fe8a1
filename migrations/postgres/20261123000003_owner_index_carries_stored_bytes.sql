-- Store::stored_bytes sums a user's sessions' stored_bytes. Read from the table that is one heap
-- fetch per session (measured: 240-550 ms for a user with 100,000 sessions); with stored_bytes
-- carried in the owner's list index the sum is an index-only scan where the visibility map
-- allows. The transcript writer's UPDATE changes updated_at, a key of this index, so it never
-- was a HOT update: carrying stored_bytes adds no index writes.
CREATE INDEX sessions_owner_updated_bytes ON sessions (owner, updated_at DESC, id DESC) INCLUDE (stored_bytes);
DROP INDEX sessions_owner_updated;
ALTER INDEX sessions_owner_updated_bytes RENAME TO sessions_owner_updated;
