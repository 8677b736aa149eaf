-- Durable timers for process managers and workflow sleeps: one row per timer.
--
-- status: scheduled -> firing (claimed by a worker) -> fired | scheduled
-- (retry, requeue) | dead (dead-lettered) | cancelled; dead -> resuming (a
-- guarded foreground claim holding resume_token until resume_lease_until)
-- -> fired | dead | cancelled. Times are milliseconds since the Unix epoch.
CREATE TABLE keiro_timers (
    id                 TEXT    NOT NULL PRIMARY KEY,
    process_manager    TEXT    NOT NULL,
    correlation_id     TEXT    NOT NULL,
    fire_at            INTEGER NOT NULL,
    payload            TEXT    NOT NULL CHECK (json_valid(payload)),
    status             TEXT    NOT NULL,
    attempts           INTEGER NOT NULL DEFAULT 0,
    last_error         TEXT,
    event_id           TEXT,
    claimed_at         INTEGER,
    resume_token       TEXT,
    resume_lease_until INTEGER,
    created_at         INTEGER NOT NULL,
    updated_at         INTEGER NOT NULL
);

-- Claiming the earliest due timer and paging through pending ones.
CREATE INDEX keiro_timers_scheduled
    ON keiro_timers (fire_at, id)
    WHERE status = 'scheduled';

-- Requeueing and paging through stale claims.
CREATE INDEX keiro_timers_firing
    ON keiro_timers (claimed_at, id)
    WHERE status = 'firing';

-- Paging through dead letters, newest last.
CREATE INDEX keiro_timers_dead
    ON keiro_timers (updated_at, id)
    WHERE status = 'dead';

-- Recovering expired foreground resume claims.
CREATE INDEX keiro_timers_resuming
    ON keiro_timers (resume_lease_until)
    WHERE status = 'resuming';
