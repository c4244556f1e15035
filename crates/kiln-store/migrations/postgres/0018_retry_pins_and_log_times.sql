-- Retry from a job (spec 000 §9, `kiln retry RUN --failed`): a retry's
-- pinned jobs bind the very generations their parent run's jobs bound, so a
-- generation may now be bound by several (run, job)s. One binding per
-- (producer job, name) stays the key.
ALTER TABLE artifact_bindings DROP CONSTRAINT artifact_bindings_generation_id_key;
CREATE INDEX artifact_bindings_by_generation ON artifact_bindings(generation_id);

-- When the server committed each log chunk (`kiln logs --timestamps`);
-- NULL for chunks committed before this migration.
ALTER TABLE log_chunks ADD COLUMN created_at BIGINT;
