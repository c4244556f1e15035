-- Rollback and rings (issue 46).
-- A rollback run re-runs an earlier deployment's deploy jobs with its
-- pinned artifact generations: which deployment it returns to.
ALTER TABLE runs ADD COLUMN rollback_of TEXT;
ALTER TABLE deployments ADD COLUMN rollback_of TEXT;
-- The ring a deploy job deployed (`rings:`), if any.
ALTER TABLE deployments ADD COLUMN ring TEXT;
-- How many of an environment's newest deployments keep their artifact
-- generations pinned against expiry and collection (besides its current one).
ALTER TABLE environments ADD COLUMN keep_deployments INTEGER NOT NULL DEFAULT 10;
-- The generations a deployment restored, while it is pinned: an artifact
-- binding of such a generation never expires (so its bytes are never
-- collected) — a rollback to it restores the same sha256.
CREATE TABLE deployment_pins (
    deployment_id TEXT NOT NULL,
    environment TEXT NOT NULL,
    generation_id TEXT NOT NULL,
    PRIMARY KEY (deployment_id, generation_id)
);
CREATE INDEX deployment_pins_by_generation ON deployment_pins(generation_id);
CREATE INDEX deployment_pins_by_environment ON deployment_pins(environment);
-- The gate before a ring's deploy job (`rings: [{gate, bake}]`): its
-- state as the server's gate runner, `kiln promote` or `kiln pause` left it:
-- waiting | paused | passed | failed.
CREATE TABLE ring_gates (
    job_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    state TEXT NOT NULL,
    message TEXT,
    updated_at INTEGER NOT NULL
);
CREATE INDEX ring_gates_by_state ON ring_gates(state);
