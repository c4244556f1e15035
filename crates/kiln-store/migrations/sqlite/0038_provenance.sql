-- Provenance (issue 45): the signed in-toto statement (a DSSE envelope,
-- JSON) of each bound artifact generation, written by the completion
-- transaction that binds it, from the facts the server froze and decided.
-- A generation is bound only with its statement; a retry that pins a
-- parent's generation keeps the statement written when it was first bound.
CREATE TABLE artifact_provenance (
    generation_id TEXT PRIMARY KEY REFERENCES artifact_generations(id),
    run_id TEXT NOT NULL REFERENCES runs(id),
    job_id TEXT NOT NULL REFERENCES jobs(id),
    epoch BIGINT NOT NULL,
    -- The signing key's id (RFC 7638 thumbprint).
    keyid TEXT NOT NULL,
    envelope TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX artifact_provenance_by_run ON artifact_provenance(run_id);
