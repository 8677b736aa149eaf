-- The queues each resume worker's binary declares (`keiro::queue!`), so a
-- caller waiting on an instance of a queue no live worker claims from is
-- told, instead of waiting forever. Liveness comes from the executor's
-- heartbeat in keiro_executors.
-- `limits` is the worker's declaration of the queue, as text, so a worker
-- whose limits differ from another live one's (mid-deploy) says so.
CREATE TABLE keiro_worker_queues (
    executor_id TEXT NOT NULL,
    name        TEXT NOT NULL,
    limits      TEXT NOT NULL,
    PRIMARY KEY (executor_id, name)
);

CREATE INDEX keiro_worker_queues_name ON keiro_worker_queues (name);
