-- Kiln metadata schema (SQLite). Times are unix milliseconds taken from the
-- database clock inside each transaction (spec 000 §8: database time).

CREATE TABLE repos (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    clone_url TEXT NOT NULL,
    webhook_secret TEXT,
    created_at INTEGER NOT NULL
);

-- WorkflowRun: the frozen execution definition (spec 000 §5, §6).
CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    repo_id TEXT NOT NULL REFERENCES repos(id),
    status TEXT NOT NULL,
    commit_sha TEXT NOT NULL,
    git_ref TEXT,
    event TEXT NOT NULL,
    trust TEXT NOT NULL,
    workflow_path TEXT NOT NULL,
    workflow_hash TEXT NOT NULL,
    definition TEXT NOT NULL,
    inputs TEXT NOT NULL,
    parent_run_id TEXT REFERENCES runs(id),
    cancel_version INTEGER NOT NULL DEFAULT 0,
    message TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    finished_at INTEGER
);
CREATE INDEX runs_by_repo ON runs(repo_id, created_at DESC);

-- JobRun: unique (run_id, job_index).
CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs(id),
    job_index INTEGER NOT NULL,
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    needs TEXT NOT NULL,
    class_key TEXT NOT NULL,
    dispatch_generation INTEGER NOT NULL DEFAULT 0,
    current_epoch INTEGER NOT NULL DEFAULT 0,
    failure_retries INTEGER NOT NULL DEFAULT 0,
    infra_retries INTEGER NOT NULL DEFAULT 0,
    max_failure_retries INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER,
    image_digest TEXT,
    message TEXT,
    started_at INTEGER,
    finished_at INTEGER,
    UNIQUE (run_id, job_index)
);
CREATE INDEX jobs_by_status ON jobs(status);

-- Attempt: unique (job_id, epoch).
CREATE TABLE attempts (
    job_id TEXT NOT NULL REFERENCES jobs(id),
    epoch INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    runner TEXT NOT NULL,
    claim_request_id TEXT NOT NULL UNIQUE,
    lease_deadline INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    exit_code INTEGER,
    message TEXT,
    started_at INTEGER NOT NULL,
    finished_at INTEGER,
    PRIMARY KEY (job_id, epoch)
);
CREATE INDEX attempts_live ON attempts(outcome, lease_deadline);
CREATE INDEX attempts_by_session ON attempts(session_id, outcome);

-- Outbox: committed readiness, delivered by the relay (spec 000 §9).
CREATE TABLE outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    dispatch_generation INTEGER NOT NULL,
    class_key TEXT NOT NULL,
    available_at INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    published_at INTEGER
);
CREATE INDEX outbox_unpublished ON outbox(published_at, available_at);

-- Idempotency records bound to a request digest (spec 000 §6).
CREATE TABLE idempotency (
    scope TEXT NOT NULL,
    key TEXT NOT NULL,
    request_digest TEXT NOT NULL,
    run_id TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
);

CREATE TABLE agents (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    labels TEXT NOT NULL,
    max_jobs INTEGER NOT NULL,
    session_id TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    last_seen_at INTEGER NOT NULL
);

-- Log chunks: identity (job, epoch, stream, seq, offset, length, sha256).
-- id is the SSE event cursor.
CREATE TABLE log_chunks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    stream TEXT NOT NULL,
    seq INTEGER NOT NULL,
    byte_offset INTEGER NOT NULL,
    length INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    data BLOB NOT NULL,
    UNIQUE (job_id, epoch, stream, byte_offset)
);
CREATE INDEX log_chunks_by_job ON log_chunks(job_id, id);

CREATE TABLE log_progress (
    job_id TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    stream TEXT NOT NULL,
    committed INTEGER NOT NULL,
    PRIMARY KEY (job_id, epoch, stream)
);
