-- A queue claim reads each partition's takeable rows in run order (priority,
-- then creation) straight off this index, and skips from one partition key
-- to the next through it, instead of numbering every row of the queue.
CREATE INDEX keiro_workflows_queue_order
    ON keiro_workflows (queue, partition_key, priority, created_at, id)
    WHERE queue IS NOT NULL AND status IN ('pending', 'running', 'suspended');
