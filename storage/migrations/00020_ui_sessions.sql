-- A browser signed in to the web UI (engine/webui) holds a random session
-- cookie; this table keeps its SHA-256, so that every engine process
-- behind one address accepts it, sign-out ends it everywhere, and it
-- expires on the server. Expired rows are deleted at each sign-in.

-- +goose Up
CREATE TABLE ui_sessions (
    session_hash bytea       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    CONSTRAINT ui_sessions_pkey PRIMARY KEY (session_hash)
);

-- +goose Down
DROP TABLE ui_sessions;
