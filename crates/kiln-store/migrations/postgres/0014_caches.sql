-- Build caches (issue 15). A cache entry binds (repository, namespace, key)
-- to a sealed artifact generation of the attempt that saved it: first writer
-- wins; a later writer with other bytes is counted as a conflict. Deleting
-- an entry (eviction) leaves its generation to the garbage collector.
CREATE TABLE cache_entries (
    repo_id TEXT NOT NULL REFERENCES repos(id),
    namespace TEXT NOT NULL,
    cache_key TEXT NOT NULL,
    kind TEXT NOT NULL,
    generation_id TEXT NOT NULL REFERENCES artifact_generations(id),
    size_bytes BIGINT NOT NULL,
    sha256 TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    last_used_at BIGINT NOT NULL,
    hits BIGINT NOT NULL DEFAULT 0,
    conflicts BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (repo_id, namespace, cache_key)
);
CREATE INDEX cache_entries_lru ON cache_entries(last_used_at);
CREATE INDEX cache_entries_generation ON cache_entries(generation_id);

-- What the live attempt reported about its cache (JSON: key, result, bytes, seconds).
ALTER TABLE jobs ADD COLUMN cache_result TEXT;
