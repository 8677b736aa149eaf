-- Durable timers for process managers and workflow sleeps: one row per timer.
--
-- status: scheduled -> firing (claimed by a worker) -> fired | scheduled
-- (retry, requeue) | dead (dead-lettered) | cancelled; dead -> resuming (a
-- guarded foreground claim holding resume_token until resume_lease_until)
-- -> fired | dead | cancelled. Times are milliseconds since the Unix epoch.
CREATE TABLE keiro.timers (
    id                 TEXT    NOT NULL PRIMARY KEY,
    process_manager    TEXT    NOT NULL,
    correlation_id     TEXT    NOT NULL,
    fire_at            BIGINT  NOT NULL,
    payload            JSON    NOT NULL,
    status             TEXT    NOT NULL,
    attempts           BIGINT  NOT NULL DEFAULT 0,
    last_error         TEXT,
    event_id           TEXT,
    claimed_at         BIGINT,
    resume_token       TEXT,
    resume_lease_until BIGINT,
    created_at         BIGINT  NOT NULL,
    updated_at         BIGINT  NOT NULL
);

-- Claiming the earliest due timer and paging through pending ones.
CREATE INDEX timers_scheduled
    ON keiro.timers (fire_at, id)
    WHERE status = 'scheduled';

-- Requeueing and paging through stale claims.
CREATE INDEX timers_firing
    ON keiro.timers (claimed_at, id)
    WHERE status = 'firing';

-- Paging through dead letters, newest last.
CREATE INDEX timers_dead
    ON keiro.timers (updated_at, id)
    WHERE status = 'dead';

-- Recovering expired foreground resume claims.
CREATE INDEX timers_resuming
    ON keiro.timers (resume_lease_until)
    WHERE status = 'resuming';
