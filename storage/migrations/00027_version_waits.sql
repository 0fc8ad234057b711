-- A run whose workflow version the process that fetched it does not
-- register is handed back for a process that does. The first hand-back
-- stamps version_wait_since; the first delivery by a process that
-- registers the version clears it. Runs show it as their waiting reason,
-- and Stats (the metrics) count the runs waiting through the index, which
-- holds only those runs: the column is NULL on every other write, so the
-- index costs the hot path nothing.

-- +goose Up
ALTER TABLE workflow_runs ADD COLUMN version_wait_since timestamptz;
CREATE INDEX workflow_runs_version_wait_idx ON workflow_runs (queue, version_wait_since) WHERE version_wait_since IS NOT NULL;

-- +goose Down
DROP INDEX workflow_runs_version_wait_idx;
ALTER TABLE workflow_runs DROP COLUMN version_wait_since;
