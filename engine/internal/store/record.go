package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A step record and the run row that fences it are written by two
// statements in one transaction, not by one statement with the record's
// INSERT in a CTE: Citus routes a statement to the one node that holds a
// run only when its data-modifying CTEs are UPDATEs or DELETEs, and plans
// an INSERT CTE as distributed subplans, each a round trip of its own.
//
// One delivery's write (writeFence, CommitStep) checks its fence first,
// locking the run's row, and fails when the fence failed (division by
// zero), which skips the record's INSERT queued behind it: the record
// needs no fence of its own and is a plain INSERT ... VALUES. Where the
// record comes first (WriteSteps, CommitSteps, fencedWithRecord), its
// INSERT is fenced by a join with the run's row that locks it (FOR NO KEY
// UPDATE when the run's row is updated next, so that no share lock is
// ever upgraded, which can deadlock with another updater; FOR SHARE when
// it is only read), and the statement on the run's row comes second. A
// fence that fails inserts nothing, and fails the second statement too:
// the owner token it checks never comes back. (A batch of deliveries'
// writes checks every fence first and fails unless all held, so that its
// records need no fence of their own; see writeFences.)
//
// Times the statements compute stay outside CASE and COALESCE (Citus
// refuses a function that is not IMMUTABLE inside them), and the run-ended
// notification is sent by the caller (NotifyRunsEnded): a NOTIFY sent on
// the node that holds a run does not reach listeners on another.

// Record locks: the row lock a record's INSERT takes on its run's row.
const (
	lockForUpdate = "FOR NO KEY UPDATE OF r"
	lockForShare  = "FOR SHARE OF r"
)

// stepColumnList are the columns of a step record as the record INSERTs
// write them.
const stepColumnList = `run_id, seq, name, kind, status, attempts, request_id, output, error, next_attempt_at,
                      first_failed_at, started_at, completed_at, compensation, compensation_of, input_hash, patches, failed_attempts`

// stepRecordValues are the values of stepColumnList for one record in the
// @step_ parameters (see stepArgs) of run r.
const stepRecordValues = `r.run_id, ` + stepRecordScalars

// stepRecordScalars are stepRecordValues but the run.
const stepRecordScalars = `@step_seq::int, @step_name::text, @step_kind::text, @step_status::text, @step_attempts::int,
           @step_request_id::uuid, @step_output::jsonb, @step_error::jsonb, @step_next_attempt_at::timestamptz,
           @step_first_failed_at::timestamptz, @step_started_at::timestamptz, @step_completed_at::timestamptz,
           @step_compensation::text, @step_compensation_of::int, @step_input_hash::bigint, @step_patches::text,
           @step_failed_attempts::jsonb`

// stepArrayValues are the values of stepColumnList for the records of u
// (see stepArrays) of run r.
const stepArrayValues = `r.run_id, u.seq, u.name, u.kind, u.status, u.attempts, u.request_id, u.output::jsonb, u.error::jsonb,
           u.next_attempt_at, u.first_failed_at, u.started_at, u.completed_at, u.compensation, u.compensation_of, u.input_hash,
           u.patches, u.failed_attempts::jsonb`

// stepArrays unnests the @step_ array parameters (see stepColumns.args)
// as u.
var stepArrays = unnestSteps("", "")

func unnestSteps(params, columns string) string {
	return `unnest(` + params + `@step_seq::int[], @step_name::text[], @step_kind::text[], @step_status::text[], @step_attempts::int[],
                     @step_request_id::uuid[], @step_output::text[], @step_error::text[],
                     @step_next_attempt_at::timestamptz[], @step_first_failed_at::timestamptz[],
                     @step_started_at::timestamptz[], @step_completed_at::timestamptz[],
                     @step_compensation::text[], @step_compensation_of::int[], @step_input_hash::bigint[], @step_patches::text[],
                     @step_failed_attempts::text[])
        AS u(` + columns + `seq, name, kind, status, attempts, request_id, output, error, next_attempt_at, first_failed_at,
             started_at, completed_at, compensation, compensation_of, input_hash, patches, failed_attempts)`
}

// stepConflictStrict is stepConflict for records that must not find their
// step completed (a tx step's, whose transaction commits only with its
// record): the update of a completed record divides by zero (SQLSTATE
// 22012), which fails the statement and so the transaction.
var stepConflictStrict = strings.Replace(stepConflictSet, "\n        attempts = excluded.attempts,",
	"\n        attempts = excluded.attempts * (1 / (s.status <> 'completed')::int),", 1)

// stepConflictGuard ends stepConflict: a completed record is kept as it is.
const stepConflictGuard = `
    WHERE s.status <> 'completed'`

