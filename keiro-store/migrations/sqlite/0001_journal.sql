-- One row per workflow instance: its identity, state, lease and result.
CREATE TABLE keiro_workflows (
    id               TEXT    NOT NULL PRIMARY KEY,
    name             TEXT    NOT NULL,
    generation       INTEGER NOT NULL DEFAULT 0,
    status           TEXT    NOT NULL,
    input            TEXT    NOT NULL,
    output           TEXT,
    error            TEXT,
    attempts         INTEGER NOT NULL DEFAULT 0,
    lease_owner      TEXT,
    lease_expires_at INTEGER,
    wake_at          INTEGER,
    parent_id        TEXT,
    parent_seq       INTEGER,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
);

-- Discovery of unfinished work touches only unfinished rows.
CREATE INDEX keiro_workflows_unfinished
    ON keiro_workflows (wake_at)
    WHERE status IN ('pending', 'running', 'suspended');

CREATE INDEX keiro_workflows_parent
    ON keiro_workflows (parent_id)
    WHERE parent_id IS NOT NULL;

-- One row per recorded step; the primary key makes a step id's result unique.
CREATE TABLE keiro_steps (
    workflow_id TEXT    NOT NULL,
    generation  INTEGER NOT NULL,
    seq         INTEGER NOT NULL,
    name        TEXT    NOT NULL,
    kind        TEXT    NOT NULL,
    result      TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (workflow_id, generation, seq)
) WITHOUT ROWID;
