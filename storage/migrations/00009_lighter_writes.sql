-- Less written per run. Step records lose their foreign key to the run: the
-- engine writes a run's steps only under the run's lease, in statements that
-- update the run row itself, and the key's check cost a lookup and a row
-- lock on every step record. (A run is deleted with its steps explicitly;
-- ON DELETE CASCADE is gone with the key.) The index by status keeps only the
-- statuses that are few and looked for (active and dead): a run that ends
-- completed, failed, compensated or cancelled no longer adds an entry, and a
-- list of those statuses reads the primary key newest first.

-- +goose Up
ALTER TABLE workflow_steps DROP CONSTRAINT workflow_steps_run_id_fkey;
DROP INDEX workflow_runs_status_idx;
CREATE INDEX workflow_runs_open_status_idx ON workflow_runs (status, run_id DESC)
    WHERE status IN ('pending', 'running', 'waiting', 'compensating', 'dead');

-- +goose Down
DROP INDEX workflow_runs_open_status_idx;
CREATE INDEX workflow_runs_status_idx ON workflow_runs (status, run_id DESC);
DELETE FROM workflow_steps s WHERE NOT EXISTS (SELECT 1 FROM workflow_runs r WHERE r.run_id = s.run_id);
ALTER TABLE workflow_steps ADD CONSTRAINT workflow_steps_run_id_fkey
    FOREIGN KEY (run_id) REFERENCES workflow_runs (run_id) ON DELETE CASCADE;
