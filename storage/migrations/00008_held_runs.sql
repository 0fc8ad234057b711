-- A run started while every worker of its starting process is busy is held
-- in that process's memory, with no River job, until a worker frees up:
-- held_until says until when. If the process dies (or is still busy then),
-- the sweep gives the run a River job once held_until has passed.

-- +goose Up
ALTER TABLE workflow_runs ADD COLUMN held_until timestamptz;
CREATE INDEX workflow_runs_held_sweep_idx ON workflow_runs (queue, held_until) WHERE held_until IS NOT NULL;

-- +goose Down
DROP INDEX workflow_runs_held_sweep_idx;
ALTER TABLE workflow_runs DROP COLUMN held_until;
