-- Who did what (sign-ins, sessions, agent sign-ins, admin actions, cap refusals): append-only,
-- pruned only by the retention (audit.retention_days). Never a secret: the gateway writes names,
-- ids and outcomes, not values. The gateway's own work: the request role has no grant on it.
CREATE TABLE audit_log (
    id          BIGSERIAL PRIMARY KEY,
    at          BIGINT NOT NULL,
    actor       TEXT   NOT NULL,
    action      TEXT   NOT NULL,
    target      TEXT,
    outcome     TEXT   NOT NULL,
    detail      TEXT,
    connection  TEXT,
    replica     TEXT   NOT NULL,
    client_addr TEXT
);
ALTER TABLE audit_log ENABLE ROW LEVEL SECURITY;
CREATE INDEX audit_log_at ON audit_log (at);
CREATE INDEX audit_log_actor ON audit_log (actor, id);
CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only';
END;
$$;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
