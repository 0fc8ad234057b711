-- An operator may terminate a run (Engine.Terminate): it ends at once,
-- status terminated, without running its compensations; its error records
-- who terminated it and why.

-- +goose Up
ALTER TABLE workflow_runs DROP CONSTRAINT workflow_runs_status_check;
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_status_check CHECK (status IN (
        'pending', 'running', 'waiting', 'completed', 'failed',
        'compensating', 'compensated', 'cancelled', 'dead', 'continued', 'terminated'));

-- +goose Down
UPDATE workflow_runs SET status = 'cancelled' WHERE status = 'terminated';
ALTER TABLE workflow_runs DROP CONSTRAINT workflow_runs_status_check;
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_status_check CHECK (status IN (
        'pending', 'running', 'waiting', 'completed', 'failed',
        'compensating', 'compensated', 'cancelled', 'dead', 'continued'));
