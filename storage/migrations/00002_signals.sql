-- Signals sent to runs, buffered until an AwaitSignal consumes them.

-- +goose Up
-- The signal name a waiting run waits for: a signal with this name wakes it.
ALTER TABLE workflow_runs ADD COLUMN await_signal text;

CREATE TABLE workflow_signals (
    id           bigint      GENERATED ALWAYS AS IDENTITY,
    run_id       uuid        NOT NULL,
    name         text        NOT NULL,
    payload      jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    consumed_seq integer,     -- the AwaitSignal step that received it
    consumed_at  timestamptz,
    CONSTRAINT workflow_signals_pkey PRIMARY KEY (id),
    CONSTRAINT workflow_signals_run_id_fkey FOREIGN KEY (run_id) REFERENCES workflow_runs (run_id) ON DELETE CASCADE,
    CONSTRAINT workflow_signals_name_check CHECK (length(name) BETWEEN 1 AND 200),
    CONSTRAINT workflow_signals_consumed_check CHECK ((consumed_seq IS NULL) = (consumed_at IS NULL))
);

-- AwaitSignal takes the oldest unconsumed signal of a name: identity order is send order.
CREATE INDEX workflow_signals_pending_idx ON workflow_signals (run_id, name, id) WHERE consumed_seq IS NULL;

-- +goose Down
DROP TABLE workflow_signals;
ALTER TABLE workflow_runs DROP COLUMN await_signal;
