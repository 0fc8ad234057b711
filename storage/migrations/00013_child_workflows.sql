-- Child workflows. A run started by a workflow (StartChild) records its
-- parent: the parent's run (parent_run_id, a column since the first
-- migration), the parent's step position that started it (parent_seq,
-- which with parent_run_id names the child in the parent's records), and
-- what happens to it when the parent closes while it still runs
-- (parent_close_policy). When a child ends, the statement that ends it
-- wakes its parent if the parent waits for that position: the parent's
-- await_signal then holds the position as a token that no signal name can
-- be (a record separator, chr(30), and the position), among any signal
-- names it also waits for.

-- +goose Up
ALTER TABLE workflow_runs ADD COLUMN parent_seq integer,
    ADD COLUMN parent_close_policy text;
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_parent_check CHECK (
        (parent_run_id IS NULL) = (parent_seq IS NULL) AND (parent_run_id IS NULL) = (parent_close_policy IS NULL));
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_parent_close_policy_check CHECK (parent_close_policy IN ('cancel', 'abandon', 'wait'));
-- A parent's children, by the position that started them.
CREATE INDEX workflow_runs_parent_idx ON workflow_runs (parent_run_id, parent_seq) WHERE parent_run_id IS NOT NULL;

-- +goose Down
DROP INDEX workflow_runs_parent_idx;
ALTER TABLE workflow_runs DROP CONSTRAINT workflow_runs_parent_close_policy_check,
    DROP CONSTRAINT workflow_runs_parent_check,
    DROP COLUMN parent_close_policy, DROP COLUMN parent_seq;
