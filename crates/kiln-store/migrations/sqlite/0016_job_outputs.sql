-- Job outputs (issue 16): the name=value pairs a job's steps wrote to
-- $KILN_OUTPUT, bound like artifacts by the completion of the job's live
-- epoch (spec 000 §9): a fenced attempt's outputs are never written here.
-- `epoch` is the attempt that bound them.
CREATE TABLE job_outputs (
    run_id TEXT NOT NULL REFERENCES runs(id),
    job_id TEXT NOT NULL REFERENCES jobs(id),
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (job_id, name)
);
CREATE INDEX job_outputs_by_run ON job_outputs(run_id);

-- Each step's outcome and duration as the attempt's agent reported them with
-- its completion (JSON, written only for a completion of the live epoch).
ALTER TABLE attempts ADD COLUMN steps TEXT;
