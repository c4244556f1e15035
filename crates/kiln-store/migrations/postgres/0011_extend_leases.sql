-- PostgreSQL only: heartbeats at the spec's peak (thousands a second).
--
-- Heartbeats are HOT updates. A heartbeat changes only `lease_deadline`;
-- while an index contains that column, every heartbeat writes a new entry
-- into every index of `attempts`, and each lookup of a busy lease walks the
-- entries of its earlier heartbeats (0.3 ms a heartbeat under load). Without
-- it the new row version stays on its page and no index changes. Expired
-- leases are found through the running attempts instead (`attempts_running`),
-- checking each one's deadline: the reconciler reads the live attempts only,
-- a few times a second.
DROP INDEX attempts_live;
DROP INDEX attempts_running_by_deadline;
CREATE INDEX attempts_running ON attempts(job_id) WHERE outcome = 'running';
-- Room on each page for the new versions of its rows.
ALTER TABLE attempts SET (fillfactor = 80);

-- The heartbeat fast path for a batch of leases (see
-- `postgres::extend_lease`). Each lease is extended by its own single-row
-- UPDATE on the primary key, under the same conditions as one heartbeat
-- (running, unexpired, the job's current epoch), all in one round trip and
-- one commit. A row-at-a-time loop rather than one `UPDATE … FROM unnest`:
-- the set-based form lets the planner scan every running attempt and
-- hash-join, which it prefers whenever the table's statistics are stale (a
-- fresh or fast-growing table), at milliseconds per batch; a primary-key
-- lookup per lease is planned the same way always.
-- Rows come in the caller's (sorted) order, so concurrent batches lock shared
-- rows in the same order.
CREATE FUNCTION kiln_extend_leases(p_jobs TEXT[], p_epochs BIGINT[], p_ttls BIGINT[])
RETURNS TABLE (o_job_id TEXT, o_epoch BIGINT, o_deadline BIGINT, o_cancel BIGINT, o_run_status TEXT)
LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_jobs, 1), 0) LOOP
        RETURN QUERY
            UPDATE attempts a
               SET lease_deadline = CAST(extract(epoch from clock_timestamp()) * 1000 AS BIGINT) + p_ttls[i]
             WHERE a.job_id = p_jobs[i] AND a.epoch = p_epochs[i] AND a.outcome = 'running'
               AND a.lease_deadline > CAST(extract(epoch from clock_timestamp()) * 1000 AS BIGINT)
               AND a.epoch = (SELECT j.current_epoch FROM jobs j WHERE j.id = p_jobs[i])
            RETURNING a.job_id, a.epoch, a.lease_deadline,
                (SELECT j.cancel_requested FROM jobs j WHERE j.id = p_jobs[i]),
                (SELECT r.status FROM runs r JOIN jobs j ON j.run_id = r.id WHERE j.id = p_jobs[i]);
    END LOOP;
END
$$;
