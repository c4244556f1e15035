-- A Dockerfile job's image built without a build registry lives only in
-- the engine of the agent that built it (issue 40, item 7): its name is
-- recorded with the committed digest, and the job's retries go only to it.
ALTER TABLE jobs ADD COLUMN image_agent TEXT;
