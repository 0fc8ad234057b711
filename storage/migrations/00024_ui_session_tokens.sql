-- A web UI session (engine/webui) lasts only as long as the API token it was
-- opened with: token_digest is an HMAC-SHA256 of that token keyed with the
-- session's random secret, which only the browser's cookie holds. A process
-- serving another token computes another digest and refuses the session, so
-- rotating a leaked token ends the sessions it opened; and the digest, without
-- the secret, tells a reader of this table nothing it could test guesses of the
-- token against. Sessions opened before this migration are tied to no token:
-- they end here. A row without a digest (written by a process that predates
-- this migration, during a rolling deploy) is refused.

-- +goose Up
DELETE FROM ui_sessions;
ALTER TABLE ui_sessions ADD COLUMN token_digest bytea;
ALTER TABLE ui_sessions ADD CONSTRAINT ui_sessions_token_digest_check CHECK (token_digest IS NULL OR length(token_digest) = 32);

-- +goose Down
ALTER TABLE ui_sessions DROP COLUMN token_digest;
