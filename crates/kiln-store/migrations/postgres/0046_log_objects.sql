-- Log bytes in the object store (issue 47, item 6): a chunk's bytes are in
-- the object `logs/segments/NNNNNNNNNNNN` named by `seg`, at `seg_pos`, and
-- `data` is empty, as SQLite's segment files do it. Each object's number is
-- taken here, with its time, so replicas never write one key and objects no
-- chunk refers to any more (archived, or never committed) can be found and
-- deleted once they are old enough.
CREATE TABLE log_objects (
    seg BIGSERIAL PRIMARY KEY,
    created_at BIGINT NOT NULL
);
CREATE INDEX log_chunks_by_seg ON log_chunks(seg) WHERE seg IS NOT NULL;
