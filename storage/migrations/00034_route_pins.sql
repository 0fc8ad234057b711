-- Route pins: a schema that held runs when it was given routes (migrate up
-- --routes on a schema with one route) keeps those runs in route 0, where
-- their run IDs, which carry no route, say they are. pins is a Bloom
-- filter of their workflow IDs, deduplication IDs and debounce keys, which
-- the migration writes once and every engine reads with the routes: a
-- start whose key it holds goes to route 0 too, where that key's earlier
-- runs are. NULL: the routes were made before the schema held a run.

-- +goose Up
ALTER TABLE layout ADD COLUMN pins bytea;

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM layout WHERE pins IS NOT NULL) THEN
        RAISE EXCEPTION 'the routes of this schema keep the runs it held before them in route 0 (layout.pins): rolling back would look for their workflow IDs in other routes';
    END IF;
END
$$;
-- +goose StatementEnd
ALTER TABLE layout DROP COLUMN pins;
