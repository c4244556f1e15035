-- A ready notification names the replica whose commit sent it (its
-- connections' application_name, unique per server process) and the jobs
-- it made ready: a replica skips its own (its relay handed those to its
-- dispatcher already) and reads only the jobs named, instead of re-reading
-- every ready job after each commit anywhere. Too many jobs for one
-- payload (PostgreSQL allows 8000 bytes): `*`, read them all.
CREATE OR REPLACE FUNCTION kiln_notify_ready() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    jobs text;
BEGIN
    SELECT string_agg(DISTINCT job_id, ',') INTO jobs FROM new_events;
    IF jobs IS NULL OR length(jobs) > 7000 THEN
        jobs := '*';
    END IF;
    PERFORM pg_notify('kiln_ready', COALESCE(current_setting('application_name', true), '') || ' ' || jobs);
    RETURN NULL;
END;
$$;
DROP TRIGGER outbox_notify_ready ON outbox;
CREATE TRIGGER outbox_notify_ready AFTER INSERT ON outbox
    REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION kiln_notify_ready();
