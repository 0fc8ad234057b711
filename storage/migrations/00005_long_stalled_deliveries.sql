-- Crash-loop attribution: of a run's stalled deliveries (deliveries since its
-- last progress), how many lived for a whole lease before they died. A worker
-- that a poison run kills takes every run in flight with it; a delivery that
-- had already run for a lease is unlikely to be the one that killed it, so it
-- counts only toward a limit five times MaxDeliveries (engine/executor.go).

-- +goose Up
ALTER TABLE workflow_runs ADD COLUMN long_stalled_deliveries integer NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE workflow_runs DROP COLUMN long_stalled_deliveries;
