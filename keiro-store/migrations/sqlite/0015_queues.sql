-- Queues (keiro::queue!). NULL `queue`: the default queue, claimed as before.
-- `priority`: lower runs first within a queue. `partition_key`: the queue's
-- limits apply per key ('' when none was given). `dedup_key`: at most one
-- unfinished instance per queue and key (the unique partial index below).
-- `queue_started_at`: when a worker first claimed it, what rate limits count.
ALTER TABLE keiro_workflows ADD COLUMN queue TEXT;
ALTER TABLE keiro_workflows ADD COLUMN priority BIGINT NOT NULL DEFAULT 0;
ALTER TABLE keiro_workflows ADD COLUMN partition_key TEXT NOT NULL DEFAULT '';
ALTER TABLE keiro_workflows ADD COLUMN dedup_key TEXT;
ALTER TABLE keiro_workflows ADD COLUMN queue_started_at BIGINT;
CREATE UNIQUE INDEX keiro_workflows_queue_dedup ON keiro_workflows (queue, dedup_key)
    WHERE dedup_key IS NOT NULL AND status IN ('pending', 'running', 'suspended');
-- A queue claim's candidates and its running and started counts.
CREATE INDEX keiro_workflows_queue_unfinished ON keiro_workflows (queue, partition_key, status)
    WHERE queue IS NOT NULL AND status IN ('pending', 'running', 'suspended');
CREATE INDEX keiro_workflows_queue_started ON keiro_workflows (queue, partition_key, queue_started_at)
    WHERE queue_started_at IS NOT NULL;
-- The default queue's claim passes over queued rows without reading them.
CREATE INDEX keiro_workflows_default_due ON keiro_workflows (wake_at)
    WHERE queue IS NULL AND status IN ('pending', 'running', 'suspended');
