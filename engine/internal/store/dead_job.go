package store

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Park describes why a run is parked as dead.
type Park struct {
	ID            uuid.UUID
	Reason        string
	StepName      *string
	Seq           *int
	Attempts      int
	FirstFailedAt time.Time
	LastFailedAt  time.Time
	ErrorClass    string
	ErrorMessage  string
	Stack         *string
	RunError      []byte // the run's error column
	Deliveries    int    // the run's deliveries, this one included
	ForwardError  []byte // a failed compensation's cause (JSON), else nil
	// ChildRunID and ChildDeadJobID, for reason child_dead, are the child
	// the run waited for and the child's dead job.
	ChildRunID     *uuid.UUID
	ChildDeadJobID *uuid.UUID
}

// parkRun marks the run @token owns dead and inserts its dead_jobs row,
// after its pending record's INSERT (see fencedWithRecord): the dead job's
// INSERT first, while the fence can still be read, locking the run's row.
var parkRun = named(`
-- pgdurable: a run parked as a dead job
WITH run AS (
    UPDATE pgdurable.workflow_runs SET status = 'dead', error = @run_error::jsonb, completed_at = now(),
        owner_token = NULL, lease_expires_at = NULL, wake_at = NULL, deadline_at = NULL
    WHERE run_id = @run_id AND owner_token = @token
    RETURNING watched
)
SELECT count(*), coalesce(bool_or(watched), false) FROM run`)

// insertDeadJob inserts a parked run's dead job. Its parked_at is a
// parameter, not the column's default now(): see insertRuns for what
// Citus makes of a STABLE function in an INSERT ... SELECT.
var insertDeadJob = named(`
-- pgdurable: a parked run's dead job
INSERT INTO pgdurable.dead_jobs (id, run_id, workflow_name, workflow_id, workflow_version, input, reason, step_name, seq,
                       attempts, first_failed_at, last_failed_at, error_class, error_message, stack,
                       deliveries, forward_error, child_run_id, child_dead_job_id, parked_at)
SELECT @id, r.run_id, r.workflow_name, r.workflow_id, r.workflow_version, r.input, @reason, @parked_step, @parked_seq,
       @attempts, @first_failed_at, @last_failed_at, @error_class, @error_message, @stack, @deliveries,
       @forward_error::jsonb, @child_run_id, @child_dead_job_id, @parked_at::timestamptz
FROM pgdurable.workflow_runs r WHERE r.run_id = @run_id AND r.owner_token = @token
FOR NO KEY UPDATE OF r`)

// ParkRun marks the run dead and inserts its dead_jobs row, writing the
// pending step record (may be nil) in the same statement. ErrLeaseLost when
// fenced out.
func ParkRun(ctx context.Context, db DBTX, f Fence, pending *StepRecord, p *Park) error {
	db = at(db, f.RunID)
	runID := f.RunID
	dead := pgx.StrictNamedArgs{"run_id": runID, "token": f.Token, "id": p.ID, "reason": p.Reason,
		"parked_step": p.StepName, "parked_seq": p.Seq, "attempts": p.Attempts, "first_failed_at": p.FirstFailedAt,
		"last_failed_at": p.LastFailedAt, "error_class": p.ErrorClass, "error_message": p.ErrorMessage, "stack": p.Stack,
		"deliveries": p.Deliveries, "forward_error": jsonText(p.ForwardError), "child_run_id": p.ChildRunID,
		"child_dead_job_id": p.ChildDeadJobID, "parked_at": time.Now()}
	run := pgx.StrictNamedArgs{"run_id": runID, "token": f.Token, "run_error": p.RunError}
	return fencedWithRecord(ctx, db, f, pending, "parking run %s", call{insertDeadJob, dead}, call{parkRun, run})
}

// DeadJobRow is one row of dead_jobs.
type DeadJobRow struct {
	ID              uuid.UUID
	RunID           uuid.UUID
	WorkflowName    string
	WorkflowID      string
	WorkflowVersion int
	Input           []byte
	Reason          string
	StepName        *string
	Seq             *int
	Attempts        int
	FirstFailedAt   time.Time
	LastFailedAt    time.Time
	ErrorClass      string
	ErrorMessage    string
	Stack           *string
	ParkedAt        time.Time
	ResolvedAt      *time.Time
	Resolution      *string
	ResolvedBy      *string
	Note            *string
	Deliveries      int
	ForwardError    []byte
	ChildRunID      *uuid.UUID
	ChildDeadJobID  *uuid.UUID
}