// recordInsert is the INSERT of the one record in the @step_ parameters
// for the run @run_id that @token owns, locked by lock, with conflict
// (stepConflict or "" for a record that cannot exist yet).
func recordInsert(lock, conflict string) *namedStmt {
	return named(`
-- pgdurable: workflow_steps record of one delivery, fenced by its run
INSERT INTO pgdurable.workflow_steps AS s (` + stepColumnList + `)
SELECT ` + stepRecordValues + `
FROM pgdurable.workflow_runs r WHERE r.run_id = @run_id AND r.owner_token = @token
` + lock + conflict)
}

// recordValues is the INSERT of the one record in the @step_ parameters
// for the run @run_id, unfenced: it follows a statement that checked the
// fence and locked the run's row in the same transaction (writeFence).
// fresh: a record that cannot exist yet, inserted without ON CONFLICT.
func recordValues(fresh bool) *namedStmt {
	if fresh {
		return freshRecordValues
	}
	return upsertRecordValues
}

var (
	freshRecordValues  = named(recordValuesSQL)
	upsertRecordValues = named(recordValuesSQL + stepConflict)
)

const recordValuesSQL = `
-- pgdurable: workflow_steps record of one delivery
INSERT INTO pgdurable.workflow_steps AS s (` + stepColumnList + `)
VALUES (@run_id::uuid, ` + stepRecordScalars + `)`

// recordsInsert is recordInsert for the records of the @step_ array
// parameters.
func recordsInsert(lock, conflict string) *namedStmt {
	return named(`
-- pgdurable: workflow_steps records of one delivery, fenced by their run
INSERT INTO pgdurable.workflow_steps AS s (` + stepColumnList + `)
SELECT ` + stepArrayValues + `
FROM ` + stepArrays + `, pgdurable.workflow_runs r WHERE r.run_id = @run_id AND r.owner_token = @token
` + lock + conflict)
}

var (
	recordForUpdate       = recordInsert(lockForUpdate, stepConflict)
	recordsForUpdate      = recordsInsert(lockForUpdate, stepConflict)
	recordsForShareStrict = recordsInsert(lockForShare, stepConflictStrict)
)

// failedAttempt is the failed_attempts value rec is written with: an array
// of the one failure it records (retrying, failed or parked with an error:
// its attempt, status, error class, message cut to 300 characters, and
// at), else NULL. On conflict, stepConflict appends that entry to the
// record's list, in place of an entry for the same attempt (an attempt
// whose failure is recorded again, as parked after retrying), keeping the
// latest MaxFailedAttempts; the same record written again adds nothing.
// Built here rather than in SQL: jsonb_build_object is not IMMUTABLE, and
// Citus refuses it inside CASE.
func failedAttempt(rec *StepRecord, at time.Time) pgtype.Text {
	switch rec.Status {
	case StepRetrying, StepFailed, StepParked:
	default:
		return pgtype.Text{}
	}
	if rec.Error == nil {
		return pgtype.Text{}
	}
	var e struct {
		Class   *string `json:"class"`
		Message *string `json:"message"`
	}
	_ = json.Unmarshal(rec.Error, &e) // an error that is not an object records no class or message
	if e.Message != nil && utf8.RuneCountInString(*e.Message) > 300 {
		m := []rune(*e.Message)[:300]
		s := string(m)
		e.Message = &s
	}
	entry, err := json.Marshal([]any{map[string]any{"attempt": rec.Attempts, "status": rec.Status, "class": e.Class,
		"message": e.Message, "at": at.UTC().Format(time.RFC3339Nano)}})
	if err != nil {
		return pgtype.Text{}
	}
	return pgtype.Text{String: string(entry), Valid: true}
}

// NotifyRunsEnded notifies RunEndedChannel of each of runIDs (runs that
// ended while watched), on db: in a transaction, when it commits. The
// statements that end a run report a watched run's end to their caller
// rather than notify themselves, so that the notification is sent where
// the listeners are (on Citus, the coordinator).
func NotifyRunsEnded(ctx context.Context, db DBTX, runIDs []uuid.UUID) error {
	if len(runIDs) == 0 {
		return nil
	}
	_, err := db.Exec(ctx, `SELECT pg_notify('`+RunEndedChannel+`', id::text) FROM unnest($1::uuid[]) id`, uuids(runIDs))
	return translate(err)
}

