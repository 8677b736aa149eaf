-- Retention (keiro.gc). Each index serves one of its scans; the partial ones
-- hold only the rows that scan can delete. Finished roots are found through
-- the (status, created_at, id) index of migration 0012, so a finishing
-- instance pays for no index of gc's.

-- Instances continued as new, whose older generations' journals age out.
CREATE INDEX keiro_workflows_continued
    ON keiro_workflows (id)
    WHERE generation > 0;

-- Fired and cancelled timers by age.
CREATE INDEX keiro_timers_final
    ON keiro_timers (status, updated_at, id)
    WHERE status IN ('fired', 'cancelled');

-- Every message of an instance, consumed or not (the waiting index holds
-- only unconsumed ones). Not keyed on the consuming generation: taking a
-- message then changes no column of this index.
CREATE INDEX keiro_messages_workflow
    ON keiro_messages (workflow_id);
