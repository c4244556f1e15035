-- Retry from a job (spec 000 §9, `kiln retry RUN --failed`): a retry's
-- pinned jobs bind the very generations their parent run's jobs bound, so a
-- generation may now be bound by several (run, job)s. One binding per
-- (producer job, name) stays the key. SQLite drops a UNIQUE constraint by
-- rebuilding the table.
CREATE TABLE artifact_bindings_0018 (
    run_id TEXT NOT NULL REFERENCES runs(id),
    job_id TEXT NOT NULL REFERENCES jobs(id),
    name TEXT NOT NULL,
    generation_id TEXT NOT NULL REFERENCES artifact_generations(id),
    created_at INTEGER NOT NULL,
    expires_at BIGINT,
    expired_at BIGINT,
    PRIMARY KEY (job_id, name)
);
INSERT INTO artifact_bindings_0018 (run_id, job_id, name, generation_id, created_at, expires_at, expired_at)
    SELECT run_id, job_id, name, generation_id, created_at, expires_at, expired_at FROM artifact_bindings;
DROP TABLE artifact_bindings;
ALTER TABLE artifact_bindings_0018 RENAME TO artifact_bindings;
CREATE INDEX artifact_bindings_by_run ON artifact_bindings(run_id);
CREATE INDEX artifact_bindings_by_generation ON artifact_bindings(generation_id);
-- (0017's index went with the old table.)
CREATE INDEX artifact_bindings_expiry ON artifact_bindings(expires_at) WHERE expired_at IS NULL;

-- When the server committed each log chunk (`kiln logs --timestamps`);
-- NULL for chunks committed before this migration.
ALTER TABLE log_chunks ADD COLUMN created_at INTEGER;
