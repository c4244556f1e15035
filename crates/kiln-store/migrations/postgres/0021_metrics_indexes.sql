-- `/metrics` counts the unfinished runs by status at each scrape (issue 19):
-- through this index it reads only those, however many runs have ended.
CREATE INDEX runs_by_status ON runs(status);
