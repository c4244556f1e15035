-- S3 multipart upload holding a generation's bytes (empty: none yet, or the
-- local object store). Set once, first writer wins.
ALTER TABLE artifact_generations ADD COLUMN upload_id TEXT NOT NULL DEFAULT '';
