-- Device sign-in (RFC 8628): a program (`acp-gateway login`) asks for a code, a person signed in
-- to the gateway approves it at /device, and the program's next poll gets a token. The device
-- code itself is never stored, only its SHA-256. Once issued, the row names the sign-in
-- (`web_sessions.id` = `sid`) the device's token belongs to, so the device is listed with its
-- last use and revoked by ending that sign-in.
CREATE TABLE device_codes (
    id           TEXT    PRIMARY KEY NOT NULL,
    code_hash    TEXT    NOT NULL UNIQUE,
    user_code    TEXT    NOT NULL UNIQUE,
    client_name  TEXT    NOT NULL,
    client_addr  TEXT    NOT NULL,
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL,
    polled_at    INTEGER NOT NULL DEFAULT 0,
    state        TEXT    NOT NULL,
    owner        TEXT,
    sid          TEXT,
    last_used_at INTEGER
) WITHOUT ROWID;
CREATE INDEX device_codes_owner ON device_codes (owner) WHERE state = 'issued';
CREATE INDEX device_codes_sid ON device_codes (sid) WHERE sid IS NOT NULL;
