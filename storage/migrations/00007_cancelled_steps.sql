-- A step the run's cancellation stopped before it finished (a retry that
-- was waiting, an activity whose failed attempts had no effect) is recorded
-- as cancelled, so a finished run never shows a step still "retrying".

-- +goose Up
ALTER TABLE workflow_steps DROP CONSTRAINT workflow_steps_status_check;
ALTER TABLE workflow_steps ADD CONSTRAINT workflow_steps_status_check
        CHECK (status IN ('started', 'completed', 'failed', 'retrying', 'parked', 'cancelled'));

-- +goose Down
UPDATE workflow_steps SET status = 'retrying' WHERE status = 'cancelled';
ALTER TABLE workflow_steps DROP CONSTRAINT workflow_steps_status_check;
ALTER TABLE workflow_steps ADD CONSTRAINT workflow_steps_status_check
        CHECK (status IN ('started', 'completed', 'failed', 'retrying', 'parked'));
