-- What a suspended instance waits on, written by the statement that suspends
-- it (so listing costs no journal read): the step's seq, the kind of wait
-- ('sleep', 'awakeable', 'child', 'message') and its name (the sleep's name,
-- the child's workflow, the message topic). Read only while the instance is
-- suspended; NULL when it waits on nothing keiro can name.
ALTER TABLE keiro.workflows ADD COLUMN waiting_seq BIGINT;
ALTER TABLE keiro.workflows ADD COLUMN waiting_kind TEXT;
ALTER TABLE keiro.workflows ADD COLUMN waiting_name TEXT;

-- How a `#[step]`'s body ran before its result was recorded: the attempts
-- it took (retries included) and when the first began (µs since the Unix
-- epoch). NULL for other entries and for rows older than this migration.
-- `created_at` is when the result was recorded.
ALTER TABLE keiro.steps ADD COLUMN attempts BIGINT;
ALTER TABLE keiro.steps ADD COLUMN started_at BIGINT;

-- Keyset pages of `keiro.list` filtered by status or by workflow name, in
-- creation order either way: one index range scan per page.
CREATE INDEX workflows_status_created
    ON keiro.workflows (status, created_at, id);
CREATE INDEX workflows_name_created
    ON keiro.workflows (name, created_at, id);
