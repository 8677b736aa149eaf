-- The parent generation a child reports to (a parent may continue-as-new).
ALTER TABLE keiro_workflows ADD COLUMN parent_generation INTEGER;
UPDATE keiro_workflows SET parent_generation = 0 WHERE parent_id IS NOT NULL;