const deadJobColumns = `id, run_id, workflow_name, workflow_id, workflow_version, input, reason, step_name, seq,
    attempts, first_failed_at, last_failed_at, error_class, error_message, stack, parked_at, resolved_at,
    resolution, resolved_by, note, deliveries, forward_error, child_run_id, child_dead_job_id`

func scanDeadJob(row pgx.Row) (*DeadJobRow, error) {
	var d DeadJobRow
	err := row.Scan(&d.ID, &d.RunID, &d.WorkflowName, &d.WorkflowID, &d.WorkflowVersion, &d.Input, &d.Reason,
		&d.StepName, &d.Seq, &d.Attempts, &d.FirstFailedAt, &d.LastFailedAt, &d.ErrorClass, &d.ErrorMessage,
		&d.Stack, &d.ParkedAt, &d.ResolvedAt, &d.Resolution, &d.ResolvedBy, &d.Note, &d.Deliveries, &d.ForwardError,
		&d.ChildRunID, &d.ChildDeadJobID)
	if err != nil {
		return nil, translate(err)
	}
	return &d, nil
}

// GetDeadJob reads one dead job; ErrNotFound when absent. forUpdate locks it.
func GetDeadJob(ctx context.Context, db DBTX, id uuid.UUID, forUpdate bool) (*DeadJobRow, error) {
	db = at(db, id) // a dead job's ID carries its run's route
	q := `SELECT ` + deadJobColumns + ` FROM pgdurable.dead_jobs WHERE id = $1`
	if forUpdate {
		q += ` FOR UPDATE`
	}
	return scanDeadJob(db.QueryRow(ctx, q, id))
}

// RunDeadJob is a run's status and its open dead job (nil when none), for
// a dead job's ID that turned out to be a run's.
type RunDeadJob struct {
	Status  string
	OpenJob *uuid.UUID
}

// GetRunDeadJob reads run runID's status and open dead job (through the
// unique index of open jobs by run); ErrNotFound when there is no such
// run.
func GetRunDeadJob(ctx context.Context, db DBTX, runID uuid.UUID) (*RunDeadJob, error) {
	db = at(db, runID)
	var r RunDeadJob
	err := db.QueryRow(ctx, `SELECT r.status, (SELECT j.id FROM pgdurable.dead_jobs j WHERE j.run_id = r.run_id AND j.resolved_at IS NULL)
		FROM pgdurable.workflow_runs r WHERE r.run_id = $1`, runID).Scan(&r.Status, &r.OpenJob)
	if err != nil {
		return nil, translate(err)
	}
	return &r, nil
}

// DeadJobFilter selects dead jobs for ListDeadJobs; zero fields match all.
type DeadJobFilter struct {
	Workflow string
	Reason   string
	RunID    *uuid.UUID
	OpenOnly bool
	Before   *uuid.UUID // keyset cursor: ids older than this
	Limit    int
}

var listDeadJobs = named(`SELECT ` + deadJobColumns + ` FROM pgdurable.dead_jobs
WHERE (@workflow::text = '' OR workflow_name = @workflow)
  AND (@reason::text = '' OR reason = @reason)
  AND (NOT @open_only::bool OR resolved_at IS NULL)
  AND (@before::uuid IS NULL OR id < @before)
  AND (@run_id::uuid IS NULL OR run_id = @run_id)
ORDER BY id DESC
LIMIT @limit`)

// ListDeadJobs returns dead jobs newest first.
func ListDeadJobs(ctx context.Context, db DBTX, f DeadJobFilter) ([]*DeadJobRow, error) {
	list := func(db DBTX) ([]*DeadJobRow, error) {
		rows, err := listDeadJobs.query(ctx, db, pgx.StrictNamedArgs{"workflow": f.Workflow, "reason": f.Reason,
			"open_only": f.OpenOnly, "before": f.Before, "limit": f.Limit, "run_id": f.RunID})
		if err != nil {
			return nil, fmt.Errorf("listing dead jobs: %w", err)
		}
		defer rows.Close()
		var out []*DeadJobRow
		for rows.Next() {
			d, err := scanDeadJob(rows)
			if err != nil {
				return nil, fmt.Errorf("listing dead jobs: %w", err)
			}
			out = append(out, d)
		}
		return out, rows.Err()
	}
	if f.RunID != nil {
		return list(at(db, *f.RunID))
	}
	return newestFirst(ctx, db, f.Limit, list, func(d *DeadJobRow) uuid.UUID { return d.ID })
}

