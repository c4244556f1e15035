-- PostgreSQL only: partial indexes for the hot paths (SQLite scans its small
-- tables instead). They also keep SERIALIZABLE predicate locks narrow: a
-- transaction that reads through an index locks index ranges, not the table.

-- Ready jobs by dispatch class (queue rebuild after a restart).
CREATE INDEX jobs_ready_by_class ON jobs(class_key, next_attempt_at) WHERE status = 'ready';
-- Expired leases (the reconciler, several times a second).
CREATE INDEX attempts_running_by_deadline ON attempts(lease_deadline) WHERE outcome = 'running';
-- Undelivered outbox events (the relay).
CREATE INDEX outbox_undelivered ON outbox(available_at, id) WHERE published_at IS NULL;
-- Log chunks of one stream by offset are the UNIQUE (job_id, epoch, stream,
-- byte_offset) constraint of 0001; the SSE cursor is log_chunks_by_job.
-- Runs of a repository in one concurrency group that are still active.
CREATE INDEX runs_active_by_group ON runs(repo_id, concurrency_group)
    WHERE status IN ('queued', 'running', 'cancelling');
