-- Retention (keiro.gc). Each index serves one of its scans and holds only
-- the rows that scan can delete, so the hot path pays for them only when an
-- instance finishes, a timer ends or a message is written.

-- Finished root instances by age, per status. The gc scan repeats the
-- `WHERE` term by term, as the SQLite twin of this migration needs.
CREATE INDEX workflows_finished_roots
    ON keiro.workflows (status, updated_at, id)
    WHERE parent_id IS NULL AND status IN ('completed', 'timed_out', 'failed', 'cancelled');

-- Instances continued as new, whose older generations' journals age out.
CREATE INDEX workflows_continued
    ON keiro.workflows (id)
    WHERE generation > 0;

-- Fired and cancelled timers by age.
CREATE INDEX timers_final
    ON keiro.timers (status, updated_at, id)
    WHERE status IN ('fired', 'cancelled');

-- Every message of an instance, consumed or not (the waiting index holds
-- only unconsumed ones), by the generation that consumed it.
CREATE INDEX messages_workflow
    ON keiro.messages (workflow_id, consumed_generation);
