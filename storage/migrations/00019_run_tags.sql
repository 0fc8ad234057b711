-- Tags are a run's key/value labels (StartOpts.Tags: {"customer": "c_42",
-- "region": "eu"}), NULL for none, that run lists filter by (@>). The
-- index holds only tagged runs, so an untagged start writes no entry.

-- +goose Up
ALTER TABLE workflow_runs ADD COLUMN tags jsonb;
CREATE INDEX workflow_runs_tags_idx ON workflow_runs USING gin (tags jsonb_path_ops) WHERE tags IS NOT NULL;

-- +goose Down
DROP INDEX workflow_runs_tags_idx;
ALTER TABLE workflow_runs DROP COLUMN tags;
