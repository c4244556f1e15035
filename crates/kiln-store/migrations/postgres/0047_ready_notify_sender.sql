-- A ready notification names the replica whose commit sent it (its
-- connections' application_name, unique per server process): a replica
-- skips its own, which its relay already handed to its dispatcher, instead
-- of re-reading every ready job after each of its own commits.
CREATE OR REPLACE FUNCTION kiln_notify_ready() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('kiln_ready', COALESCE(current_setting('application_name', true), ''));
    RETURN NULL;
END;
$$;
