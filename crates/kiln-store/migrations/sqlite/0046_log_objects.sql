-- Log bytes in the object store (issue 47, item 6) are PostgreSQL's: SQLite
-- keeps them in segment files beside the database. The table exists on both
-- backends so their schemas stay alike.
CREATE TABLE log_objects (
    seg INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at INTEGER NOT NULL
);
