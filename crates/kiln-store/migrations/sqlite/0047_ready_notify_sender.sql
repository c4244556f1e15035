-- PostgreSQL only (ready notifications name their sender); SQLite has one
-- server and no notifications. Kept so both backends number alike.
SELECT 1;
