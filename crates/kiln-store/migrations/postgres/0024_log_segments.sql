-- The columns SQLite uses for log bytes kept in segment files (issue 20).
-- PostgreSQL keeps every chunk's bytes in `data` (with several replicas a
-- local file would be on one replica only): they stay NULL here.
ALTER TABLE log_chunks ADD COLUMN seg BIGINT;
ALTER TABLE log_chunks ADD COLUMN seg_pos BIGINT;
