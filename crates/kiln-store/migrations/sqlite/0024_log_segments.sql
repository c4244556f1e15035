-- Log bytes in segment files (issue 20): a chunk whose bytes live in the
-- store's segment directory has `data` empty and names the segment and the
-- position of its bytes there. Rows from before keep their bytes in `data`.
ALTER TABLE log_chunks ADD COLUMN seg INTEGER;
ALTER TABLE log_chunks ADD COLUMN seg_pos INTEGER;
CREATE INDEX log_chunks_by_seg ON log_chunks(seg) WHERE seg IS NOT NULL;
