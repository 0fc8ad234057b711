-- A Select (waiting for the first of several futures, child runs, signals
-- and timers) is recorded as a step of its own kind, select, holding which
-- case won.

-- +goose Up
ALTER TABLE workflow_steps DROP CONSTRAINT workflow_steps_kind_check;
ALTER TABLE workflow_steps ADD CONSTRAINT workflow_steps_kind_check CHECK (kind IN (
        'step', 'tx', 'activity', 'sleep', 'signal', 'child', 'compensation', 'select'));

-- +goose Down
DELETE FROM workflow_steps WHERE kind = 'select';
ALTER TABLE workflow_steps DROP CONSTRAINT workflow_steps_kind_check;
ALTER TABLE workflow_steps ADD CONSTRAINT workflow_steps_kind_check CHECK (kind IN (
        'step', 'tx', 'activity', 'sleep', 'signal', 'child', 'compensation'));
