-- A queue claim counts each partition's running instances (all of them, and
-- the claiming executor's) off this index: it holds only the queue rows that
-- run now, so the count reads those and no others. The unfinished-rows index
-- would serve too, but once ANALYZE has statistics SQLite reads it by its
-- status list, every waiting row of the partition, instead of by 'running'.
CREATE INDEX keiro_workflows_queue_running
    ON keiro_workflows (queue, partition_key, lease_owner, lease_expires_at)
    WHERE queue IS NOT NULL AND status = 'running';
