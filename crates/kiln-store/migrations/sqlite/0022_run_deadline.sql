-- Run-level timeout (issue 18, spec 004's timeout hierarchy): when a run
-- that is not finished is cancelled as timed out, in database time (ms).
-- Cleared when the run finishes or times out, so the index holds only the
-- live runs the reconciler must watch.
ALTER TABLE runs ADD COLUMN deadline_at BIGINT;
CREATE INDEX runs_deadline ON runs (deadline_at) WHERE deadline_at IS NOT NULL;
