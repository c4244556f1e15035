-- `GET /v1/agents` and `kiln agents` (issue 17): the version an agent
-- registered with, and whether it is draining (SIGTERM: it claims nothing
-- more and lets its running jobs finish).
ALTER TABLE agents ADD COLUMN version TEXT;
ALTER TABLE agents ADD COLUMN draining INTEGER NOT NULL DEFAULT 0;
