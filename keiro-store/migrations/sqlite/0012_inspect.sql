-- What a suspended instance waits on, written by the statement that suspends
-- it (so listing costs no journal read): the step's seq, the kind of wait
-- ('sleep', 'awakeable', 'child', 'message') and its name (the sleep's name,
-- the child's workflow, the message topic). Read only while the instance is
-- suspended; NULL when it waits on nothing keiro can name.
ALTER TABLE keiro_workflows ADD COLUMN waiting_seq INTEGER;
ALTER TABLE keiro_workflows ADD COLUMN waiting_kind TEXT;
ALTER TABLE keiro_workflows ADD COLUMN waiting_name TEXT;

-- How a `#[step]`'s body ran before its result was recorded: the attempts
-- it took (retries included) and when the first began (µs since the Unix
-- epoch). NULL for other entries and for rows older than this migration.
-- `created_at` is when the result was recorded.
ALTER TABLE keiro_steps ADD COLUMN attempts INTEGER;
ALTER TABLE keiro_steps ADD COLUMN started_at INTEGER;

-- Keyset pages of `keiro.list` filtered by status or by workflow name, in
-- creation order either way: one index range scan per page.
CREATE INDEX keiro_workflows_status_created
    ON keiro_workflows (status, created_at, id);
CREATE INDEX keiro_workflows_name_created
    ON keiro_workflows (name, created_at, id);
