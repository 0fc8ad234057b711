-- Durable runs, their recorded steps and the dead-job table.
-- Status columns are CHECK-constrained; every index matches one query's predicate.

-- +goose Up
CREATE TABLE workflow_runs (
    run_id             uuid        NOT NULL,
    workflow_name      text        NOT NULL,
    workflow_version   integer     NOT NULL DEFAULT 1,
    workflow_id        text        NOT NULL,
    status             text        NOT NULL DEFAULT 'pending',
    input              jsonb       NOT NULL,
    output             jsonb,
    error              jsonb,
    deliveries         integer     NOT NULL DEFAULT 0,
    stalled_deliveries integer     NOT NULL DEFAULT 0,
    owner_token        uuid,
    lease_expires_at   timestamptz,
    wake_at            timestamptz,
    cancel_requested_at timestamptz,
    parent_run_id      uuid,
    schedule_name      text,
    queue              text        NOT NULL DEFAULT 'pgdurable',
    enqueued_at        timestamptz NOT NULL DEFAULT now(), -- when its latest delivery ticket was enqueued
    created_at         timestamptz NOT NULL DEFAULT now(),
    started_at         timestamptz,
    completed_at       timestamptz,
    CONSTRAINT workflow_runs_pkey PRIMARY KEY (run_id),
    CONSTRAINT workflow_runs_workflow_id_key UNIQUE (workflow_name, workflow_id),
    CONSTRAINT workflow_runs_status_check CHECK (status IN (
        'pending', 'running', 'waiting', 'completed', 'failed',
        'compensating', 'compensated', 'cancelled', 'dead')),
    CONSTRAINT workflow_runs_workflow_name_check CHECK (length(workflow_name) BETWEEN 1 AND 200),
    CONSTRAINT workflow_runs_workflow_id_check CHECK (length(workflow_id) BETWEEN 1 AND 400),
    CONSTRAINT workflow_runs_deliveries_check CHECK (deliveries >= 0 AND stalled_deliveries >= 0),
    CONSTRAINT workflow_runs_lease_check CHECK ((owner_token IS NULL) = (lease_expires_at IS NULL))
) WITH (fillfactor = 80); -- room for HOT updates: each step write extends the lease in place


-- The crash sweeper: running runs (at most one per worker slot) are scanned
-- for an expired lease. lease_expires_at is deliberately not indexed: every
-- step write extends it, and leaving it out of all indexes keeps those
-- writes heap-only (HOT) updates.
CREATE INDEX workflow_runs_lease_sweep_idx ON workflow_runs (queue)
    WHERE status IN ('running', 'compensating');
-- The timer sweep: waiting (or compensating) runs whose wake time has come.
CREATE INDEX workflow_runs_wake_sweep_idx ON workflow_runs (queue, wake_at)
    WHERE wake_at IS NOT NULL;
-- The sweep also wakes waiting runs whose cancellation was requested (a
-- cancel that raced the run's suspension).
CREATE INDEX workflow_runs_cancel_sweep_idx ON workflow_runs (queue)
    WHERE status = 'waiting' AND cancel_requested_at IS NOT NULL;
-- Listing runs newest first, optionally by workflow and status (run_id is a UUID v7: time ordered).
CREATE INDEX workflow_runs_workflow_status_idx ON workflow_runs (workflow_name, status, run_id DESC);
CREATE INDEX workflow_runs_status_idx ON workflow_runs (status, run_id DESC);

CREATE TABLE workflow_steps (
    run_id          uuid        NOT NULL,
    seq             integer     NOT NULL,
    name            text        NOT NULL,
    kind            text        NOT NULL DEFAULT 'step',
    status          text        NOT NULL,
    attempts        integer     NOT NULL DEFAULT 0,
    request_id      uuid,
    output          jsonb,
    error           jsonb,
    next_attempt_at timestamptz,
    first_failed_at timestamptz,
    started_at      timestamptz NOT NULL DEFAULT now(),
    completed_at    timestamptz,
    compensation    text,    -- forward steps: the name of the undo registered with them
    compensation_of integer, -- compensation steps: the seq of the forward step they undo
    CONSTRAINT workflow_steps_pkey PRIMARY KEY (run_id, seq),
    CONSTRAINT workflow_steps_run_id_fkey FOREIGN KEY (run_id) REFERENCES workflow_runs (run_id) ON DELETE CASCADE,
    CONSTRAINT workflow_steps_kind_check CHECK (kind IN (
        'step', 'tx', 'activity', 'sleep', 'signal', 'child', 'compensation')),
    -- completed: output recorded; failed: a permanent error recorded and returned to the workflow;
    -- retrying: a transient failure, next attempt at next_attempt_at; parked: the step that made the run dead.
    CONSTRAINT workflow_steps_status_check CHECK (status IN ('started', 'completed', 'failed', 'retrying', 'parked')),
    CONSTRAINT workflow_steps_seq_check CHECK (seq >= 0),
    CONSTRAINT workflow_steps_attempts_check CHECK (attempts >= 0)
);

CREATE TABLE dead_jobs (
    id               uuid        NOT NULL,
    run_id           uuid        NOT NULL,
    workflow_name    text        NOT NULL,
    workflow_id      text        NOT NULL,
    workflow_version integer     NOT NULL,
    input            jsonb       NOT NULL,
    reason           text        NOT NULL,
    step_name        text,
    seq              integer,
    attempts         integer     NOT NULL DEFAULT 0,
    first_failed_at  timestamptz NOT NULL DEFAULT now(),
    last_failed_at   timestamptz NOT NULL DEFAULT now(),
    error_class      text        NOT NULL,
    error_message    text        NOT NULL,
    stack            text,
    parked_at        timestamptz NOT NULL DEFAULT now(),
    resolved_at      timestamptz,
    resolution       text,
    resolved_by      text,
    note             text,
    CONSTRAINT dead_jobs_pkey PRIMARY KEY (id),
    CONSTRAINT dead_jobs_run_id_fkey FOREIGN KEY (run_id) REFERENCES workflow_runs (run_id) ON DELETE CASCADE,
    CONSTRAINT dead_jobs_reason_check CHECK (reason IN (
        'retries_exhausted', 'permanent_error', 'panic', 'nondeterminism', 'poison_input',
        'crash_loop', 'compensation_failed', 'timeout')),
    CONSTRAINT dead_jobs_resolution_check CHECK (
        (resolved_at IS NULL AND resolution IS NULL)
        OR (resolved_at IS NOT NULL AND resolution IN ('replayed', 'discarded')))
);

-- Open dead jobs, newest first, by workflow and reason; at most one open dead job per run.
CREATE INDEX dead_jobs_open_idx ON dead_jobs (workflow_name, reason, id DESC) WHERE resolved_at IS NULL;
CREATE INDEX dead_jobs_list_idx ON dead_jobs (id DESC);
CREATE UNIQUE INDEX dead_jobs_open_run_key ON dead_jobs (run_id) WHERE resolved_at IS NULL;

-- +goose Down
DROP TABLE dead_jobs;
DROP TABLE workflow_steps;
DROP TABLE workflow_runs;