const resolveDeadJob = `
UPDATE pgdurable.dead_jobs SET resolved_at = now(), resolution = $2, resolved_by = $3, note = $4
WHERE id = $1 AND resolved_at IS NULL`

// ResolveDeadJobParams says how a dead job was resolved: Resolution
// (replayed or discarded), by whom and with what note ("" for none).
type ResolveDeadJobParams struct {
	ID         uuid.UUID
	Resolution string
	By, Note   string
}

// ResolveDeadJob closes the open dead job p.ID; false when it was already
// resolved.
func ResolveDeadJob(ctx context.Context, db DBTX, p ResolveDeadJobParams) (bool, error) {
	db = at(db, p.ID)
	tag, err := db.Exec(ctx, resolveDeadJob, p.ID, p.Resolution, p.By, p.Note)
	if err != nil {
		return false, fmt.Errorf("resolving dead job %s: %w", p.ID, translate(err))
	}
	return tag.RowsAffected() == 1, nil
}

// Replay re-opens a dead run: the parked step's attempts are reset so it
// runs again with a fresh retry budget, every other recorded step stays.
// An orphaned run (a child whose parent closed past it, see ReplayRun) is
// replayed cancelled instead: its unfinished forward steps are recorded
// cancelled, never tried again, so it runs its undos and ends. Each step
// it touches notes the replay in its failed attempts.
var replayRun = named(`
WITH run AS (
    UPDATE pgdurable.workflow_runs r SET status = 'pending', error = NULL, completed_at = NULL, wake_at = NULL,
        stalled_deliveries = 0, long_stalled_deliveries = 0, enqueued_at = @now,
        cancel_requested_at = CASE WHEN @orphaned::bool THEN coalesce(r.cancel_requested_at, @now) ELSE r.cancel_requested_at END
    WHERE r.run_id = @run_id AND r.status = 'dead'
    RETURNING r.run_id, r.queue
), step AS (
    UPDATE pgdurable.workflow_steps s SET
        status = CASE WHEN @orphaned::bool AND s.compensation_of IS NULL THEN 'cancelled' ELSE 'retrying' END,
        attempts = CASE WHEN @orphaned::bool AND s.compensation_of IS NULL THEN s.attempts ELSE 0 END,
        completed_at = CASE WHEN @orphaned::bool AND s.compensation_of IS NULL THEN @now ELSE s.completed_at END,
        next_attempt_at = NULL, error = s.error - 'settle_attempts',
        failed_attempts = ` + keepLatest(`coalesce(s.failed_attempts, '[]'::jsonb)`) + `
            || jsonb_build_array(jsonb_build_object('replayed', true, 'at', @now::timestamptz))
    FROM run WHERE s.run_id = run.run_id AND (s.status = 'parked'
        OR (@orphaned::bool AND s.compensation_of IS NULL AND s.kind <> 'child' AND s.status IN ('started', 'retrying')))
)
SELECT queue FROM run`)

// ReplayRun moves a dead run back to pending (as of now) and returns its
// queue; ErrNotFound when the run is not dead. With orphaned (a child of
// policy cancel or wait whose parent has closed) its cancellation is
// requested and its unfinished forward steps are recorded cancelled.
func ReplayRun(ctx context.Context, db DBTX, runID uuid.UUID, orphaned bool, now time.Time) (string, error) {
	db = at(db, runID)
	var queue string
	if err := replayRun.queryRow(ctx, db, pgx.StrictNamedArgs{"run_id": runID, "orphaned": orphaned, "now": now}).Scan(&queue); err != nil {
		return "", translate(err)
	}
	return queue, nil
}

const runParentOf = `
SELECT parent_run_id, parent_close_policy FROM pgdurable.workflow_runs WHERE run_id = $1`

// RunParentResult is a run's parent and its parent-close policy (nil and
// "" for a run with no parent).
type RunParentResult struct {
	Parent      *uuid.UUID
	ClosePolicy string
}

// RunParent returns the parent of run runID and the run's parent-close
// policy; ErrNotFound for no run.
func RunParent(ctx context.Context, db DBTX, runID uuid.UUID) (RunParentResult, error) {
	db = at(db, runID)
	var parent *uuid.UUID
	var policy *string
	if err := db.QueryRow(ctx, runParentOf, runID).Scan(&parent, &policy); err != nil {
		return RunParentResult{}, translate(err)
	}
	if policy == nil {
		return RunParentResult{Parent: parent}, nil
	}
	return RunParentResult{Parent: parent, ClosePolicy: *policy}, nil
}

