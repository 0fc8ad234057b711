-- A parent waiting for a child that is parked as dead is parked too, with
-- reason child_dead: its dead job names the child run and the child's dead
-- job, so replaying either one replays both.

-- +goose Up
ALTER TABLE dead_jobs DROP CONSTRAINT dead_jobs_reason_check;
ALTER TABLE dead_jobs ADD CONSTRAINT dead_jobs_reason_check CHECK (reason IN (
    'retries_exhausted', 'permanent_error', 'panic', 'nondeterminism', 'poison_input',
    'crash_loop', 'compensation_failed', 'timeout', 'child_dead'));
ALTER TABLE dead_jobs ADD COLUMN child_run_id uuid, ADD COLUMN child_dead_job_id uuid;

-- +goose Down
ALTER TABLE dead_jobs DROP COLUMN child_run_id, DROP COLUMN child_dead_job_id;
DELETE FROM dead_jobs WHERE reason = 'child_dead';
ALTER TABLE dead_jobs DROP CONSTRAINT dead_jobs_reason_check;
ALTER TABLE dead_jobs ADD CONSTRAINT dead_jobs_reason_check CHECK (reason IN (
    'retries_exhausted', 'permanent_error', 'panic', 'nondeterminism', 'poison_input',
    'crash_loop', 'compensation_failed', 'timeout'));
