-- A run started by ContinueAsNew records the first run of its chain
-- (first_run_id; NULL on a chain's first run), so a start retried with
-- the chain's workflow ID and its first input, after the chain moved on,
-- is recognised as the same start and returns the latest run.

-- +goose Up
ALTER TABLE workflow_runs ADD COLUMN first_run_id uuid;

-- +goose Down
ALTER TABLE workflow_runs DROP COLUMN first_run_id;
