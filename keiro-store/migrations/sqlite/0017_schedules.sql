-- Cron schedules: one row per schedule, shared by every worker of the
-- database. A `#[workflow(cron = "..")]` schedule is written (by name, the
-- workflow's) when a worker or a management call first sees it, with `input`
-- NULL: each tick's argument is the tick time. A dynamic schedule
-- (`Keiro::create_schedule`) stores the call's encoded arguments in `input`.
-- `paused` is 0 or 1; `last_tick` (µs since the Unix epoch) is the latest
-- tick a worker created an instance for, NULL before the first.
CREATE TABLE keiro_schedules (
    name TEXT PRIMARY KEY NOT NULL,
    cron TEXT NOT NULL,
    timezone TEXT NOT NULL,
    workflow TEXT NOT NULL,
    input TEXT,
    paused INTEGER NOT NULL DEFAULT 0,
    last_tick INTEGER,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
