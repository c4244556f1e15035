-- Test reports, flaky tests and quarantine (issue 43).

-- What an attempt's agent read from the job's `reports:` globs, one row per
-- report file, staged under the attempt's epoch (the upload is refused for
-- any epoch but the live one). Staged rows count only once the attempt's
-- completion binds them (`test_attempts`): a fenced attempt's reports are
-- never read.
CREATE TABLE test_reports (
    id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs(id),
    job_id TEXT NOT NULL REFERENCES jobs(id),
    epoch BIGINT NOT NULL,
    path TEXT NOT NULL,
    format TEXT NOT NULL,
    truncated BIGINT NOT NULL,
    annotations TEXT NOT NULL,
    tests BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    UNIQUE (job_id, epoch, path)
);

-- One row per test of a staged report, in report order (`seq`).
CREATE TABLE test_results (
    report_id TEXT NOT NULL REFERENCES test_reports(id),
    seq BIGINT NOT NULL,
    run_id TEXT NOT NULL,
    job_id TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    repo_id TEXT NOT NULL,
    test_id TEXT NOT NULL,
    suite TEXT NOT NULL,
    class TEXT,
    name TEXT NOT NULL,
    file TEXT,
    outcome TEXT NOT NULL,
    duration_ms BIGINT,
    message TEXT,
    excerpt TEXT,
    retries TEXT,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (report_id, seq)
);
CREATE INDEX test_results_by_attempt ON test_results(job_id, epoch);
CREATE INDEX test_results_by_test ON test_results(repo_id, test_id, created_at);

-- The binding: written by the completion of the live attempt of a job that
-- declares `reports:` (whatever its outcome), with what its reports add up
-- to. state: complete | truncated | missing.
CREATE TABLE test_attempts (
    job_id TEXT NOT NULL REFERENCES jobs(id),
    epoch BIGINT NOT NULL,
    run_id TEXT NOT NULL REFERENCES runs(id),
    repo_id TEXT NOT NULL,
    commit_sha TEXT NOT NULL,
    state TEXT NOT NULL,
    total BIGINT NOT NULL,
    passed BIGINT NOT NULL,
    failed BIGINT NOT NULL,
    errored BIGINT NOT NULL,
    skipped BIGINT NOT NULL,
    quarantined BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (job_id, epoch)
);
CREATE INDEX test_attempts_by_commit ON test_attempts(repo_id, commit_sha);
CREATE INDEX test_attempts_by_run ON test_attempts(run_id);

-- Tests found flaky when a run ended: they passed and failed for the run's
-- commit (runner retries, job retries, reruns).
CREATE TABLE test_flakes (
    run_id TEXT NOT NULL REFERENCES runs(id),
    repo_id TEXT NOT NULL,
    test_id TEXT NOT NULL,
    commit_sha TEXT NOT NULL,
    passes BIGINT NOT NULL,
    failures BIGINT NOT NULL,
    decided_at BIGINT NOT NULL,
    PRIMARY KEY (run_id, test_id)
);
CREATE INDEX test_flakes_by_test ON test_flakes(repo_id, test_id);

-- A run's tests when it ended (for lists and commit statuses): a JSON
-- summary {total, passed, failed, errored, skipped, flaky, quarantined}.
ALTER TABLE runs ADD COLUMN test_summary TEXT;

-- Quarantined tests: a failure of one does not fail its job (with a
-- complete report). Every quarantine has an owner and ends: removed
-- (`ended_by` who) or expired (`ended_by` = 'expiry', noticed by a loop
-- that writes the audit entry).
CREATE TABLE test_quarantine (
    id TEXT PRIMARY KEY,
    repo_id TEXT NOT NULL REFERENCES repos(id),
    test_id TEXT NOT NULL,
    owner TEXT NOT NULL,
    reason TEXT NOT NULL,
    link TEXT,
    created_by TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    ended_at BIGINT,
    ended_by TEXT
);
CREATE UNIQUE INDEX test_quarantine_open ON test_quarantine(repo_id, test_id) WHERE ended_at IS NULL;
