-- Each started engine process keeps a row here while it runs: what it
-- registers (workflow names and versions), on which queue, on which host,
-- seen when. GET /v1/workflows and engine workflows list read the rows
-- seen lately; a process deletes its row when it stops, and rows not seen
-- for an hour (a process that was killed) are deleted by the others.

-- +goose Up
CREATE TABLE engine_processes (
    process_id   uuid        NOT NULL,
    hostname     text        NOT NULL,
    pid          integer     NOT NULL,
    queue        text        NOT NULL,
    workflows    jsonb       NOT NULL, -- [{"name": ..., "version": ...}]
    started_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT engine_processes_pkey PRIMARY KEY (process_id)
);

-- +goose Down
DROP TABLE engine_processes;
