-- Debounce: starts of a workflow with one debounce key collapse into one
-- run while it waits out its window. The run is a delayed start (waiting,
-- its wake_at the window's end) that no delivery has started; a start
-- with the key updates its input and moves wake_at to its own window's
-- end, never past debounce_until (the first start's maximum wait).

-- +goose Up
ALTER TABLE workflow_runs ADD COLUMN debounce_key   text;
ALTER TABLE workflow_runs ADD COLUMN debounce_until timestamptz;
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_debounce_key_check CHECK (length(debounce_key) BETWEEN 1 AND 400);
CREATE UNIQUE INDEX workflow_runs_debounce_idx ON workflow_runs (workflow_name, debounce_key)
    WHERE debounce_key IS NOT NULL AND status = 'waiting' AND started_at IS NULL;

-- +goose Down
DROP INDEX workflow_runs_debounce_idx;
ALTER TABLE workflow_runs DROP CONSTRAINT workflow_runs_debounce_key_check, DROP COLUMN debounce_until, DROP COLUMN debounce_key;
