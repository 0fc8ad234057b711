-- Cron schedules and the record of every fire.

-- +goose Up
CREATE TABLE schedules (
    name              text        NOT NULL,
    cron              text        NOT NULL,
    time_zone         text        NOT NULL DEFAULT 'UTC',
    workflow_name     text        NOT NULL,
    input             jsonb       NOT NULL DEFAULT 'null',
    overlap_policy    text        NOT NULL DEFAULT 'skip',
    catchup_window_ms bigint      NOT NULL DEFAULT 3600000,
    paused            boolean     NOT NULL DEFAULT false,
    queue             text        NOT NULL DEFAULT 'pgdurable',
    next_fire_at      timestamptz NOT NULL, -- the earliest fire time not yet handled
    last_fire_at      timestamptz,          -- the latest fire handled (started, buffered or skipped)
    last_run_id       uuid,                 -- the run the latest started fire created
    buffered_fire_at  timestamptz,          -- buffer_one: a fire waiting for the running one to end
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT schedules_pkey PRIMARY KEY (name),
    CONSTRAINT schedules_name_check CHECK (name ~ '^[A-Za-z0-9._-]{1,100}$'),
    CONSTRAINT schedules_overlap_policy_check CHECK (overlap_policy IN ('skip', 'allow', 'buffer_one')),
    CONSTRAINT schedules_catchup_window_check CHECK (catchup_window_ms > 0)
);

-- The scheduler: due, unpaused schedules of a queue (and buffered fires).
CREATE INDEX schedules_due_idx ON schedules (queue, next_fire_at) WHERE NOT paused;

CREATE TABLE schedule_fires (
    schedule_name text        NOT NULL,
    fire_at       timestamptz NOT NULL,
    outcome       text        NOT NULL,
    reason        text,
    run_id        uuid,
    recorded_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT schedule_fires_pkey PRIMARY KEY (schedule_name, fire_at),
    CONSTRAINT schedule_fires_schedule_fkey FOREIGN KEY (schedule_name) REFERENCES schedules (name) ON DELETE CASCADE,
    -- started: a run was started (run_id); buffered: held for the running one (buffer_one);
    -- skipped: missed (older than the catch-up window) or overlap (a run was still active).
    CONSTRAINT schedule_fires_outcome_check CHECK (outcome IN ('started', 'buffered', 'skipped')),
    CONSTRAINT schedule_fires_reason_check CHECK ((outcome = 'skipped') = (reason IS NOT NULL))
);

CREATE INDEX workflow_runs_schedule_idx ON workflow_runs (schedule_name, run_id DESC) WHERE schedule_name IS NOT NULL;

-- +goose Down
DROP INDEX workflow_runs_schedule_idx;
DROP TABLE schedule_fires;
DROP TABLE schedules;
