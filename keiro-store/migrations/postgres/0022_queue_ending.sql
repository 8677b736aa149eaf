-- An instance of a named queue cancelled or timed out while it runs keeps
-- its lease until its run has stopped (the run then drops it; else it
-- lapses), and the queue's claims count it as running meanwhile, off this
-- index: it holds only those few rows, so the count costs a probe.
CREATE INDEX workflows_queue_ending
    ON keiro.workflows (queue, partition_key, lease_owner, lease_expires_at)
    WHERE queue IS NOT NULL AND status IN ('cancelled', 'timed_out')
    AND lease_expires_at IS NOT NULL;
