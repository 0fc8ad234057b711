-- engine.Patched records the changes a run takes on the record of the step
-- that follows the call, instead of a marker row of its own: a patch then
-- costs nothing. The change IDs, newline-separated (a change ID holds no
-- control character). Marker rows (kind patch) written before stay valid.
-- Nullable with no default: adding it rewrites nothing.

-- +goose Up
ALTER TABLE workflow_steps ADD COLUMN patches text;

-- +goose Down
ALTER TABLE workflow_steps DROP COLUMN patches;
