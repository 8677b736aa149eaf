-- From this migration on, every time column holds MICROSECONDS since the Unix
-- epoch (before it: milliseconds), the unit the journal's sleep deadlines
-- already use, so a deadline reaches `wake_at` without rounding.
--
-- Each stored time is multiplied by 1000, so it names the same instant; NULLs
-- stay NULL (the function is STRICT). A time so far out that it would overflow
-- BIGINT (a saturated "never", ~292,000 years away) is clamped first, so it
-- stays "never" instead of failing the migration. Counts, ids, sequence
-- numbers, generations and pids are not times and stay as they are.
CREATE FUNCTION pg_temp.keiro_ms_to_us(ms BIGINT) RETURNS BIGINT
    LANGUAGE SQL IMMUTABLE STRICT
    AS $$ SELECT LEAST(GREATEST(ms, -9223372036854775), 9223372036854775) * 1000 $$;

UPDATE keiro.workflows SET
    lease_expires_at = pg_temp.keiro_ms_to_us(lease_expires_at),
    wake_at          = pg_temp.keiro_ms_to_us(wake_at),
    created_at       = pg_temp.keiro_ms_to_us(created_at),
    updated_at       = pg_temp.keiro_ms_to_us(updated_at);

UPDATE keiro.steps SET created_at = pg_temp.keiro_ms_to_us(created_at);

UPDATE keiro.executors SET heartbeat_at = pg_temp.keiro_ms_to_us(heartbeat_at);

UPDATE keiro.timers SET
    fire_at            = pg_temp.keiro_ms_to_us(fire_at),
    claimed_at         = pg_temp.keiro_ms_to_us(claimed_at),
    resume_lease_until = pg_temp.keiro_ms_to_us(resume_lease_until),
    created_at         = pg_temp.keiro_ms_to_us(created_at),
    updated_at         = pg_temp.keiro_ms_to_us(updated_at);

DROP FUNCTION pg_temp.keiro_ms_to_us(BIGINT);
