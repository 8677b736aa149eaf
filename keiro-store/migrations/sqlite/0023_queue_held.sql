-- A hold on a queue slot (an instance cancelled or timed out while it ran,
-- whose run has not stopped yet: see 0022) is its lease's expiry without an
-- owner, whatever its status: a retry puts such an instance back in line
-- as `pending` while its old run may still go on, and the hold keeps
-- counting until that run lets go. The queue's claims count holds off this
-- index, which holds every such row. (keiro_workflows_queue_ending stays for
-- processes of the previous release, which name it on SQLite, until a
-- later migration drops it.)
CREATE INDEX keiro_workflows_queue_held
    ON keiro_workflows (queue, partition_key, lease_expires_at)
    WHERE queue IS NOT NULL AND lease_owner IS NULL AND lease_expires_at IS NOT NULL;
-- The executor whose run holds it: its worker counts the hold against the
-- queue's `worker_concurrency`, and only that run frees it (a stale run of
-- another executor, whose lease lapsed before this one took the instance
-- over, does not).
ALTER TABLE keiro_workflows ADD COLUMN held_by TEXT;
