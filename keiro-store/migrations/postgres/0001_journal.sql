CREATE SCHEMA IF NOT EXISTS keiro;

-- One row per workflow instance: its identity, state, lease and result.
CREATE TABLE keiro.workflows (
    id               TEXT    NOT NULL PRIMARY KEY,
    name             TEXT    NOT NULL,
    generation       BIGINT  NOT NULL DEFAULT 0,
    status           TEXT    NOT NULL,
    input            TEXT    NOT NULL,
    output           TEXT,
    error            TEXT,
    attempts         BIGINT  NOT NULL DEFAULT 0,
    lease_owner      TEXT,
    lease_expires_at BIGINT,
    wake_at          BIGINT,
    parent_id        TEXT,
    parent_seq       BIGINT,
    created_at       BIGINT  NOT NULL,
    updated_at       BIGINT  NOT NULL
);

-- Discovery of unfinished work touches only unfinished rows.
CREATE INDEX workflows_unfinished
    ON keiro.workflows (wake_at)
    WHERE status IN ('pending', 'running', 'suspended');

CREATE INDEX workflows_parent
    ON keiro.workflows (parent_id)
    WHERE parent_id IS NOT NULL;

-- One row per recorded step; the primary key makes a step id's result unique.
CREATE TABLE keiro.steps (
    workflow_id TEXT    NOT NULL,
    generation  BIGINT  NOT NULL,
    seq         BIGINT  NOT NULL,
    name        TEXT    NOT NULL,
    kind        TEXT    NOT NULL,
    result      TEXT    NOT NULL,
    created_at  BIGINT  NOT NULL,
    PRIMARY KEY (workflow_id, generation, seq)
);
