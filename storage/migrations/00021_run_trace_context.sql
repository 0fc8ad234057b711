-- The W3C trace context (traceparent, tracestate) of the span that started
-- a run, as a JSON object, NULL when the start was not traced: every
-- delivery of the run, in any process, continues that trace.

-- +goose Up
ALTER TABLE workflow_runs ADD COLUMN trace_context jsonb;

-- +goose Down
ALTER TABLE workflow_runs DROP COLUMN trace_context;
