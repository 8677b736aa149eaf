-- When the instance times out (µs since the Unix epoch): at this instant it
-- and its unfinished descendants end as 'timed_out'. NULL: no deadline. A
-- child's is the earlier of its own and its parent's, fixed at creation.
ALTER TABLE keiro_workflows ADD COLUMN deadline INTEGER;
