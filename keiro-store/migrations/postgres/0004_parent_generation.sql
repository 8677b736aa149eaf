-- The parent generation a child reports to (a parent may continue-as-new).
ALTER TABLE keiro.workflows ADD COLUMN parent_generation BIGINT;
UPDATE keiro.workflows SET parent_generation = 0 WHERE parent_id IS NOT NULL;
