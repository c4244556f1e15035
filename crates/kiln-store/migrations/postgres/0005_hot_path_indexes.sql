-- Indexes for hot paths that otherwise scan whole tables as history grows:
-- the attempts of a run (GET run), and jobs waiting on a concurrency group
-- (checked after every completion).
CREATE INDEX attempts_by_run ON attempts(run_id);
CREATE INDEX jobs_group_waiting ON jobs(concurrency_group) WHERE group_waiting = 1;
