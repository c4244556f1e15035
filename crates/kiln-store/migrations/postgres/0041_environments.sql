-- Deployment environments (issue 46): protection rules a job with
-- `environment:` waits on. approvers: JSON list of API token names (`admin`
-- for DATA_DIR/admin.token); empty: any admin may approve. refs: JSON list
-- of ref patterns (branch names or full refs, `*` within a segment, `**`
-- across); empty: any ref. min_approvals 0 with no approvers: no approval.
CREATE TABLE environments (
    name TEXT PRIMARY KEY,
    approvers TEXT NOT NULL DEFAULT '[]',
    min_approvals BIGINT NOT NULL DEFAULT 0,
    prevent_self_review BIGINT NOT NULL DEFAULT 0,
    refs TEXT NOT NULL DEFAULT '[]',
    wait_ms BIGINT NOT NULL DEFAULT 0,
    approval_ttl_ms BIGINT NOT NULL DEFAULT 2592000000,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
-- One decision per run, environment and approver (token): approved or
-- rejected. Bound to the frozen run: a retry is a new run and needs its own.
CREATE TABLE environment_approvals (
    run_id TEXT NOT NULL,
    environment TEXT NOT NULL,
    actor TEXT NOT NULL,
    decision TEXT NOT NULL,
    comment TEXT,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (run_id, environment, actor)
);