const runStatus = `SELECT status FROM pgdurable.workflow_runs WHERE run_id = $1`

// RunStatusOf returns the status of run runID; ErrNotFound for no run.
func RunStatusOf(ctx context.Context, db DBTX, runID uuid.UUID) (string, error) {
	db = at(db, runID)
	var status string
	if err := db.QueryRow(ctx, runStatus, runID).Scan(&status); err != nil {
		return "", translate(err)
	}
	return status, nil
}

const openChildDeadJob = `
SELECT ` + deadJobColumns + ` FROM pgdurable.dead_jobs
WHERE run_id = $1 AND resolved_at IS NULL AND reason = 'child_dead' AND child_run_id = $2
FOR UPDATE`

// ParentParkedOn returns the ID of parent's open dead job of reason
// child_dead for its child run child; nil when it has none.
func ParentParkedOn(ctx context.Context, db DBTX, parent, child uuid.UUID) (*uuid.UUID, error) {
	db = at(db, parent)
	var id uuid.UUID
	err := db.QueryRow(ctx, `SELECT id FROM pgdurable.dead_jobs
WHERE run_id = $1 AND resolved_at IS NULL AND reason = 'child_dead' AND child_run_id = $2`, parent, child).Scan(&id)
	switch err = translate(err); {
	case err == ErrNotFound:
		return nil, nil
	case err != nil:
		return nil, err
	}
	return &id, nil
}

// OpenChildDeadJob locks and returns parent's open dead job of reason
// child_dead for its child run child; ErrNotFound when it has none.
func OpenChildDeadJob(ctx context.Context, db DBTX, parent, child uuid.UUID) (*DeadJobRow, error) {
	db = at(db, parent)
	return scanDeadJob(db.QueryRow(ctx, openChildDeadJob, parent, child))
}

const discardRun = `
UPDATE pgdurable.workflow_runs SET error = jsonb_set(coalesce(error, '{}'::jsonb), '{discarded}', 'true'::jsonb)
WHERE run_id = $1 AND status = 'dead'`

// MarkRunDiscarded notes on a dead run that an operator discarded it; the
// run stays dead.
func MarkRunDiscarded(ctx context.Context, db DBTX, runID uuid.UUID) error {
	db = at(db, runID)
	_, err := db.Exec(ctx, discardRun, runID)
	return translate(err)
}

// DeadJobOpen reports whether run runID's dead job id is open (not
// replayed or discarded); false for none.
func DeadJobOpen(ctx context.Context, db DBTX, runID, id uuid.UUID) (bool, error) {
	db = at(db, runID)
	var open bool
	err := db.QueryRow(ctx, `SELECT resolved_at IS NULL FROM pgdurable.dead_jobs WHERE run_id = $1 AND id = $2`, runID, id).Scan(&open)
	if err = translate(err); err == ErrNotFound {
		return false, nil
	}
	return open, err
}

// MoveRunToVersion sets dead run runID's workflow version to version (a
// dead job's replay onto another version) and returns the version it had;
// its wait for a process of its old version, if any, ends with it.
// ErrNotFound when the run is not dead.
func MoveRunToVersion(ctx context.Context, db DBTX, runID uuid.UUID, version int) (from int, err error) {
	db = at(db, runID)
	err = db.QueryRow(ctx, `
WITH old AS (SELECT workflow_version FROM pgdurable.workflow_runs WHERE run_id = $1 AND status = 'dead' FOR UPDATE)
UPDATE pgdurable.workflow_runs r SET workflow_version = $2, version_wait_since = NULL
FROM old WHERE r.run_id = $1
RETURNING old.workflow_version`, runID, version).Scan(&from)
	return from, translate(err)
}

// RunVersion is a run's queue and workflow version.
type RunVersion struct {
	Queue   string
	Version int
}

// RunVersionOf returns run runID's queue and workflow version;
// ErrNotFound when there is no such run.
func RunVersionOf(ctx context.Context, db DBTX, runID uuid.UUID) (RunVersion, error) {
	db = at(db, runID)
	var v RunVersion
	err := db.QueryRow(ctx, `SELECT queue, workflow_version FROM pgdurable.workflow_runs WHERE run_id = $1`, runID).Scan(&v.Queue, &v.Version)
	return v, translate(err)
}
