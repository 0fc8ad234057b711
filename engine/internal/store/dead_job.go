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
}

const parkRun = `
WITH run AS (
    UPDATE workflow_runs SET status = 'dead', error = $18::jsonb, completed_at = now(),
        owner_token = NULL, lease_expires_at = NULL, wake_at = NULL, deadline_at = NULL
    WHERE run_id = $1 AND owner_token = $2 AND $3::bigint >= 0
    RETURNING run_id, workflow_name, workflow_id, workflow_version, input, watched AS notify
), ` + stepUpsert + `, ` + notifyEnded + `,
dead AS (
    INSERT INTO dead_jobs (id, run_id, workflow_name, workflow_id, workflow_version, input, reason, step_name, seq,
                           attempts, first_failed_at, last_failed_at, error_class, error_message, stack,
                           deliveries, forward_error)
    SELECT $19, run_id, workflow_name, workflow_id, workflow_version, input, $20, $21, $22,
           $23, $24, $25, $26, $27, $28, $29, $30::jsonb
    FROM run
)
SELECT count(*) FROM run WHERE (SELECT count(*) FROM notified) >= 0`

// ParkRun marks the run dead and inserts its dead_jobs row, writing the
// pending step record (may be nil) in the same statement. ErrLeaseLost when
// fenced out.
func ParkRun(ctx context.Context, db DBTX, f Fence, pending *StepRecord, p *Park) error {
	runID := f.RunID
	args := append([]any{runID, f.Token, 0}, stepArgs(pending)...)
	args = append(args, p.RunError, p.ID, p.Reason, p.StepName, p.Seq, p.Attempts, p.FirstFailedAt,
		p.LastFailedAt, p.ErrorClass, p.ErrorMessage, p.Stack, p.Deliveries, jsonText(p.ForwardError))
	return fenced(db.QueryRow(ctx, parkRun, args...), "parking run %s", runID)
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
}

const deadJobColumns = `id, run_id, workflow_name, workflow_id, workflow_version, input, reason, step_name, seq,
    attempts, first_failed_at, last_failed_at, error_class, error_message, stack, parked_at, resolved_at,
    resolution, resolved_by, note, deliveries, forward_error`

func scanDeadJob(row pgx.Row) (*DeadJobRow, error) {
	var d DeadJobRow
	err := row.Scan(&d.ID, &d.RunID, &d.WorkflowName, &d.WorkflowID, &d.WorkflowVersion, &d.Input, &d.Reason,
		&d.StepName, &d.Seq, &d.Attempts, &d.FirstFailedAt, &d.LastFailedAt, &d.ErrorClass, &d.ErrorMessage,
		&d.Stack, &d.ParkedAt, &d.ResolvedAt, &d.Resolution, &d.ResolvedBy, &d.Note, &d.Deliveries, &d.ForwardError)
	if err != nil {
		return nil, translate(err)
	}
	return &d, nil
}

// GetDeadJob reads one dead job; ErrNotFound when absent. forUpdate locks it.
func GetDeadJob(ctx context.Context, db DBTX, id uuid.UUID, forUpdate bool) (*DeadJobRow, error) {
	q := `SELECT ` + deadJobColumns + ` FROM dead_jobs WHERE id = $1`
	if forUpdate {
		q += ` FOR UPDATE`
	}
	return scanDeadJob(db.QueryRow(ctx, q, id))
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

const listDeadJobs = `SELECT ` + deadJobColumns + ` FROM dead_jobs
WHERE ($1::text = '' OR workflow_name = $1)
  AND ($2::text = '' OR reason = $2)
  AND (NOT $3::bool OR resolved_at IS NULL)
  AND ($4::uuid IS NULL OR id < $4)
  AND ($6::uuid IS NULL OR run_id = $6)
ORDER BY id DESC
LIMIT $5`

// ListDeadJobs returns dead jobs newest first.
func ListDeadJobs(ctx context.Context, db DBTX, f DeadJobFilter) ([]*DeadJobRow, error) {
	rows, err := db.Query(ctx, listDeadJobs, f.Workflow, f.Reason, f.OpenOnly, f.Before, f.Limit, f.RunID)
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

const resolveDeadJob = `
UPDATE dead_jobs SET resolved_at = now(), resolution = $2, resolved_by = $3, note = $4
WHERE id = $1 AND resolved_at IS NULL`

// ResolveDeadJob closes an open dead job; false when it was already resolved.
func ResolveDeadJob(ctx context.Context, db DBTX, id uuid.UUID, resolution, by, note string) (bool, error) {
	tag, err := db.Exec(ctx, resolveDeadJob, id, resolution, by, note)
	if err != nil {
		return false, fmt.Errorf("resolving dead job %s: %w", id, translate(err))
	}
	return tag.RowsAffected() == 1, nil
}

// Replay re-opens a dead run: the parked step's attempts are reset so it
// runs again with a fresh retry budget, every other recorded step stays.
// A child of policy cancel whose parent closed meanwhile (its close passed
// the dead child by) is replayed cancelled: it compensates and ends, as
// the policy says.
const replayRun = `
WITH run AS (
    UPDATE workflow_runs r SET status = 'pending', error = NULL, completed_at = NULL, wake_at = NULL,
        stalled_deliveries = 0, long_stalled_deliveries = 0, enqueued_at = now(),
        cancel_requested_at = CASE WHEN r.parent_close_policy = 'cancel' AND EXISTS (
            SELECT 1 FROM workflow_runs p WHERE p.run_id = r.parent_run_id
            AND p.status IN ('completed', 'failed', 'compensated', 'cancelled', 'continued', 'terminated'))
            THEN coalesce(r.cancel_requested_at, now()) ELSE r.cancel_requested_at END
    WHERE r.run_id = $1 AND r.status = 'dead'
    RETURNING r.run_id, r.queue
), step AS (
    UPDATE workflow_steps s SET status = 'retrying', attempts = 0, next_attempt_at = NULL,
        error = s.error - 'settle_attempts'
    FROM run WHERE s.run_id = run.run_id AND s.status = 'parked'
)
SELECT queue FROM run`

// ReplayRun moves a dead run back to pending and returns its queue;
// ErrNotFound when the run is not dead.
func ReplayRun(ctx context.Context, db DBTX, runID uuid.UUID) (string, error) {
	var queue string
	if err := db.QueryRow(ctx, replayRun, runID).Scan(&queue); err != nil {
		return "", translate(err)
	}
	return queue, nil
}

const discardRun = `
UPDATE workflow_runs SET error = jsonb_set(coalesce(error, '{}'::jsonb), '{discarded}', 'true'::jsonb)
WHERE run_id = $1 AND status = 'dead'`

// MarkRunDiscarded notes on a dead run that an operator discarded it; the
// run stays dead.
func MarkRunDiscarded(ctx context.Context, db DBTX, runID uuid.UUID) error {
	_, err := db.Exec(ctx, discardRun, runID)
	return translate(err)
}
