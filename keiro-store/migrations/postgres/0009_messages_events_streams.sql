-- Messages sent to a workflow instance, one queue per (instance, topic),
-- delivered in `id` order. A received message is marked with the journal step
-- that took it (never deleted here), so a retried send with the same
-- idempotency key stays a no-op after delivery. Times are microseconds.
CREATE TABLE keiro.messages (
    id                  BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workflow_id         TEXT   NOT NULL,
    topic               TEXT   NOT NULL,
    payload             TEXT   NOT NULL,
    type_name           TEXT,
    idempotency_key     TEXT,
    sent_at             BIGINT NOT NULL,
    consumed_generation BIGINT,
    consumed_seq        BIGINT,
    consumed_at         BIGINT
);

-- The next message of a queue is the first entry of this index.
CREATE INDEX messages_waiting
    ON keiro.messages (workflow_id, topic, id)
    WHERE consumed_at IS NULL;

CREATE UNIQUE INDEX messages_idempotency
    ON keiro.messages (workflow_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- The last value a workflow set for each event key.
CREATE TABLE keiro.events (
    workflow_id TEXT   NOT NULL,
    key         TEXT   NOT NULL,
    value       TEXT   NOT NULL,
    type_name   TEXT,
    updated_at  BIGINT NOT NULL,
    PRIMARY KEY (workflow_id, key)
);

-- Append-only streams a workflow writes; a NULL value closes the stream.
CREATE TABLE keiro.streams (
    workflow_id TEXT   NOT NULL,
    key         TEXT   NOT NULL,
    position    BIGINT NOT NULL,
    value       TEXT,
    type_name   TEXT,
    written_at  BIGINT NOT NULL,
    PRIMARY KEY (workflow_id, key, position)
);
