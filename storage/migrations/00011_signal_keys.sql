-- A signal may carry an idempotency key, unique per run: a sender's retry
-- (an HTTP client that lost the response) with the same key is recognised
-- and stored once, so the run receives the signal once.

-- +goose Up
ALTER TABLE workflow_signals ADD COLUMN idempotency_key text;
ALTER TABLE workflow_signals ADD CONSTRAINT workflow_signals_idempotency_key_check
    CHECK (length(idempotency_key) BETWEEN 1 AND 200);
CREATE UNIQUE INDEX workflow_signals_idempotency_key ON workflow_signals (run_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- +goose Down
DROP INDEX workflow_signals_idempotency_key;
ALTER TABLE workflow_signals DROP COLUMN idempotency_key;
