-- Who did what (sign-ins, sessions, agent sign-ins, admin actions, cap refusals): append-only,
-- pruned only by the retention (audit.retention_days). Never a secret: the gateway writes names,
-- ids and outcomes, not values.
CREATE TABLE audit_log (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    at          INTEGER NOT NULL,
    actor       TEXT    NOT NULL,
    action      TEXT    NOT NULL,
    target      TEXT,
    outcome     TEXT    NOT NULL,
    detail      TEXT,
    connection  TEXT,
    replica     TEXT    NOT NULL,
    client_addr TEXT
);
CREATE INDEX audit_log_at ON audit_log (at);
CREATE INDEX audit_log_actor ON audit_log (actor, id);
CREATE TRIGGER audit_log_append_only BEFORE UPDATE ON audit_log
BEGIN
    SELECT RAISE(ABORT, 'audit_log is append-only');
END;
