-- A cancel ends when the sandbox is known to be gone (issue 40, item 5;
-- spec 000 §9, §15): when the attempt's agent confirmed it (`release_evidence`
-- says how: the completion's evidence, the agent's report after it was
-- fenced, a restart that removed what the old process left, or the agent's
-- removal) and what its cleanup could not do. A fenced (`lost`) attempt
-- has none until then, and a cancelling run waits for it.
ALTER TABLE attempts ADD COLUMN released_at INTEGER;
ALTER TABLE attempts ADD COLUMN release_evidence TEXT;
ALTER TABLE attempts ADD COLUMN cleanup_error TEXT;
-- Attempts that ended before releases were recorded are not waited for.
UPDATE attempts SET released_at = COALESCE(finished_at, started_at),
    release_evidence = 'ended before Kiln recorded sandbox releases'
    WHERE outcome <> 'running';
