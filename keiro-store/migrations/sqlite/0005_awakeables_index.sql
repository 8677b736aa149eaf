-- Counting unanswered awakeables touches only awakeable rows.
CREATE INDEX keiro_steps_awakeables ON keiro_steps (workflow_id, generation, seq)
    WHERE kind = 'awakeable';
