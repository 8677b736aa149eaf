-- What an instance's workflow looks like (its argument and return types), so a
-- worker whose workflow of the same name has other types leaves it alone.
-- NULL for rows from before this migration: they match any signature.
ALTER TABLE keiro_workflows ADD COLUMN signature TEXT;
-- The generation-0 arguments, kept once continue-as-new replaces `input`, so
-- a caller re-attaching with the original arguments is recognised.
ALTER TABLE keiro_workflows ADD COLUMN first_input TEXT;
