-- Run numbers (issue 42, run identity): each repository numbers its runs
-- 1, 2, 3… in the order they were accepted (`hello#123`). The number is
-- taken from `repos.next_run_number`, incremented in the acceptance
-- transaction, so it never goes back: a number is never reused, even once
-- its run is gone. Runs accepted before are numbered here in created_at
-- order (id breaking ties) per repository.
ALTER TABLE repos ADD COLUMN next_run_number BIGINT NOT NULL DEFAULT 1;
ALTER TABLE runs ADD COLUMN run_number BIGINT NOT NULL DEFAULT 0;
UPDATE runs SET run_number = (
    SELECT COUNT(*) FROM runs o
    WHERE o.repo_id = runs.repo_id
      AND (o.created_at < runs.created_at OR (o.created_at = runs.created_at AND o.id <= runs.id))
);
UPDATE repos SET next_run_number = 1 + COALESCE((SELECT MAX(run_number) FROM runs WHERE runs.repo_id = repos.id), 0);
CREATE UNIQUE INDEX runs_repo_number ON runs (repo_id, run_number);
-- A pull request run's title, from the webhook payload at acceptance (its
-- number is in the run's ref, `refs/pull/N/head`).
ALTER TABLE runs ADD COLUMN pull_request_title TEXT;
