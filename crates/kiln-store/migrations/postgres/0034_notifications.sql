-- Badges and notifications (issue 42).

-- A public repository's badge is served without a token (1); a private
-- one's only to a token that may read the repository (0, the default).
ALTER TABLE repos ADD COLUMN is_public BIGINT NOT NULL DEFAULT 0;

-- Outgoing notifications on run end: where to POST, which run ends
-- (a JSON list of failure | fixed | success | cancelled | always), and the
-- payload format (kiln | slack). The signing secret is not here: it is a
-- sealed row of `secrets` named `@notify:ID` (never listed, never returned).
CREATE TABLE notifications (
    id TEXT PRIMARY KEY,
    repo_id TEXT NOT NULL REFERENCES repos(id),
    url TEXT NOT NULL,
    events TEXT NOT NULL,
    format TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX notifications_by_repo ON notifications(repo_id);

-- The notification outbox and its delivery log: one row per (notification,
-- run end), written in the transaction that ended the run (the unique key
-- makes that exactly once); a sender claims a row (`claimed_until`), POSTs
-- it and records the outcome. status: pending | delivered | failed.
CREATE TABLE notification_deliveries (
    id TEXT PRIMARY KEY,
    notification_id TEXT NOT NULL,
    repo_id TEXT NOT NULL REFERENCES repos(id),
    run_id TEXT NOT NULL REFERENCES runs(id),
    event TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts BIGINT NOT NULL DEFAULT 0,
    last_status_code BIGINT,
    last_error TEXT,
    next_at BIGINT NOT NULL,
    claimed_until BIGINT,
    created_at BIGINT NOT NULL,
    delivered_at BIGINT,
    UNIQUE (notification_id, run_id)
);
CREATE INDEX notification_deliveries_due ON notification_deliveries(status, next_at);
CREATE INDEX notification_deliveries_by_repo ON notification_deliveries(repo_id, created_at);
