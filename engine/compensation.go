package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// Undo is the compensation of a forward step: what to run, newest first,
// if the run fails permanently, exhausts a step's retries, or is cancelled
// (a saga). Exactly one of Fn and Tx is set. Package compensation builds
// these; most code does not use Undo directly.
type Undo struct {
	// Name is the undo step's stored name ("refund", "release_inventory").
	Name string
	// Fn undoes an effect outside the database. It gets a request ID stored
	// before its first attempt, like an activity: send it as the
	// idempotency key of the undo call (a refund has its own key).
	Fn func(ctx context.Context, a *ActivityAttempt) error
	// Tx undoes an effect in the engine's database, in one transaction with
	// its record: exactly once.
	Tx func(ctx context.Context, tx pgx.Tx) error
	// RetryPolicy and StartToCloseTimeout as for activities. An undo that
	// fails permanently or exhausts its retries parks the run as dead with
	// reason compensation_failed; an operator's replay runs the remaining
	// undos only.
	RetryPolicy         *RetryPolicy
	StartToCloseTimeout time.Duration
	// RateLimit names a rate limit each attempt of the undo takes a turn
	// of first, as StepOpts.RateLimit: a refund goes to the card processor
	// whose limit the charge shares.
	RateLimit string
}

// compensation is an undo registered for the forward step at seq, which
// completed at done (its record's completed_at, to the microsecond, as
// PostgreSQL keeps it).
type compensation struct {
	seq  int
	undo Undo
	done time.Time
}

// Compensate registers u as the compensation of the step that just
// returned successfully (the latest step this workflow called). Call it
// right after that step, on every replay too: workflow code stays
// deterministic, and the undo's name is stored with the forward step's
// record. It returns an error (and registers nothing) when the latest step
// did not succeed or u is malformed.
func (c *Context) Compensate(u Undo) error {
	if err := u.check(); err != nil {
		return err
	}
	return c.d.registerUndo(u)
}

// check reports what is malformed in u.
func (u *Undo) check() error {
	if err := checkName("undo name", u.Name, 200); err != nil {
		return fmt.Errorf("pgdurable: %w", err)
	}
	if (u.Fn == nil) == (u.Tx == nil) {
		return fmt.Errorf("pgdurable: undo %q needs exactly one of Fn and Tx", u.Name)
	}
	if err := u.RetryPolicy.validate(); err != nil {
		return fmt.Errorf("%w: undo %q: %v", ErrInvalidArgument, u.Name, err)
	}
	return nil
}

// markerAt reports whether position seq holds a change's marker, recorded
// (a replay) or pending in this delivery's buffer (a parallel step after
// it gave its position back, on cancellation).
func (d *delivery) markerAt(seq int) bool {
	if rec := d.pos.at(seq); rec != nil {
		return rec.Kind == string(KindPatch)
	}
	p := d.buf.pending
	return p != nil && p.Seq == seq && p.Kind == string(KindPatch)
}

// registerUndo registers u with the latest step, which must have succeeded.
// A change's marker (Patched, before a parallel step) is no step: it is
// written only when the parallel step starts, so a replay skips it, as the
// delivery that wrote it did not see it yet.
func (d *delivery) registerUndo(u Undo) error {
	seq := d.pos.next - 1
	for seq >= 0 && d.markerAt(seq) {
		seq--
	}
	d.compMu.Lock()
	defer d.compMu.Unlock()
	for _, c := range d.compensations {
		if c.seq == seq {
			return fmt.Errorf("pgdurable: step %d already has an undo (%q); register one undo per step", seq, c.undo.Name)
		}
	}
	var done time.Time
	switch {
	case d.buf.pending != nil && d.buf.pending.Seq == seq && d.buf.pending.Status == store.StepCompleted:
		d.buf.pending.Compensation = &u.Name
		done = *d.buf.pending.CompletedAt
	case d.pos.at(seq) != nil && d.pos.at(seq).Status == store.StepCompleted:
		// replayed: the undo's name was stored with the record
		if at := d.pos.at(seq).CompletedAt; at != nil {
			done = *at
		}
	case seq >= 0 && d.lastRecorded == seq:
		// a tx step, recorded in its own transaction: name it with the undo's record
		done = d.lastRecordedAt
	default:
		return fmt.Errorf("pgdurable: undo %q must be registered right after a step that succeeded", u.Name)
	}
	d.compensations = append(d.compensations, &compensation{seq: seq, undo: u, done: done.Truncate(time.Microsecond)})
	return nil
}

// registerBranchUndo registers u for the parallel step at seq, which
// completed at done; safe on the step's goroutine.
func (d *delivery) registerBranchUndo(seq int, u Undo, done time.Time) {
	d.compMu.Lock()
	defer d.compMu.Unlock()
	d.compensations = append(d.compensations, &compensation{seq: seq, undo: u, done: done.Truncate(time.Microsecond)})
	d.parallelUndos = true
}

// hasCompensations reports whether an undo is registered.
func (d *delivery) hasCompensations() bool {
	d.compMu.Lock()
	defer d.compMu.Unlock()
	return len(d.compensations) > 0
}