// inTransaction reports whether db is a transaction. Statements that must
// commit together are sent between BEGIN and COMMIT otherwise: in one
// round trip, PostgreSQL runs them in one transaction anyway, but Citus
// commits each on its worker node on its own unless a transaction block
// is open.
func inTransaction(db DBTX) bool {
	b, ok := db.(bound)
	if !ok {
		return false
	}
	_, tx := b.q.(pgx.Tx)
	return tx
}

// call is a named statement with its arguments.
type call struct {
	stmt *namedStmt
	args pgx.StrictNamedArgs
}

// fencedWithRecord writes rec (nil: none), fenced by f with its run's row
// locked for update, then runs calls, in one round trip and one
// transaction. The last call's one row holds a count that is 0 when the
// fence failed, and whether it ended a watched run, whose end it then
// notifies (NotifyRunsEnded). ErrLeaseLost when fenced out; other errors
// wrapped with what (a format taking the run ID).
func fencedWithRecord(ctx context.Context, db DBTX, f Fence, rec *StepRecord, what string, calls ...call) error {
	db = at(db, f.RunID)
	b := &pgx.Batch{}
	if rec != nil {
		recordForUpdate.queue(b, stepArgs(pgx.StrictNamedArgs{"run_id": uuidParam(f.RunID), "token": uuidParam(f.Token)}, f, rec))
	}
	for _, c := range calls {
		c.stmt.queue(b, c.args)
	}
	n := b.Len()
	var found int
	var notify bool
	err := sendAtomic(ctx, db, b, func(br pgx.BatchResults) error {
		for range n - 1 {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		return br.QueryRow().Scan(&found, &notify)
	})
	if err != nil {
		return fmt.Errorf(what+": %w", f.RunID, translate(err))
	}
	if found == 0 {
		return ErrLeaseLost
	}
	if notify {
		notifyEnded(ctx, db, []uuid.UUID{f.RunID})
	}
	return nil
}

// notifyEnded is NotifyRunsEnded for a write that has landed (or will,
// with its transaction): its error is dropped, since the write stands and
// a waiter that misses the notification reads the run's end at its next
// poll; in a transaction, the failed statement fails the COMMIT anyway.
func notifyEnded(ctx context.Context, db DBTX, runIDs []uuid.UUID) {
	_ = NotifyRunsEnded(ctx, db, runIDs)
}

// sendAtomic sends b, whose results read reads, in one round trip as one
// transaction, and closes the results. In a transaction (db a pgx.Tx) the
// statements run in it. Elsewhere, with more than one statement, they are
// sent between BEGIN and COMMIT, on one connection (PostgreSQL alone runs
// a round trip's statements as one transaction anyway, but Citus commits
// each one on its worker node by itself outside a transaction block), and
// when one fails, the block is rolled back on that connection: the
// failure skips the COMMIT, and the round trip's end does not close an
// explicit block, which would leave the connection in an aborted
// transaction (and a pool would discard it).
func sendAtomic(ctx context.Context, db DBTX, b *pgx.Batch, read func(pgx.BatchResults) error) error {
	if b.Len() < 2 || inTransaction(db) {
		return sendBatch(ctx, db, b, read)
	}
	on, ok := db.(bound)
	if !ok {
		return sendBatch(ctx, db, b, read)
	}
	if pool, isPool := on.q.(*pgxpool.Pool); isPool {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer conn.Release()
		on = bound{q: conn, s: on.s, srv: on.srv}
	}
	block := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, b.Len()+2)}
	block.Queue("begin")
	block.QueuedQueries = append(block.QueuedQueries, b.QueuedQueries...)
	block.Queue("commit")
	err := sendBatch(ctx, on, block, func(br pgx.BatchResults) error {
		if _, err := br.Exec(); err != nil {
			return err
		}
		if err := read(br); err != nil {
			return err
		}
		_, err := br.Exec()
		return err
	})
	if err != nil && txStatus(on.q) != 'I' {
		_, _ = on.q.Exec(ctx, "rollback")
	}
	return err
}

// txStatus is q's connection's transaction status ('I' idle, 'T' in a
// transaction, 'E' in a failed one), or 'I' when q is not one connection.
func txStatus(q Querier) byte {
	switch c := q.(type) {
	case *pgxpool.Conn:
		return c.Conn().PgConn().TxStatus()
	case *pgx.Conn:
		return c.PgConn().TxStatus()
	}
	return 'I'
}

// nowIfElse is now() where the boolean SQL cond holds, else the SQL
// other, written as Citus can route it in an UPDATE's SET (see nowIf):
// greatest() skips the NULL of the side that does not apply.
func nowIfElse(cond, other string) string {
	return `greatest(` + nowIf(cond) + `, CASE WHEN ` + cond + ` THEN NULL ELSE ` + other + ` END)`
}
