-- The W3C `traceparent` of the span that started or enqueued the instance
-- (feature `otel` of keiro), so every run of it, in whichever process,
-- continues that trace. NULL when there was no OpenTelemetry context, and
-- for rows older than this migration.
ALTER TABLE keiro_workflows ADD COLUMN traceparent TEXT;
