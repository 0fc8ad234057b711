-- A run may have a timeout (StartOpts.RunTimeout): its clock starts when
-- a worker first picks it up, which sets deadline_at; at the deadline the
-- sweep requests its cancellation, so it compensates and ends cancelled.
-- The index holds only runs with a deadline not yet ended; a run leaves it
-- when it ends (deadline_at is cleared).

-- +goose Up
ALTER TABLE workflow_runs ADD COLUMN run_timeout_ms bigint;
ALTER TABLE workflow_runs ADD COLUMN deadline_at timestamptz;
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_run_timeout_check CHECK (run_timeout_ms > 0);
CREATE INDEX workflow_runs_deadline_sweep_idx ON workflow_runs (queue, deadline_at) WHERE deadline_at IS NOT NULL;

-- +goose Down
DROP INDEX workflow_runs_deadline_sweep_idx;
ALTER TABLE workflow_runs DROP COLUMN deadline_at;
ALTER TABLE workflow_runs DROP COLUMN run_timeout_ms;
