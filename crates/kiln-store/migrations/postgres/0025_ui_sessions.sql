-- Web UI sessions (issue 39): the browser's cookie holds a random session
-- id, never a token; only its sha256 is kept, with the credential it was
-- made from (`actor`: `admin.token` or an API token's id, and the hash of
-- that credential's secret, so a rotated or revoked token ends its
-- sessions) and its expiry. Signing out deletes the row.
CREATE TABLE ui_sessions (
    id_hash TEXT PRIMARY KEY,
    actor TEXT NOT NULL,
    token_hash TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX ui_sessions_by_expiry ON ui_sessions(expires_at);
