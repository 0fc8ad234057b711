package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// ParentRef places a child run under its parent: the parent's run, the
// parent's step position that started it, and its parent-close policy
// (cancel, abandon or wait).
type ParentRef struct {
	RunID       uuid.UUID
	Seq         int
	ClosePolicy string
}

// ChildToken is what a parent waiting for its child at position seq holds
// in await_signal: a record separator (chr(30)) and the position, which no
// signal name can be (names hold no control characters).
func ChildToken(seq int) string { return "\x1e" + strconv.Itoa(seq) }

// ChildSeqOf reports the position a token of ChildToken names.
func ChildSeqOf(token string) (int, bool) {
	rest, ok := strings.CutPrefix(token, "\x1e")
	if !ok {
		return 0, false
	}
	seq, err := strconv.Atoi(rest)
	return seq, err == nil
}

// childEnded holds for a child run r that has ended as its parent sees
// it: terminal (a dead child's parent learns it died; an operator's replay
// of the child does not reach a parent that has moved on), but not
// continued: the run that continues it takes its parent position, and
// the child ends when the chain's latest run does.
const childEnded = `r.status IN ` + terminalStatuses + ` AND r.status <> 'continued'`

// ErrChildIDTaken: a child's workflow ID is held by a run that is not
// that child.
var ErrChildIDTaken = errors.New("workflow ID taken")

const childByWorkflowID = `
SELECT run_id, parent_run_id IS NOT DISTINCT FROM $3 AND parent_seq IS NOT DISTINCT FROM $4
FROM pgdurable.workflow_runs WHERE workflow_name = $1 AND workflow_id = $2 AND status <> 'continued'`

// InsertChild inserts the child run r (r.Parent set) in tx, the parent's
// delivery's transaction, which also writes the parent's record of it. A
// run with r's workflow ID that is this child (the parent's earlier try
// committed) is returned with Existing set; one that is another run is
// ErrChildIDTaken, with that run's ID.
func InsertChild(ctx context.Context, tx DBTX, r NewRun) (*InsertedRun, error) {
	tx = at(tx, r.RunID)
	var id uuid.UUID
	p := r.Parent
	// A child is never claimed, held, given a deadline or tags at its
	// insert, nor continues a run.
	c := r
	c.Claim, c.Hold, c.Deadline, c.ContinuedFrom, c.Tags = nil, 0, nil, nil, nil
	err := insertRunStmt.queryRow(ctx, tx, c.args()).Scan(&id)
	if err == nil {
		return &InsertedRun{RunID: id, Status: r.insertedStatus()}, nil
	}
	if err = translate(err); err != ErrNotFound {
		return nil, err
	}
	var ours bool
	if err := tx.QueryRow(ctx, childByWorkflowID, r.WorkflowName, r.WorkflowID, p.RunID, p.Seq).Scan(&id, &ours); err != nil {
		return nil, fmt.Errorf("reading the run holding workflow ID %q: %w", r.WorkflowID, translate(err))
	}
	if !ours {
		return &InsertedRun{RunID: id, Existing: true}, ErrChildIDTaken
	}
	return &InsertedRun{RunID: id, Existing: true}, nil
}

// ChildEnd is how a child run ended.
type ChildEnd struct {
	Seq    int
	RunID  uuid.UUID
	Status string
	Output []byte
	Error  []byte
	// DeadJobID is the open dead job of a child parked as dead (nil when
	// it ended otherwise, or its dead job was discarded): such a child may
	// still be replayed.
	DeadJobID *uuid.UUID
}

var childEnds = named(`
SELECT r.parent_seq, r.run_id, r.status, r.output, r.error,
    (SELECT d.id FROM pgdurable.dead_jobs d WHERE d.run_id = r.run_id AND d.resolved_at IS NULL AND r.status = 'dead')
FROM pgdurable.workflow_runs r
WHERE r.parent_run_id = @parent AND r.parent_seq = ANY(@seqs) AND ` + childEnded)

// ChildEnds reads how those of parent's children at seqs that have ended
// ended.
func ChildEnds(ctx context.Context, db DBTX, parent uuid.UUID, seqs []int) ([]ChildEnd, error) {
	var out []ChildEnd
	err := eachRoute(ctx, db, func(db DBTX) error {
		rows, err := childEnds.query(ctx, db, pgx.StrictNamedArgs{"parent": parent, "seqs": seqs})
		if err != nil {
			return fmt.Errorf("reading the children of run %s: %w", parent, translate(err))
		}
		ends, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ChildEnd, error) {
			var c ChildEnd
			err := r.Scan(&c.Seq, &c.RunID, &c.Status, &c.Output, &c.Error, &c.DeadJobID)
			return c, err
		})
		if err != nil {
			return fmt.Errorf("reading the children of run %s: %w", parent, translate(err))
		}
		out = append(out, ends...)
		return nil
	})
	return out, err
}

