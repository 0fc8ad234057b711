-- Continue-as-new: a run may end by starting a fresh run of its workflow
-- under the same workflow ID, with new input, in the transaction that ends
-- it. The ended run's status is continued and continued_run_id names the
-- run that took over; the chain of runs shares the workflow ID, which
-- names its latest run. The workflow ID is unique among runs that did not
-- continue: at most one run of a chain holds it at a time.

-- +goose Up
ALTER TABLE workflow_runs ADD COLUMN continued_run_id uuid;
ALTER TABLE workflow_runs DROP CONSTRAINT workflow_runs_status_check;
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_status_check CHECK (status IN (
        'pending', 'running', 'waiting', 'completed', 'failed',
        'compensating', 'compensated', 'cancelled', 'dead', 'continued'));
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_continued_check CHECK ((status = 'continued') = (continued_run_id IS NOT NULL));
CREATE UNIQUE INDEX workflow_runs_workflow_id_latest_key ON workflow_runs (workflow_name, workflow_id)
    WHERE status <> 'continued';
ALTER TABLE workflow_runs DROP CONSTRAINT workflow_runs_workflow_id_key;

-- +goose Down
DELETE FROM workflow_runs WHERE status = 'continued';
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_workflow_id_key UNIQUE (workflow_name, workflow_id);
DROP INDEX workflow_runs_workflow_id_latest_key;
ALTER TABLE workflow_runs DROP CONSTRAINT workflow_runs_continued_check;
ALTER TABLE workflow_runs DROP CONSTRAINT workflow_runs_status_check;
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_status_check CHECK (status IN (
        'pending', 'running', 'waiting', 'compensating', 'completed', 'failed',
        'compensated', 'cancelled', 'dead'));
ALTER TABLE workflow_runs DROP COLUMN continued_run_id;
