-- Deployments (issue 46): one row per deploy job (a job with
-- `environment:`) that ended success or failed, with what it deployed:
-- the artifact generations it restored (JSON [{name, from_job, run_id,
-- generation, sha256}]) and the approvals its run held (JSON [names]).
CREATE TABLE deployments (
    id TEXT PRIMARY KEY,
    environment TEXT NOT NULL,
    repo_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    job_id TEXT NOT NULL,
    job_name TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    commit_sha TEXT NOT NULL,
    url TEXT,
    status TEXT NOT NULL,
    triggered_by TEXT,
    approvals TEXT NOT NULL DEFAULT '[]',
    artifacts TEXT NOT NULL DEFAULT '[]',
    created_at BIGINT NOT NULL
);
CREATE UNIQUE INDEX deployments_by_job ON deployments(job_id);
CREATE INDEX deployments_by_environment ON deployments(environment, created_at);
