-- engine.Patched records a marker, a step of its own kind, patch, where a
-- run takes the new code of a change.

-- +goose Up
ALTER TABLE workflow_steps DROP CONSTRAINT workflow_steps_kind_check;
ALTER TABLE workflow_steps ADD CONSTRAINT workflow_steps_kind_check CHECK (kind IN (
        'step', 'tx', 'activity', 'sleep', 'signal', 'child', 'compensation', 'select', 'patch'));

-- +goose Down
DELETE FROM workflow_steps WHERE kind = 'patch';
ALTER TABLE workflow_steps DROP CONSTRAINT workflow_steps_kind_check;
ALTER TABLE workflow_steps ADD CONSTRAINT workflow_steps_kind_check CHECK (kind IN (
        'step', 'tx', 'activity', 'sleep', 'signal', 'child', 'compensation', 'select'));
