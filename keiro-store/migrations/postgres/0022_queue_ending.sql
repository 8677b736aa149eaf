-- An instance of a named queue cancelled or timed out while it runs keeps
-- its lease's expiry until its run has stopped (the run then clears it;
-- else it passes), and the queue's claims count it as running meanwhile,
-- off this index: it holds only those rows, and a count reads only the
-- entries whose expiry is still ahead.
CREATE INDEX workflows_queue_ending
    ON keiro.workflows (queue, partition_key, lease_expires_at)
    WHERE queue IS NOT NULL AND status IN ('cancelled', 'timed_out')
    AND lease_expires_at IS NOT NULL;
