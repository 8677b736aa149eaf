-- Debounce (WorkflowCall::debounce). `debounce_key`: the key a burst of calls
-- of one workflow folds into one instance by; `debounce_until`: the latest
-- the burst's instance may start (its first call + max_wait), NULL for no
-- bound. A burst is open while its instance is pending and unclaimed: the
-- unique partial index below holds at most one open burst per workflow name
-- and key, and finds it. Retry, continue-as-new and requeue clear the key, so
-- an instance that ran never takes calls again.
ALTER TABLE keiro.workflows ADD COLUMN debounce_key TEXT;
ALTER TABLE keiro.workflows ADD COLUMN debounce_until BIGINT;
CREATE UNIQUE INDEX workflows_debounce_open ON keiro.workflows (name, debounce_key)
    WHERE debounce_key IS NOT NULL AND status = 'pending' AND lease_owner IS NULL;
