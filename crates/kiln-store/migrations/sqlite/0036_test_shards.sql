-- Dynamic test sharding (issue 43, `kiln tests next`): a run's queue of
-- test batches per group. The first shard to ask seeds it; each batch is
-- leased to the asking attempt (job, epoch) and is done when that
-- attempt's completion binds its reports; a batch leased to an attempt
-- that ended any other way (fenced, lost) goes back to the queue, so every
-- test runs exactly once in the run's bound reports.
-- state: pending | leased | done.
CREATE TABLE test_shard_batches (
    run_id TEXT NOT NULL REFERENCES runs(id),
    grp TEXT NOT NULL,
    batch_no INTEGER NOT NULL,
    tests TEXT NOT NULL,
    state TEXT NOT NULL,
    job_id TEXT,
    epoch INTEGER,
    leased_at INTEGER,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, grp, batch_no)
);
CREATE INDEX test_shard_batches_by_attempt ON test_shard_batches(job_id, epoch);
