-- Flow control: queues with global and per-key concurrency, fair shares
-- between keys, priorities, rate limits and deduplication.
--
-- A run of a queue (flow_queue) that needs a delivery is ready (ready_at
-- set) and waits in the queue's backlog until a process that serves the
-- queue admits it: the admission takes the queue's row lock, counts the
-- queue's runs that hold a live lease (and each key's), and claims the
-- next ready runs that fit, in one transaction. No limit is a counter:
-- a slot is a leased row, so a crashed process's slots come back when its
-- leases expire, never earlier and never later.
--
-- Every index here holds only flow-controlled runs: ready_at, owner_token
-- and status change together at a claim, a suspension and an end (each
-- of which updates an indexed column already), and a step's record,
-- which extends the lease alone, stays a heap-only update.

-- +goose Up
CREATE TABLE queues (
    name              text             NOT NULL,
    -- The definition, written by the processes that serve the queue (the
    -- latest to start wins); 0 is no limit.
    concurrency       integer          NOT NULL DEFAULT 0,
    key_concurrency   integer          NOT NULL DEFAULT 0,
    rate_limit        integer          NOT NULL DEFAULT 0, -- runs started per rate_period_ms
    rate_period_ms    bigint           NOT NULL DEFAULT 0,
    rate_burst        integer          NOT NULL DEFAULT 0,
    key_rate_limit    integer          NOT NULL DEFAULT 0, -- each key's runs started per key_rate_period_ms
    key_rate_period_ms bigint          NOT NULL DEFAULT 0,
    key_rate_burst    integer          NOT NULL DEFAULT 0,
    priority_aging_ms bigint           NOT NULL DEFAULT 0,
    defined_at        timestamptz      NOT NULL DEFAULT now(),
    -- An operator's pause: nothing of the queue is admitted while set.
    paused_at         timestamptz,
    paused_by         text,
    pause_reason      text,
    -- Admission state: the fair-queuing virtual time (the largest tag
    -- admitted) and the rate limit's theoretical arrival time (GCRA).
    vtime             double precision NOT NULL DEFAULT 0,
    rate_tat          timestamptz,
    CONSTRAINT queues_pkey PRIMARY KEY (name),
    CONSTRAINT queues_name_check CHECK (length(name) BETWEEN 1 AND 200),
    CONSTRAINT queues_limits_check CHECK (concurrency >= 0 AND key_concurrency >= 0 AND rate_limit >= 0
        AND rate_period_ms >= 0 AND rate_burst >= 0 AND key_rate_limit >= 0 AND key_rate_period_ms >= 0
        AND key_rate_burst >= 0 AND priority_aging_ms >= 0)
);

-- A key's rate limit state (GCRA), only for queues with a key rate limit.
-- A row whose time has passed says nothing more than no row: the
-- admission deletes those of the keys it reads.
CREATE TABLE queue_keys (
    queue    text        NOT NULL,
    key      text        NOT NULL,
    rate_tat timestamptz NOT NULL,
    CONSTRAINT queue_keys_pkey PRIMARY KEY (queue, key)
);

ALTER TABLE workflow_runs ADD COLUMN flow_queue text;
ALTER TABLE workflow_runs ADD COLUMN flow_key   text;
ALTER TABLE workflow_runs ADD COLUMN priority   integer NOT NULL DEFAULT 0;
ALTER TABLE workflow_runs ADD COLUMN fair_tag   double precision;
ALTER TABLE workflow_runs ADD COLUMN ready_at   timestamptz;
ALTER TABLE workflow_runs ADD COLUMN dedup_id   text;
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_flow_queue_check CHECK (length(flow_queue) BETWEEN 1 AND 200);
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_flow_key_check CHECK (length(flow_key) <= 200);
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_dedup_id_check CHECK (length(dedup_id) BETWEEN 1 AND 400);
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_ready_check CHECK (ready_at IS NULL OR flow_queue IS NOT NULL);

-- The backlog in admission order: priority, then fair share (fair_tag).
CREATE INDEX workflow_runs_flow_ready_idx ON workflow_runs (flow_queue, priority DESC, fair_tag, run_id)
    WHERE ready_at IS NOT NULL;
-- The backlog in the order it became ready: priority aging, the oldest
-- waiting run's age.
CREATE INDEX workflow_runs_flow_age_idx ON workflow_runs (flow_queue, ready_at) WHERE ready_at IS NOT NULL;
-- A key's latest tag, which a new run of the key follows.
CREATE INDEX workflow_runs_flow_key_idx ON workflow_runs (flow_queue, flow_key, fair_tag) WHERE ready_at IS NOT NULL;
-- The slots: a queue's runs that hold a lease (live or expired).
CREATE INDEX workflow_runs_flow_slots_idx ON workflow_runs (flow_queue, flow_key)
    WHERE flow_queue IS NOT NULL AND owner_token IS NOT NULL;
-- A deduplication ID is taken while a run holding it is open.
CREATE UNIQUE INDEX workflow_runs_dedup_idx ON workflow_runs (flow_queue, dedup_id)
    WHERE dedup_id IS NOT NULL AND status IN ('pending', 'running', 'waiting', 'compensating');

ALTER TABLE engine_processes ADD COLUMN queues jsonb NOT NULL DEFAULT '[]'; -- [{"name": ..., "workers": ...}]

-- +goose Down
ALTER TABLE engine_processes DROP COLUMN queues;
DROP INDEX workflow_runs_dedup_idx;
DROP INDEX workflow_runs_flow_slots_idx;
DROP INDEX workflow_runs_flow_key_idx;
DROP INDEX workflow_runs_flow_age_idx;
DROP INDEX workflow_runs_flow_ready_idx;
ALTER TABLE workflow_runs
    DROP CONSTRAINT workflow_runs_ready_check,
    DROP CONSTRAINT workflow_runs_dedup_id_check,
    DROP CONSTRAINT workflow_runs_flow_key_check,
    DROP CONSTRAINT workflow_runs_flow_queue_check,
    DROP COLUMN dedup_id,
    DROP COLUMN ready_at,
    DROP COLUMN fair_tag,
    DROP COLUMN priority,
    DROP COLUMN flow_key,
    DROP COLUMN flow_queue;
DROP TABLE queue_keys;
DROP TABLE queues;
