-- Promotions between rings (issue 46): one row per job that waits for one
-- (a ring after the first, or a command gate's job), written when its needs
-- succeeded (or earlier by `kiln pause`/`kiln promote`). States:
-- baking (until bake_until) → measuring (a Prometheus gate: the next
-- measurement at next_at) → passed | failed; paused and promoted are set by
-- hand. A failed gate's rollback is recorded in `rollback` (the rollback
-- run's id, or why there was none) once the server asked for it.
ALTER TABLE ring_gates ADD COLUMN environment TEXT NOT NULL DEFAULT '';
ALTER TABLE ring_gates ADD COLUMN from_ring TEXT NOT NULL DEFAULT '';
ALTER TABLE ring_gates ADD COLUMN to_ring TEXT NOT NULL DEFAULT '';
ALTER TABLE ring_gates ADD COLUMN gate TEXT;
ALTER TABLE ring_gates ADD COLUMN started_at BIGINT;
ALTER TABLE ring_gates ADD COLUMN bake_until BIGINT;
ALTER TABLE ring_gates ADD COLUMN next_at BIGINT;
ALTER TABLE ring_gates ADD COLUMN measured BIGINT NOT NULL DEFAULT 0;
ALTER TABLE ring_gates ADD COLUMN failures BIGINT NOT NULL DEFAULT 0;
ALTER TABLE ring_gates ADD COLUMN actor TEXT;
ALTER TABLE ring_gates ADD COLUMN rollback TEXT;
CREATE INDEX ring_gates_by_run ON ring_gates(run_id);
