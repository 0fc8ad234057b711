-- A run someone waits for from another process than the one that ends it
-- (Workflow.Wait on a client, an HTTP handler) is marked watched: the
-- statement that ends it then sends a notification on channel
-- pgdurable_run_ended with its run ID, which the waiting process listens
-- on, so its Wait returns as the end commits instead of at its next poll.
-- Runs nobody waits for in another process send nothing. The column is in
-- no index, so marking a run stays a HOT update.

-- +goose Up
ALTER TABLE workflow_runs ADD COLUMN watched boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE workflow_runs DROP COLUMN watched;
