-- A step given its input (StepOpts.Input) records a hash of it, which a
-- replay compares: a reordered pair of steps of one name is caught.
-- Nullable with no default: adding it rewrites nothing.

-- +goose Up
ALTER TABLE workflow_steps ADD COLUMN input_hash bigint;

-- +goose Down
ALTER TABLE workflow_steps DROP COLUMN input_hash;
