-- Who may do what (issue 13): agent pools and join tokens, scoped API
-- tokens (hashed at rest), the repositories' secret pools, and the audit log.

-- An agent registers with a join token and belongs to that token's pool.
ALTER TABLE agents ADD COLUMN pool TEXT NOT NULL DEFAULT 'default';
ALTER TABLE agents ADD COLUMN join_token_id TEXT;

-- Join tokens beyond DATA_DIR/agent.token: sha256 of the secret part only.
CREATE TABLE join_tokens (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    pool TEXT NOT NULL,
    token_hash TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
);

-- Scoped API tokens beyond DATA_DIR/admin.token.
CREATE TABLE api_tokens (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    scope TEXT NOT NULL,
    repo_id TEXT,
    trusted INTEGER NOT NULL DEFAULT 0,
    token_hash TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER,
    last_used_at INTEGER
);

-- Pools whose agents may receive this repository's secrets (JSON list).
ALTER TABLE repos ADD COLUMN secret_pools TEXT NOT NULL DEFAULT '["default"]';

-- Who started, cancelled or retried what, every token change and every
-- secret handed out.
CREATE TABLE audit_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at INTEGER NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT ''
);
CREATE INDEX audit_log_by_time ON audit_log(at);
