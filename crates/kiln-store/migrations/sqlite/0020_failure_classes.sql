-- Failure classes (issue 18): why each failed attempt did not succeed
-- (`step_failed`, `timeout`, `hang`, `agent_lost`, `infra`, `cancelled`),
-- matched by a job's `retry: {on: [...]}`.
ALTER TABLE attempts ADD COLUMN failure_class TEXT;
