-- Environment secrets (issue 46): delivered, on top of the repository's,
-- only to the approved deploy jobs of trusted runs that deploy to the
-- environment and list them under `secrets:`. Sealed like repository
-- secrets (associated data `env:NAME` and the secret's name), never
-- returned by the public API, masked in logs; removed with their
-- environment.
CREATE TABLE environment_secrets (
    environment TEXT NOT NULL REFERENCES environments(name) ON DELETE CASCADE,
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (environment, name)
);
-- The provenance policy a deploy job's restored artifacts must satisfy
-- (`kiln env set NAME --require-provenance POLICY`); NULL: none.
ALTER TABLE environments ADD COLUMN require_provenance TEXT;
