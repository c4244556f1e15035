-- Finished logs archived to the object store as an immutable segment plus an
-- index (spec 000 §13). A row is written in the transaction that trims the
-- archived chunks from the hot journal (log_chunks), never before the
-- objects exist. Ids keep their meaning: `first_id..=last_id` are the event
-- ids the archived chunks had, so SSE cursors stay valid across archival.
CREATE TABLE log_archives (
    job_id TEXT NOT NULL,
    first_id INTEGER NOT NULL,
    last_id INTEGER NOT NULL,
    segment_key TEXT NOT NULL,
    index_key TEXT NOT NULL,
    chunks INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    archived_at INTEGER NOT NULL,
    PRIMARY KEY (job_id, first_id)
);
