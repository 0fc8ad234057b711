-- Routes: how many groups of the per-run tables (workflow_runs,
-- workflow_steps, workflow_signals, dead_jobs) the installation spreads its
-- runs over. Route 0 is this schema's tables; route k >= 1 is the same
-- tables in schema <schema>_r<k>, made by migrate up --routes and migrated
-- with this one. A run's route is fixed when it starts (by its workflow
-- ID), and its run ID carries it. One row; routes never shrink.

-- +goose Up
CREATE TABLE layout (
    only_row boolean NOT NULL DEFAULT true,
    routes   integer NOT NULL DEFAULT 1,
    CONSTRAINT layout_pkey PRIMARY KEY (only_row),
    CONSTRAINT layout_only_row_check CHECK (only_row),
    CONSTRAINT layout_routes_check CHECK (routes BETWEEN 1 AND 256)
);
INSERT INTO layout DEFAULT VALUES;

-- +goose Down
DROP TABLE layout;
