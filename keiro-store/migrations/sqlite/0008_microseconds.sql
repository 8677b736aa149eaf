-- From this migration on, every time column holds MICROSECONDS since the Unix
-- epoch (before it: milliseconds), the unit the journal's sleep deadlines
-- already use, so a deadline reaches `wake_at` without rounding.
--
-- Each stored time is multiplied by 1000, so it names the same instant; NULLs
-- stay NULL (min/max of a NULL is NULL). A time so far out that it would
-- overflow a 64-bit integer (a saturated "never", ~292,000 years away) is
-- clamped first, so it stays "never" instead of turning into a REAL. Counts,
-- ids, sequence numbers, generations and pids are not times and stay as they are.
UPDATE keiro_workflows SET
    lease_expires_at = MIN(MAX(lease_expires_at, -9223372036854775), 9223372036854775) * 1000,
    wake_at          = MIN(MAX(wake_at, -9223372036854775), 9223372036854775) * 1000,
    created_at       = MIN(MAX(created_at, -9223372036854775), 9223372036854775) * 1000,
    updated_at       = MIN(MAX(updated_at, -9223372036854775), 9223372036854775) * 1000;

UPDATE keiro_steps SET
    created_at = MIN(MAX(created_at, -9223372036854775), 9223372036854775) * 1000;

UPDATE keiro_executors SET
    heartbeat_at = MIN(MAX(heartbeat_at, -9223372036854775), 9223372036854775) * 1000;

UPDATE keiro_timers SET
    fire_at            = MIN(MAX(fire_at, -9223372036854775), 9223372036854775) * 1000,
    claimed_at         = MIN(MAX(claimed_at, -9223372036854775), 9223372036854775) * 1000,
    resume_lease_until = MIN(MAX(resume_lease_until, -9223372036854775), 9223372036854775) * 1000,
    created_at         = MIN(MAX(created_at, -9223372036854775), 9223372036854775) * 1000,
    updated_at         = MIN(MAX(updated_at, -9223372036854775), 9223372036854775) * 1000;
