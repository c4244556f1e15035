-- Artifacts for real projects (issue 16): what a generation holds (`file`:
-- the published file's bytes; `archive`: a directory or glob packed as one
-- tar+zstd archive with a manifest), and when a bound artifact's bytes
-- expire (`expires_at`, ms; NULL: never; set only by the completion
-- transaction that binds it) and were expired by the collector
-- (`expired_at`). An expired binding's row stays; its generation becomes
-- `expired` (bytes deleted once `deleted_at` is set).
ALTER TABLE artifact_generations ADD COLUMN kind TEXT NOT NULL DEFAULT 'file';
ALTER TABLE artifact_bindings ADD COLUMN expires_at BIGINT;
ALTER TABLE artifact_bindings ADD COLUMN expired_at BIGINT;
CREATE INDEX artifact_bindings_expiry ON artifact_bindings(expires_at) WHERE expired_at IS NULL;
