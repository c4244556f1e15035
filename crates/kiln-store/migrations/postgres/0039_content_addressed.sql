-- Content-addressed artifact bytes (issue 45). A generation is uploaded
-- under its own session key (`object_key`, unique: a stale attempt can
-- never touch another's bytes); once verified, its bytes move to
-- `cas/sha256/<hex>` and `content_key` names that key, so identical bytes
-- published by many runs are stored once. A content object is referenced
-- by every generation whose `content_key` names it and that is not deleted
-- (bindings, cache entries, provenance and pins hold generations); the
-- collector deletes its bytes only when none does.
ALTER TABLE artifact_generations ADD COLUMN content_key TEXT;
-- A migrated generation's old bytes are deleted after this time (a
-- download capability handed out before the move may still read them).
ALTER TABLE artifact_generations ADD COLUMN retire_session_at BIGINT;
CREATE INDEX artifact_generations_by_content ON artifact_generations(content_key);

-- One row per content object: `live`, or `deleting` while the collector
-- removes its bytes (a seal that meets it waits and tries again).
-- `touched_at`: the last time a generation was made to reference it.
CREATE TABLE content_objects (
    sha256 TEXT PRIMARY KEY,
    size BIGINT NOT NULL,
    state TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    touched_at BIGINT NOT NULL
);
