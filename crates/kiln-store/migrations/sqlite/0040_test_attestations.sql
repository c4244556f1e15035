-- Test-result attestations (issue 45): the signed in-toto Test Result
-- statement (a DSSE envelope, JSON) of a job that declares `reports:`,
-- over the artifacts it restored, written by the completion transaction
-- that binds its reports (one per attempt that bound them).
CREATE TABLE test_attestations (
    job_id TEXT NOT NULL REFERENCES jobs(id),
    epoch BIGINT NOT NULL,
    run_id TEXT NOT NULL REFERENCES runs(id),
    result TEXT NOT NULL,
    keyid TEXT NOT NULL,
    envelope TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (job_id, epoch)
);

-- A directory artifact's manifest digest (issue 45): the sha256 of the
-- manifest at the head of its archive, read by the server at seal; its
-- provenance names it as a second subject, so an extracted tree can be
-- checked file by file.
ALTER TABLE artifact_generations ADD COLUMN manifest_sha256 TEXT;