// undoOrder puts the registered undos in the order their forward steps
// completed, oldest first (then by position), when parallel steps
// registered some: they register as they complete, live, and as the
// workflow reaches them, on replay, so only their records' completion
// times give both the same order. Sequential undos keep their order.
func (d *delivery) undoOrder() []*compensation {
	d.compMu.Lock()
	defer d.compMu.Unlock()
	if d.parallelUndos {
		slices.SortStableFunc(d.compensations, func(a, b *compensation) int {
			return cmp.Or(a.done.Compare(b.done), cmp.Compare(a.seq, b.seq))
		})
	}
	return slices.Clone(d.compensations)
}

// compensate runs the registered undos newest first, each a durable step,
// then ends the run with status (compensated or cancelled) and info, the
// error that caused it. A crash in the middle resumes with the next undo.
func (d *delivery) compensate(status RunStatus, info *ErrorInfo) {
	if !d.writeStatus(StatusCompensating, d.buf.takeAll()...) {
		return
	}
	d.compensating = true
	d.sagaCause = info
	// Children first: a child started after a step is undone before it.
	if !d.closeChildren(compensateStops, compensateStops) {
		return
	}
	d.pos.skipForward()
	undos := d.undoOrder()
	d.log.Info("compensating", "undos", len(undos), "error_class", info.Class)
	for i := len(undos) - 1; i >= 0; i-- {
		comp := undos[i]
		if _, err := d.runStep(undoCall(comp)); err != nil {
			return // parked (compensation_failed) or interrupted: the delivery ended
		}
	}
	if d.pos.replaying() {
		d.parkUnreplayed("compensation ended")
		return
	}
	d.close(status, d.finishRun(status, nil, info.json()))
	d.log.Info("run "+string(status), "error_class", info.Class)
}

func undoCall(comp *compensation) *stepCall {
	u := comp.undo
	seq := comp.seq
	call := &stepCall{name: u.Name, kind: KindCompensation, compensationOf: &seq,
		opts: &StepOpts{RetryPolicy: u.RetryPolicy, RateLimit: u.RateLimit}, parkAs: ReasonCompensationFailed}
	if u.Tx != nil {
		call.body = txBody(func(ctx context.Context, tx pgx.Tx) (struct{}, error) { return struct{}{}, u.Tx(ctx, tx) })
		call.tx = true
		return call
	}
	call.requestID = true
	opts := &ActivityOpts{StartToCloseTimeout: u.StartToCloseTimeout}
	call.body = func(ctx context.Context, st *attemptState) ([]byte, error) {
		return runAttempt(ctx, st.d, u.Name, opts, &ActivityAttempt{RequestID: st.requestID, Attempt: st.attempt},
			func(ctx context.Context, a *ActivityAttempt) (struct{}, error) { return struct{}{}, u.Fn(ctx, a) })
	}
	return call
}

// Cancel requests cancellation of a run; the request is recorded
// (Run.CancelRequestedAt) and always wins: from then on no new attempt of a
// forward step starts, retries waiting for their backoff are abandoned,
// registered compensations run newest first in a context that is not
// cancelled, and the run ends cancelled. A running delivery notices at its
// next heartbeat, step write or activity heartbeat, and the running
// forward step's context is cancelled (cause ErrCancelled); a waiting run
// is delivered at once. One exception keeps money safe: an activity that
// does not heartbeat and whose earlier attempts may have taken effect (see
// NoEffect) is retried with its request ID until its outcome is known, so
// its undo can run.
//
// Cancelling a run that is already cancelled or being cancelled (or that
// is compensating after a failure, whose outcome stands) succeeds and
// changes nothing, so a client may retry. Returns ErrNotFound for an
// unknown run and ErrRunClosed for one that completed, failed, was
// compensated, continued as new (cancel the latest run of its chain), was
// terminated or is dead.
//
// FindRun turns a workflow ID into the run ID Cancel takes.
func (e *Engine) Cancel(ctx context.Context, runID uuid.UUID) error {
	if _, err := e.cancel(ctx, nil, runID); err != nil {
		return err
	}
	// Committed: a delivery of the run in this process stops its forward
	// work now (one in another process hears of it at its engine's next
	// sweep, write or heartbeat).
	e.noteCancelled([]uuid.UUID{runID})
	return nil
}

// CancelTx is Cancel inside the caller's transaction.
func (e *Engine) CancelTx(ctx context.Context, tx pgx.Tx, runID uuid.UUID) error {
	_, err := e.cancel(ctx, tx, runID)
	return err
}

// cancel is Cancel and CancelTx; requested reports whether this call
// requested the cancellation (a run cancelled before is not counted again
// by a bulk cancel).
func (e *Engine) cancel(ctx context.Context, tx pgx.Tx, runID uuid.UUID) (requested bool, err error) {
	err = e.inTx(ctx, tx, func(tx pgx.Tx) error {
		// Wall time, not Config.Clock: the sweeps compare these columns
		// with PostgreSQL's clock.
		res, err := store.CancelRun(ctx, e.on(tx), runID, time.Now())
		status, wake := res.Status, res.WakeUp
		requested = res.Requested
		switch {
		case errors.Is(err, store.ErrNotFound):
			return fmt.Errorf("%w: run %s", ErrNotFound, runID)
		case err != nil:
			return fmt.Errorf("pgdurable: cancelling run %s: %w", runID, err)
		case status == store.RunCancelled:
			return nil // already cancelled: a retried request
		case !RunStatus(status).active():
			return fmt.Errorf("%w: run %s is %s", ErrRunClosed, runID, status)
		case wake:
			return e.queue.Enqueue(ctx, tx, runID, time.Time{})
		}
		return nil
	})
	return requested, err
}
