-- What an operator needs of a dead job beyond its failing step: how many
-- times the run was delivered (a crash loop's deliveries), and, when a
-- compensation failed, the failure that started the compensation (the
-- dead job's error is then the undo's).

-- +goose Up
ALTER TABLE dead_jobs ADD COLUMN deliveries integer NOT NULL DEFAULT 0,
                      ADD COLUMN forward_error jsonb;

-- +goose Down
ALTER TABLE dead_jobs DROP COLUMN deliveries, DROP COLUMN forward_error;
