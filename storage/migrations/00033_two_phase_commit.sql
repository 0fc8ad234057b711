-- Two-phase commit on a Citus cluster. Citus commits a transaction that
-- wrote one worker node and tables local to the coordinator (River's
-- tickets, a tx step's own tables) in one phase: the worker node's part
-- first, then the coordinator's, so a crash or a failed commit (a
-- serialization failure) between the two keeps one part only: a step's
-- record without its writes, a run without its ticket. Citus uses two
-- phases once the transaction also modifies one of its tables on the
-- coordinator: two_phase_commit() does, a no-op update of this table
-- (which migrate up adds to Citus's metadata on a coordinator with worker
-- nodes), when the transaction wrote the coordinator. The engine calls it
-- before committing, on Citus only; on one PostgreSQL both are unused.

-- +goose Up
CREATE TABLE two_phase_commits (
    id integer PRIMARY KEY
);
-- +goose StatementBegin
CREATE FUNCTION two_phase_commit() RETURNS void LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    IF pg_current_xact_id_if_assigned() IS NOT NULL THEN
        UPDATE two_phase_commits SET id = id WHERE id = -1;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION two_phase_commit();
DROP TABLE two_phase_commits;