const openChildren = `
SELECT parent_seq FROM pgdurable.workflow_runs
WHERE parent_run_id = $1 AND parent_close_policy = ANY($2) AND status IN ('pending', 'running', 'waiting', 'compensating')
ORDER BY parent_seq LIMIT $3`

// OpenChildren returns the positions of up to limit of parent's children
// with one of policies that have not ended, lowest first.
func OpenChildren(ctx context.Context, db DBTX, parent uuid.UUID, policies []string, limit int) ([]int, error) {
	var out []int
	err := eachRoute(ctx, db, func(db DBTX) error {
		rows, err := db.Query(ctx, openChildren, parent, policies, limit)
		if err != nil {
			return fmt.Errorf("reading the open children of run %s: %w", parent, translate(err))
		}
		seqs, err := pgx.CollectRows(rows, pgx.RowTo[int])
		if err != nil {
			return fmt.Errorf("reading the open children of run %s: %w", parent, translate(err))
		}
		out = append(out, seqs...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(out)
	return out[:min(len(out), limit)], nil
}

// LockRun locks a run's row for the rest of tx. The transaction that
// ends a child (or continues it as new) locks its parent's row first,
// before its own: with the parent's suspension (which updates the
// parent's row, then looks at its children) that orders the two, so the
// child either finds the parent waiting and wakes it, or commits its end
// before the parent's look, which then sees it. And with the parent's
// close, which holds the parent's row while it cancels its children,
// it orders a child's continue-as-new (whose new run the close must see)
// and takes the rows in one order, ancestors first, so the two never
// deadlock.
func LockRun(ctx context.Context, tx DBTX, runID uuid.UUID) error {
	tx = at(tx, runID)
	var one int
	err := tx.QueryRow(ctx, `SELECT 1 FROM pgdurable.workflow_runs WHERE run_id = $1 FOR UPDATE`, runID).Scan(&one)
	if err = translate(err); err != nil && err != ErrNotFound {
		return fmt.Errorf("locking run %s: %w", runID, err)
	}
	return nil
}

// wakeParent runs after LockRun(parent) in the same transaction.
const wakeParent = `
UPDATE pgdurable.workflow_runs SET status = CASE WHEN status = 'waiting' THEN 'pending' ELSE status END,
    wake_at = NULL, await_signal = NULL, enqueued_at = now()
WHERE run_id = $1 AND owner_token IS NULL AND status IN ('waiting', 'compensating')
  AND $2 = ANY(string_to_array(await_signal, chr(31)))
RETURNING run_id`

// WakeParent, in the transaction that ends the child at parent's position
// seq (which locked the parent's row first, see LockRun), makes the
// parent pending when it waits for that child; the caller enqueues its
// delivery in the same transaction when woken.
func WakeParent(ctx context.Context, tx DBTX, parent uuid.UUID, seq int) (woken bool, err error) {
	tx = at(tx, parent)
	var id uuid.UUID
	err = tx.QueryRow(ctx, wakeParent, parent, ChildToken(seq)).Scan(&id)
	switch err = translate(err); {
	case err == ErrNotFound:
		return false, nil
	case err != nil:
		return false, fmt.Errorf("waking parent run %s: %w", parent, err)
	}
	return true, nil
}

// A child no delivery ever picked up (pending, or waiting for its delayed
// start) has nothing to undo: it ends cancelled here, with errJSON, rather
// than wait for a worker (one that registers its workflow may never come).
// Its times keep now() outside CASE and COALESCE, as Citus needs (see
// nowIfElse).
var cancelChildren = named(`
WITH target AS (
    SELECT run_id, status, deliveries = 0 AND owner_token IS NULL AND status IN ('pending', 'waiting') AS never
    FROM pgdurable.workflow_runs
    WHERE parent_run_id = @parent AND parent_close_policy = ANY(@policies) AND status IN ('pending', 'running', 'waiting')
      AND (cancel_requested_at IS NULL OR (deliveries = 0 AND owner_token IS NULL))
    ORDER BY run_id
    FOR UPDATE
), upd AS (
    UPDATE pgdurable.workflow_runs r SET
        cancel_requested_at = ` + nowIfElse(`r.cancel_requested_at IS NULL`, `r.cancel_requested_at`) + `,
        status = CASE WHEN target.never THEN 'cancelled' WHEN target.status = 'waiting' THEN 'pending' ELSE r.status END,
        error = CASE WHEN target.never THEN @error::jsonb ELSE r.error END,
        completed_at = ` + nowIfElse(`target.never`, `r.completed_at`) + `,
        deadline_at = CASE WHEN target.never THEN NULL ELSE r.deadline_at END,
        held_until = CASE WHEN target.never THEN NULL ELSE r.held_until END,
        wake_at = CASE WHEN target.status = 'waiting' OR target.never THEN NULL ELSE r.wake_at END,
        await_signal = CASE WHEN target.status = 'waiting' OR target.never THEN NULL ELSE r.await_signal END,
        enqueued_at = ` + nowIfElse(`target.status = 'waiting' AND NOT target.never`, `r.enqueued_at`) + `
    FROM target WHERE r.run_id = target.run_id
    RETURNING r.run_id, target.status = 'waiting' AND NOT target.never AS woken, target.never AND r.watched AS notify
)
SELECT run_id, woken, notify FROM upd`)

// endCancelledUnstarted ends a run whose cancellation was requested and
// that a process that cannot run it gave back (ReleaseUnregistered),
// never delivered: nothing of it ran, so there is nothing to undo. For a
// child: CancelChildren saw it claimed, so it only asked for its
// cancellation, and no delivery may ever come to act on it; it ends
// cancelled as CancelChildren ends a child that never started. For a
// top-level run: it would otherwise wait for a process of its version
// only to end cancelled.
var endCancelledUnstarted = named(`
WITH upd AS (
    UPDATE pgdurable.workflow_runs SET status = 'cancelled', error = @error::jsonb, completed_at = @now,
        deadline_at = NULL, held_until = NULL, wake_at = NULL, await_signal = NULL, ready_at = NULL
    WHERE run_id = @run_id AND cancel_requested_at IS NOT NULL
      AND deliveries = 0 AND owner_token IS NULL AND status = 'pending'
    RETURNING run_id, watched AS notify
)
SELECT run_id, notify FROM upd`)

// EndCancelledUnstarted ends run runID cancelled at now, with errJSON as
// its error, when its cancellation was requested and no delivery ever ran
// it (see endCancelledUnstarted); ended reports whether it did. For a
// child, the caller locked the parent's row first (LockRun) and wakes the
// parent. The time is a parameter, as Citus needs it (no now() in a
// statement it routes to a shard).
func EndCancelledUnstarted(ctx context.Context, tx DBTX, runID uuid.UUID, errJSON []byte, now time.Time) (ended bool, err error) {
	tx = at(tx, runID)
	var id uuid.UUID
	var notify bool
	err = endCancelledUnstarted.queryRow(ctx, tx, pgx.StrictNamedArgs{"run_id": runID, "error": string(errJSON), "now": now}).Scan(&id, &notify)
	switch err = translate(err); {
	case err == ErrNotFound:
		return false, nil
	case err != nil:
		return false, fmt.Errorf("ending cancelled run %s: %w", runID, err)
	case notify:
		return true, NotifyRunsEnded(ctx, tx, []uuid.UUID{runID})
	}
	return true, nil
}

// CancelledChildren are the children CancelChildren cancelled, and those
// of them it woke (waiting: the caller enqueues their deliveries in the
// same transaction).
type CancelledChildren struct {
	Cancelled, Woken []uuid.UUID
}

// CancelChildren requests the cancellation of parent's children with one
// of policies that are still running (as CancelRun: a compensating child
// is left to finish its undos); one that never started ends cancelled at
// once, with errJSON as its error.
func CancelChildren(ctx context.Context, tx DBTX, parent uuid.UUID, policies []string, errJSON []byte) (CancelledChildren, error) {
	var out CancelledChildren
	err := eachRoute(ctx, tx, func(tx DBTX) error {
		c, err := cancelChildrenOn(ctx, tx, parent, policies, errJSON)
		out.Cancelled, out.Woken = append(out.Cancelled, c.Cancelled...), append(out.Woken, c.Woken...)
		return err
	})
	return out, err
}

func cancelChildrenOn(ctx context.Context, tx DBTX, parent uuid.UUID, policies []string, errJSON []byte) (CancelledChildren, error) {
	rows, err := cancelChildren.query(ctx, tx, pgx.StrictNamedArgs{"parent": parent, "policies": policies, "error": string(errJSON)})
	if err != nil {
		return CancelledChildren{}, fmt.Errorf("cancelling the children of run %s: %w", parent, translate(err))
	}
	defer rows.Close()
	var out CancelledChildren
	var ended []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		var wake, notify bool
		if err := rows.Scan(&id, &wake, &notify); err != nil {
			return CancelledChildren{}, fmt.Errorf("cancelling the children of run %s: %w", parent, err)
		}
		out.Cancelled = append(out.Cancelled, id)
		if wake {
			out.Woken = append(out.Woken, id)
		}
		if notify {
			ended = append(ended, id)
		}
	}
	if err := rows.Err(); err != nil {
		return CancelledChildren{}, fmt.Errorf("cancelling the children of run %s: %w", parent, translate(err))
	}
	return out, NotifyRunsEnded(ctx, tx, ended)
}

// ErrChildEnded: a child the parent was about to wait for has ended.
var ErrChildEnded = errors.New("a child ended")

var anyChildEnded = named(`
SELECT EXISTS (SELECT 1 FROM pgdurable.workflow_runs r
WHERE r.parent_run_id = @parent AND r.parent_seq = ANY(@seqs) AND ` + childEnded + `)`)

// ChildWaitParams says how SuspendForChildren hands a parent back: in Status
// (waiting or compensating) until one of its children at Seqs ends,
// writing Pending (may be nil) in the same statement.
type ChildWaitParams struct {
	Pending *StepRecord
	Status  string
	Seqs    []int
}

// SuspendForChildren, in tx, hands the parent run f fences back waiting
// for any of its children at w.Seqs to end. It updates the run row first
// and then looks at the children: ErrChildEnded when one has ended already
// (the caller rolls tx back and reads it). With routes on a Citus cluster
// the parent also wakes after ChildRecheck to look again (see there).
func SuspendForChildren(ctx context.Context, tx DBTX, f Fence, w ChildWaitParams) error {
	tokens := make([]string, len(w.Seqs))
	for i, s := range w.Seqs {
		tokens[i] = ChildToken(s)
	}
	var recheck *time.Time
	routes, err := Routes(ctx, tx)
	if err != nil {
		return err
	}
	if routes > 1 {
		citus, err := onCitus(ctx, tx)
		if err != nil {
			return err
		}
		if citus {
			at := time.Now().Add(ChildRecheck)
			recheck = &at
		}
	}
	if err := SuspendAwaiting(ctx, tx, f, AwaitParams{Pending: w.Pending, Status: w.Status, Awaits: tokens, WakeAt: recheck}); err != nil {
		return err
	}
	return CheckChildrenOpen(ctx, tx, f.RunID, w.Seqs)
}

// ChildRecheck is how long a parent waits for its children before it
// looks at them again, with routes on a Citus cluster. A child in another
// route than its parent ends in a transaction that spans two worker nodes,
// which Citus commits on each in turn (two-phase commit): the parent's
// check, on the child's node, can run after the parent's node committed
// the child's end (and found the parent not waiting yet) but before the
// child's node did, and see the child open; the wake that a single
// PostgreSQL guarantees is then missed, and this recheck makes up for it.
const ChildRecheck = 30 * time.Second

// CheckChildrenOpen returns ErrChildEnded when one of parent's children at
// seqs has ended. After the parent's suspension updated its row (in the
// same transaction), a child that ends later finds the parent waiting.
func CheckChildrenOpen(ctx context.Context, tx DBTX, parent uuid.UUID, seqs []int) error {
	return eachRoute(ctx, tx, func(tx DBTX) error {
		var ended bool
		if err := anyChildEnded.queryRow(ctx, tx, pgx.StrictNamedArgs{"parent": parent, "seqs": seqs}).Scan(&ended); err != nil {
			return fmt.Errorf("reading the children of run %s: %w", parent, translate(err))
		}
		if ended {
			return ErrChildEnded
		}
		return nil
	})
}

func collectChildren(rows pgx.Rows) ([]ChildRow, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ChildRow, error) {
		var c ChildRow
		err := r.Scan(&c.Seq, &c.RunID, &c.WorkflowName, &c.WorkflowID, &c.Status, &c.ClosePolicy, &c.CreatedAt, &c.CompletedAt, &c.FirstRunID)
		return c, err
	})
}

// ChildRow is one child of a run, as the run's view lists it: a child
// that continued as new, at the latest run of its chain, with FirstRunID
// its chain's first run (nil for a child that never continued).
type ChildRow struct {
	Seq          int
	RunID        uuid.UUID
	WorkflowName string
	WorkflowID   string
	Status       string
	ClosePolicy  string
	CreatedAt    time.Time
	CompletedAt  *time.Time
	FirstRunID   *uuid.UUID
}

// listChildren lists one row per child: the runs of a continue-as-new
// chain share the child's parent and position, and all but the latest
// are continued (it is inserted in the transaction that ends the one
// before), so the chain shows once, at its latest run.
const listChildren = `
SELECT parent_seq, run_id, workflow_name, workflow_id, status, parent_close_policy, created_at, completed_at, first_run_id
FROM pgdurable.workflow_runs WHERE parent_run_id = $1 AND status <> 'continued'
ORDER BY parent_seq, run_id LIMIT $2`
