// Package store holds every SQL statement the engine runs at runtime, and
// translates Postgres errors into the engine's conditions once, here.
//
// Writes that belong to a run's lease holder are fenced: each statement
// checks the owner token in its WHERE clause and the caller treats zero rows
// as a lost lease. Row types never leave this package's callers in engine.
package store

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Conditions the store reports. ErrNotFound and ErrLeaseLost are the
// engine's public errors too (engine re-exports them, as River re-exports
// rivertype.ErrNotFound), so they carry the engine's messages; the engine
// maps the others onto its own conditions.
var (
	ErrNotFound   = errors.New("pgdurable: not found")
	ErrLeaseLost  = errors.New("pgdurable: lease lost to another delivery")
	ErrConflict   = errors.New("conflict")
	ErrBadPayload = errors.New("payload rejected by postgres")
)

// translate maps Postgres error codes onto the store's conditions, never by
// matching message text.
func translate(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotFound
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "23505": // unique_violation
			return errors.Join(ErrConflict, err)
		case "54000": // program limit exceeded
			return errors.Join(ErrBadPayload, err)
		}
		if strings.HasPrefix(pgErr.Code, "22") { // data exception: a number out of range, invalid text, NUL
			return errors.Join(ErrBadPayload, err)
		}
	}
	return err
}

// IsDataError reports whether PostgreSQL refused err's statement for its
// data (SQLSTATE class 22, data exception: a number out of range, an
// invalid text representation, a NUL character): it fails the same way
// every time, so retrying it cannot help.
func IsDataError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.Is(err, ErrBadPayload) || (errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22"))
}

// IsTransient reports whether a statement failed for a reason that a
// moment later may not recur: a serialization failure or deadlock (the
// transaction was rolled back), a connection that was cut or could not be
// had, a server shutting down. ambiguous is true when the statement may
// have committed all the same (the connection was lost after it was sent):
// retry only what is idempotent then. A context's own timeout or
// cancellation is not transient: the caller gave up.
func IsTransient(err error) (transient, ambiguous bool) {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false, false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch c := pgErr.Code; {
		case c == "40001", c == "40P01": // serialization_failure, deadlock_detected: rolled back
			return true, false
		case strings.HasPrefix(c, "08"), c == "57P01", c == "57P02", c == "57P03": // connection exception, shutdowns
			return true, true
		}
		return false, false
	}
	if pgconn.SafeToRetry(err) {
		return true, false // never sent
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, pgconn.ErrConnClosed) {
		return true, true
	}
	return false, false
}

// ms renders a duration as the bigint milliseconds our SQL multiplies by
// interval '1 millisecond'.
func ms(d time.Duration) int64 { return d.Milliseconds() }

// StepRecord is one row of workflow_steps as the executor reads and writes it.
type StepRecord struct {
	Seq           int
	Name          string
	Kind          string
	Status        string
	Attempts      int
	RequestID     *uuid.UUID
	Output        []byte
	Error         []byte
	NextAttemptAt *time.Time
	FirstFailedAt *time.Time
	StartedAt     time.Time
	CompletedAt   *time.Time
	// Compensation names the undo registered with a forward step;
	// CompensationOf is the forward step's seq on a compensation step.
	Compensation   *string
	CompensationOf *int
	// InputHash is a hash of the input the step was given (engine's
	// StepOpts.Input), nil when none was: kept from the record's first
	// write on.
	InputHash *int64
	// Patches are the changes (engine.Patched) the run took right before
	// this step, newline-separated; nil for none. Kept from the record's
	// first write on.
	Patches *string
	// FailedAttempts is the record's failed_attempts (a JSON array, nil
	// when none), as GetRun and GetStep read it; the record writes ignore
	// this field and derive the column from Status, Attempts and Error
	// (see failedAttempt).
	FailedAttempts []byte
	// Fresh: no record of this (run, seq) can exist yet (the writing
	// delivery holds the lease, loaded the run's records and has not
	// written this one), so the record writes (WriteRecords) insert it
	// without ON CONFLICT, which costs a speculative insertion (an extra
	// index probe and WAL record) per row. Were a row there after all, the
	// write fails with ErrConflict and lands nothing.
	Fresh bool
}

// Step statuses (the CHECK constraint in 00001_runs.sql).
const (
	StepStarted   = "started"
	StepCompleted = "completed"
	StepFailed    = "failed"
	StepRetrying  = "retrying"
	StepParked    = "parked"
	StepCancelled = "cancelled" // stopped by the run's cancellation before it finished
)

// Run statuses (the CHECK constraint in 00001_runs.sql).
const (
	RunPending      = "pending"
	RunRunning      = "running"
	RunWaiting      = "waiting"
	RunCompleted    = "completed"
	RunFailed       = "failed"
	RunCompensating = "compensating"
	RunCompensated  = "compensated"
	RunCancelled    = "cancelled"
	RunDead         = "dead"
	RunContinued    = "continued"
	RunTerminated   = "terminated"
)

// terminalStatuses is the one list, for IN, of the statuses of a run
// that has ended (as the engine's RunStatus.Terminal): every status but
// the active ones (pending, running, waiting, compensating). Statements
// narrow it where they mean less: a dead run may yet be replayed, so it
// takes signals and waits for its dead jobs before a prune; a continued
// run's chain goes on in the run that continues it, at the same parent
// position, so a parent does not read it as its child's end.
const terminalStatuses = `('completed', 'failed', 'compensated', 'cancelled', 'dead', 'continued', 'terminated')`

// stepParams are the names of stepUpsert's (and writeRecord's) step
// record parameters.
var stepParams = []string{"step_seq", "step_name", "step_kind", "step_status", "step_attempts", "step_request_id",
	"step_output", "step_error", "step_next_attempt_at", "step_first_failed_at", "step_started_at", "step_completed_at",
	"step_compensation", "step_compensation_of", "step_input_hash", "step_patches", "step_failed_attempts"}

// stepArgs binds the step record parameters (stepParams) in args to rec,
// written under f, or to NULLs when rec is nil so that no record is
// written, and returns args.
func stepArgs(args pgx.StrictNamedArgs, f Fence, rec *StepRecord) pgx.StrictNamedArgs {
	if rec == nil {
		for _, name := range stepParams {
			args[name] = nil
		}
		return args
	}
	values := []any{rec.Seq, rec.Name, rec.Kind, rec.Status, rec.Attempts, uuidOrNull(rec.RequestID),
		rec.Output, rec.Error, rec.NextAttemptAt, rec.FirstFailedAt, rec.StartedAt, rec.CompletedAt,
		rec.Compensation, rec.CompensationOf, rec.InputHash, f.patchesOf(rec), failedAttempt(rec, time.Now())}
	for i, name := range stepParams {
		args[name] = values[i]
	}
	return args
}
