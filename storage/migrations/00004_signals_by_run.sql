-- Reading a run's signals (GET /v1/runs/{id}, engine runs show), consumed or not.

-- +goose Up
CREATE INDEX workflow_signals_run_idx ON workflow_signals (run_id, id);

-- +goose Down
DROP INDEX workflow_signals_run_idx;
