-- The application version the instance was created under (the creating
-- process's `KEIRO_APP_VERSION`, builder setting, or the hash of its linked
-- workflows): a resume worker claims only instances of its own version, of
-- a version it declares compatible, or with none. NULL for rows older than
-- this migration ("unversioned"), which every worker may claim.
ALTER TABLE keiro.workflows ADD COLUMN app_version TEXT;
-- The step-call skeleton hash of the workflow's code that created the
-- instance (emitted by `#[workflow]`), so `keiro check --binary-hashes`
-- lists the unfinished instances a new binary's code would diverge from.
-- NULL for rows older than this migration.
ALTER TABLE keiro.workflows ADD COLUMN skeleton_hash TEXT;

-- `keiro list --version`, `retarget` and the versions holding due work:
-- one index range per version.
CREATE INDEX workflows_version_created
    ON keiro.workflows (app_version, created_at, id);
