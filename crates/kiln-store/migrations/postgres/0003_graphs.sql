-- Pipelines as graphs (spec 003 Deep Dive 3): fail-fast cancellation of
-- running matrix siblings, and run-level concurrency groups.
ALTER TABLE jobs ADD COLUMN cancel_requested BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN concurrency_group TEXT;
-- 1 while the run waits for its concurrency group to be free.
ALTER TABLE runs ADD COLUMN held BIGINT NOT NULL DEFAULT 0;
CREATE INDEX runs_by_group ON runs(repo_id, concurrency_group, status);
