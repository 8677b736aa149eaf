-- The unfinished queued instances that have a deadline, by deadline: a
-- resume pass ends those whose deadline passed and that no live run holds
-- (waiting for a slot, suspended, or left by a worker that died) as timed
-- out, since a queue's claims leave them (an expired instance takes no
-- slot and no start of the queue's); they would otherwise wait for a slot
-- only to be ended then.
CREATE INDEX keiro_workflows_queue_deadline
    ON keiro_workflows (deadline)
    WHERE queue IS NOT NULL AND deadline IS NOT NULL AND status IN ('pending', 'running', 'suspended');
