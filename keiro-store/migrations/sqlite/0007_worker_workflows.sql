-- The workflow names each resume worker's binary registers, so a caller
-- waiting on an instance can tell that no live worker will ever run it.
-- Liveness comes from the executor's heartbeat in keiro_executors.
CREATE TABLE keiro_worker_workflows (
    executor_id TEXT NOT NULL,
    name        TEXT NOT NULL,
    PRIMARY KEY (executor_id, name)
);

CREATE INDEX keiro_worker_workflows_name ON keiro_worker_workflows (name);
