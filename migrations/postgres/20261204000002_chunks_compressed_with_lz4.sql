-- Transcript chunks are compressed with LZ4 where the server has it (README "Persistence").
--
-- A streamed chunk is one row of up to thousands of JSON lines (~100 KiB), so Postgres
-- compresses it out of line (TOAST), by default with its own pglz: on a 2-core host that cost
-- as much CPU as the gateway's own work, and LZ4 took 10-20 % more updates a second through
-- the gateway (one and eight connections, alternated runs). Stored chunks keep their method and
-- stay readable; only new ones use LZ4. A server without it (built without lz4, or before
-- Postgres 14, which has no `default_toast_compression`) keeps pglz.
DO $do$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_settings
               WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
        ALTER TABLE session_events ALTER COLUMN payload SET COMPRESSION lz4;
    END IF;
END
$do$;
