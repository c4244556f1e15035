-- ArtifactGeneration: a candidate output of one attempt (spec 000 §6, §12).
-- Staged bytes are never a canonical input by themselves.
CREATE TABLE artifact_generations (
    id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs(id),
    job_id TEXT NOT NULL REFERENCES jobs(id),
    epoch BIGINT NOT NULL,
    name TEXT NOT NULL,
    object_key TEXT NOT NULL UNIQUE,
    expected_size BIGINT NOT NULL,
    expected_sha256 TEXT NOT NULL,
    part_size BIGINT NOT NULL,
    -- uploading | sealed | failed | deleted
    state TEXT NOT NULL,
    message TEXT,
    created_at BIGINT NOT NULL,
    sealed_at BIGINT,
    deleted_at BIGINT
);
CREATE INDEX artifact_generations_by_attempt ON artifact_generations(job_id, epoch, name);
CREATE INDEX artifact_generations_by_state ON artifact_generations(state, created_at);

-- ArtifactBinding: one authoritative binding per (producer job, name),
-- written only by the completion transaction.
CREATE TABLE artifact_bindings (
    run_id TEXT NOT NULL REFERENCES runs(id),
    job_id TEXT NOT NULL REFERENCES jobs(id),
    name TEXT NOT NULL,
    generation_id TEXT NOT NULL UNIQUE REFERENCES artifact_generations(id),
    created_at BIGINT NOT NULL,
    PRIMARY KEY (job_id, name)
);
CREATE INDEX artifact_bindings_by_run ON artifact_bindings(run_id);
