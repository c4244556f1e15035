-- Replicas wake each other when jobs become ready: every transaction that
-- writes outbox events notifies channel `kiln_ready` (delivered only when it
-- commits; identical notifications of one transaction are folded into one).
-- Listeners re-read the ready jobs (see PgStore::ready_wakeups).
CREATE FUNCTION kiln_notify_ready() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('kiln_ready', '');
    RETURN NULL;
END;
$$;
CREATE TRIGGER outbox_notify_ready AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION kiln_notify_ready();
