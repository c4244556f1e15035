-- Repository secrets (spec 003 "Secrets"): delivered to trusted runs' jobs
-- that ask for them, never returned by the public API, masked in logs.
CREATE TABLE secrets (
    repo_id TEXT NOT NULL REFERENCES repos(id),
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (repo_id, name)
);
