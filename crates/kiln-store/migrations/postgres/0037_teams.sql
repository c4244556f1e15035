-- Fair share (issue 44): teams, their weights and quotas, and the lane of
-- each run. Repositories belong to a team (`default` until moved); the
-- dispatcher shares slots between teams by weight (kiln-core `fair`),
-- `pass` is a team's virtual time, kept here so a restart or a failover
-- does not reset fairness. max_running counts reservations (claimed jobs
-- not started yet); NULL: no quota.
CREATE TABLE teams (
    name TEXT PRIMARY KEY,
    weight BIGINT NOT NULL DEFAULT 1,
    max_running BIGINT,
    max_queued BIGINT,
    pass BIGINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL
);
INSERT INTO teams (name, weight, created_at) VALUES ('default', 1, 0);
ALTER TABLE repos ADD COLUMN team TEXT NOT NULL DEFAULT 'default';
CREATE INDEX repos_by_team ON repos(team);
-- urgent | normal | background
ALTER TABLE runs ADD COLUMN priority TEXT NOT NULL DEFAULT 'normal';
