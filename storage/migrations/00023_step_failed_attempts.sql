-- The failed attempts of a step, newest last, for people (engine.StepInfo's
-- FailedAttempts, the web UI's attempt history): a JSON array of at most 20
-- entries {"attempt", "status", "class", "message", "at"} (the message cut
-- to 300 characters; "at" is when the failure was recorded, which for an
-- attempt lost with its worker is when the next delivery found it), and
-- {"replayed": true, "at"} where a dead job's replay started the count
-- again. NULL for a step that never failed. The record writes keep it; the
-- executor never reads it.

-- +goose Up
ALTER TABLE workflow_steps ADD COLUMN failed_attempts jsonb;
ALTER TABLE workflow_steps ADD CONSTRAINT workflow_steps_failed_attempts_check CHECK (failed_attempts IS NULL OR jsonb_typeof(failed_attempts) = 'array');

-- +goose Down
ALTER TABLE workflow_steps DROP COLUMN failed_attempts;
