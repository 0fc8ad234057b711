-- Rate limits shared by every process, for the attempts of steps and
-- activities that name one (a card processor's API): GCRA, one row per
-- limit. The definition is written by the processes that register the
-- limit (the latest to start wins); tat is the theoretical arrival time
-- of the next attempt, which each attempt takes and moves in one
-- statement under the row's lock.

-- +goose Up
CREATE TABLE rate_limits (
    name       text        NOT NULL,
    rate_limit integer     NOT NULL, -- attempts per period_ms
    period_ms  bigint      NOT NULL,
    burst      integer     NOT NULL DEFAULT 1,
    tat        timestamptz,
    defined_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT rate_limits_pkey PRIMARY KEY (name),
    CONSTRAINT rate_limits_name_check CHECK (length(name) BETWEEN 1 AND 200),
    CONSTRAINT rate_limits_check CHECK (rate_limit > 0 AND period_ms > 0 AND burst >= 1)
);

-- +goose Down
DROP TABLE rate_limits;
