-- `wake_at` is when an unfinished instance is next due: now for a pending one,
-- its lease expiry for a running one, its wake time for a suspended one.
-- Discovery is an index range scan over it.
UPDATE keiro.workflows SET wake_at = COALESCE(lease_expires_at, updated_at)
    WHERE status IN ('pending', 'running', 'suspended') AND wake_at IS NULL;

CREATE INDEX workflows_lease_owner
    ON keiro.workflows (lease_owner)
    WHERE lease_owner IS NOT NULL;

-- One row per live executor identity: a second live process under the same
-- identity is refused.
CREATE TABLE keiro.executors (
    id           TEXT    NOT NULL PRIMARY KEY,
    token        TEXT    NOT NULL,
    host         TEXT    NOT NULL,
    pid          BIGINT  NOT NULL,
    heartbeat_at BIGINT  NOT NULL
);
