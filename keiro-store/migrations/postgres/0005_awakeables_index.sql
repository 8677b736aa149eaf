-- Counting unanswered awakeables touches only awakeable rows.
CREATE INDEX steps_awakeables ON keiro.steps (workflow_id, generation, seq)
    WHERE kind = 'awakeable';
