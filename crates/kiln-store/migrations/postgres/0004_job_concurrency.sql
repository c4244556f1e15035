-- Job-level concurrency groups: the rendered group ("<repo id>:<group>") and
-- whether the job waits for the group to be free.
ALTER TABLE jobs ADD COLUMN concurrency_group TEXT;
ALTER TABLE jobs ADD COLUMN group_waiting BIGINT NOT NULL DEFAULT 0;
CREATE INDEX jobs_by_group ON jobs(concurrency_group, status);
