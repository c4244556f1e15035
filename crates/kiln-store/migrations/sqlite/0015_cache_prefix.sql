-- Caches (issue 15): an entry's prefix key (its key without the input
-- fingerprints: dependency caches with `restore-prefix` fall back to the
-- most recently used entry of the same prefix) and how long the steps of
-- the attempt that saved it took (the cold build time, for the estimate of
-- time saved by a hit).
ALTER TABLE cache_entries ADD COLUMN prefix TEXT;
ALTER TABLE cache_entries ADD COLUMN build_ms BIGINT;
CREATE INDEX cache_entries_prefix ON cache_entries(repo_id, namespace, prefix, last_used_at);
