-- The forge loop (issue 14): repositories connected to a forge, webhook
-- deliveries accepted before the 2xx and planned after, commit statuses
-- reported through an outbox, recorded ref heads for reconciliation, the
-- schedule cursors and the leader lease of the background loops that must
-- run once across replicas.

-- github | gitlab | gitea; NULL: not connected to a forge.
ALTER TABLE repos ADD COLUMN forge TEXT;
-- The forge's API base URL (GitHub Enterprise: https://HOST/api/v3).
ALTER TABLE repos ADD COLUMN forge_url TEXT;
-- The repository on the forge: owner/name (GitLab: the project path or id).
ALTER TABLE repos ADD COLUMN forge_repo TEXT;
-- Token for the forge's status API, sealed like secrets.
ALTER TABLE repos ADD COLUMN forge_token TEXT;
ALTER TABLE repos ADD COLUMN default_branch TEXT NOT NULL DEFAULT 'main';
-- Branch patterns whose pushes are trusted besides the default branch and tags (JSON list).
ALTER TABLE repos ADD COLUMN protected_refs TEXT NOT NULL DEFAULT '[]';
-- write-access | same-repo | never: when a pull request from the repository itself is trusted.
ALTER TABLE repos ADD COLUMN pull_request_trust TEXT NOT NULL DEFAULT 'write-access';
-- Reconciliation by `git ls-remote` every this many milliseconds; NULL: off.
ALTER TABLE repos ADD COLUMN poll_interval_ms INTEGER;
ALTER TABLE repos ADD COLUMN polled_at INTEGER;

-- Who caused the run (the forge's pusher or pull request author, or the token's actor).
ALTER TABLE runs ADD COLUMN actor TEXT;

-- A webhook delivery, persisted before the forge gets its 2xx.
CREATE TABLE deliveries (
    id TEXT PRIMARY KEY,
    repo_id TEXT NOT NULL REFERENCES repos(id),
    forge TEXT NOT NULL,
    delivery_key TEXT NOT NULL,
    event TEXT NOT NULL,
    payload_digest TEXT NOT NULL,
    -- The normalized event (JSON) and the trust decided at acceptance.
    trigger_event TEXT NOT NULL,
    trust TEXT NOT NULL,
    -- pending | planned | ignored | failed
    status TEXT NOT NULL,
    message TEXT,
    run_ids TEXT NOT NULL DEFAULT '[]',
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at INTEGER NOT NULL,
    claimed_until INTEGER,
    created_at INTEGER NOT NULL,
    planned_at INTEGER,
    UNIQUE (repo_id, forge, delivery_key)
);
CREATE INDEX deliveries_pending ON deliveries(status, next_at);

-- Commit statuses to report: the state follows the run's status (or is
-- fixed, for a workflow that failed validation); `sent_state` is what the
-- forge acknowledged last.
CREATE TABLE forge_reports (
    id TEXT PRIMARY KEY,
    repo_id TEXT NOT NULL REFERENCES repos(id),
    commit_sha TEXT NOT NULL,
    context TEXT NOT NULL,
    run_id TEXT REFERENCES runs(id),
    fixed_state TEXT,
    description TEXT NOT NULL DEFAULT '',
    sent_state TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at INTEGER NOT NULL,
    claimed_until INTEGER,
    last_error TEXT,
    done INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL
);
CREATE INDEX forge_reports_open ON forge_reports(done, next_at);
CREATE INDEX forge_reports_by_commit ON forge_reports(repo_id, commit_sha, context);
CREATE INDEX forge_reports_by_run ON forge_reports(run_id);

-- The last head seen per ref (webhooks and polls), for reconciliation.
CREATE TABLE ref_heads (
    repo_id TEXT NOT NULL REFERENCES repos(id),
    git_ref TEXT NOT NULL,
    sha TEXT NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (repo_id, git_ref)
);

-- The last schedule tick fired per workflow.
CREATE TABLE schedule_cursors (
    repo_id TEXT NOT NULL REFERENCES repos(id),
    workflow_path TEXT NOT NULL,
    last_tick INTEGER NOT NULL,
    PRIMARY KEY (repo_id, workflow_path)
);

-- Leases of the loops that run on one replica at a time (scheduler, poller).
CREATE TABLE leader_leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at INTEGER NOT NULL
);
