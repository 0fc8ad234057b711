package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// Future is the result of a step started with Go or GoTx, which runs while
// the workflow goes on. Get waits for it.
type Future[T any] struct {
	d    *delivery
	name string
	done chan struct{}
	// Set before done closes.
	raw []byte
	err error
	// park, set by a step that panicked, parks the run when Get (or the
	// workflow's return) sees it: as a panic in a sequential step does.
	park *parkReason
}

// Get waits for the step and returns its result, decoded as T: the value,
// or the error Step would return (a *StepError once its retries end or it
// failed permanently; ErrCancelled after the run's cancellation). Call it
// from the workflow function, with the workflow's ctx; any number of times.
func (f *Future[T]) Get(ctx *Context) (T, error) {
	var zero T
	if ctx == nil || ctx.d != f.d {
		return zero, errors.New("pgdurable: Future.Get called with another run's Context")
	}
	if !f.Ready() && !f.d.flushStarted() {
		return zero, f.d.endErr
	}
	<-f.done
	raw, err := f.d.settleBranch(f.raw, f.err, f.park)
	if err != nil {
		return zero, err
	}
	return decodeOutput[T](f.name, raw, nil)
}

// Ready reports whether the step has its outcome (Get would not wait).
// It is not recorded: use it for progress, not to choose what the
// workflow does, which a replay must repeat.
func (f *Future[T]) Ready() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

// All waits for every future and returns their values in the order given.
// The error is the first one in that order (the others still ran to their
// end; Get each to see them).
func All[T any](ctx *Context, fs []*Future[T]) ([]T, error) {
	out := make([]T, len(fs))
	var first error
	for i, f := range fs {
		v, err := f.Get(ctx)
		if err != nil && first == nil {
			first = err
		}
		out[i] = v
	}
	return out, first
}

// Go starts fn as the run's next step without waiting for it: the step
// takes its position now, in call order, so a replay lines up whatever
// order parallel steps finish in, and runs on a goroutine of its own while
// the workflow goes on to its next call. A recorded step (a replay) is
// ready at once and fn does not run. Records of parallel steps land as
// each finishes.
//
// At most WorkflowOpts.MaxParallelSteps of a run's steps started with Go
// or GoTx run at once; Go waits for one to finish before starting another.
// A parallel step is retried per its RetryPolicy in place (its backoffs
// hold a worker slot, however long), and its failure is returned by Get,
// as with StepOpts.ReturnExhausted, whatever the run's compensations; a
// panic parks the run. GoUndo registers an undo as the step completes.
// While parallel steps run, waits that would end the delivery (a long
// Sleep, a retry's long backoff, AwaitSignal, Select, ChildRun.Get) wait
// in place instead, so a started step runs once, to its end; the run
// suspends once none is left. A future the workflow never waits for is
// cancelled when the workflow function returns.
func Go[T any](ctx *Context, name string, fn func(context.Context) (T, error), opts *StepOpts) *Future[T] {
	return startBranch[T](ctx, name, KindStep, opts, func(sctx context.Context, _ *attemptState) ([]byte, error) {
		v, err := fn(sctx)
		if err != nil {
			return nil, err
		}
		return encodeOutput(v, ctx.d.e.cfg.MaxPayloadBytes)
	})
}

// GoTx is Go for a tx step: fn runs in a transaction on the engine's
// database, which commits with the step's record (exactly once, as
// TxStep). A GoTx step holds a pool connection while it runs.
func GoTx[T any](ctx *Context, name string, fn func(context.Context, pgx.Tx) (T, error), opts *StepOpts) *Future[T] {
	return startBranch[T](ctx, name, KindTx, opts, txBody(fn))
}

// GoUndo is Go with a compensation: when the step completes, undo(result)
// is registered as its undo (a saga's, see Context.Compensate), so a run
// that fails or is cancelled afterwards undoes it. Parallel steps'
// undos run, with the others, newest first by the time their steps
// completed (recorded, so a replay keeps the order); a step that did not
// complete registers none, and steps still running when the run fails are
// cancelled before the undos run. An undo that is malformed (see Undo)
// fails the step with ErrInvalidArgument. Package compensation wraps it.
func GoUndo[T any](ctx *Context, name string, fn func(context.Context) (T, error), undo func(result T) Undo, opts *StepOpts) *Future[T] {
	return Go(ctx, name, fn, withUndo(opts, undo))
}

// GoTxUndo is GoTx with a compensation, as GoUndo.
func GoTxUndo[T any](ctx *Context, name string, fn func(context.Context, pgx.Tx) (T, error), undo func(result T) Undo, opts *StepOpts) *Future[T] {
	return GoTx(ctx, name, fn, withUndo(opts, undo))
}

// GoActivity is RunActivity started without waiting, as Go: a request ID
// is stored (in the record of its position) before its first attempt and
// sent with every attempt, after crashes and replays too. An activity that
// does not heartbeat (ActivityOpts.HeartbeatTimeout 0) is not stopped by
// the run's cancellation nor by the workflow function's return once it
// began: it runs its attempts to a definite outcome, so an effect it had
// is known and GoActivityUndo's undo runs for it. As with RunActivity, an
// activity that runs out of retries parks the run (one of its attempts
// may have taken effect, its answer lost), unless
// ActivityOpts.ReturnExhausted returns the failure to Get.
func GoActivity[T any](ctx *Context, name string, fn func(ctx context.Context, a *ActivityAttempt) (T, error), opts *ActivityOpts) *Future[T] {
	return goActivity(ctx, name, opts, fn, nil)
}

// GoActivityUndo is GoActivity with a compensation, as GoUndo.
func GoActivityUndo[T any](ctx *Context, name string, fn func(ctx context.Context, a *ActivityAttempt) (T, error),
	undo func(result T) Undo, opts *ActivityOpts) *Future[T] {
	return goActivity(ctx, name, opts, fn, undo)
}

func goActivity[T any](ctx *Context, name string, opts *ActivityOpts, fn func(context.Context, *ActivityAttempt) (T, error),
	undo func(T) Undo) *Future[T] {
	if opts == nil {
		opts = &ActivityOpts{}
	}
	sopts := &StepOpts{RetryPolicy: opts.RetryPolicy, ReturnExhausted: opts.ReturnExhausted, ScheduleToCloseTimeout: opts.ScheduleToCloseTimeout,
		Input: opts.Input}
	if undo != nil {
		sopts = withUndo(sopts, undo)
	}
	sopts.activity = opts
	return startBranch[T](ctx, name, KindActivity, sopts, activityBody(name, opts, fn))
}

// withUndo carries a parallel step's undo builder to startBranch inside a
// copy of its options.
func withUndo[T any](opts *StepOpts, undo func(T) Undo) *StepOpts {
	o := &StepOpts{}
	if opts != nil {
		*o = *opts
	}
	o.undo = func(raw []byte) (*Undo, error) {
		if undo == nil {
			return nil, nil
		}
		var v T
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("pgdurable: decoding the result for its undo: %w", err)
		}
		u := undo(v)
		if err := u.check(); err != nil {
			return nil, err
		}
		return &u, nil
	}
	return o
}

// branch is one parallel step as its goroutine runs it: its attempts are
// made (execute) and judged (judge) as a sequential step's are; it writes
// each record itself, and waits out its backoffs on its own goroutine.
type branch struct {
	stepState
	// undo, once the step completed with one (GoUndo), and when.
	undo   *Undo
	doneAt time.Time
}

// undoFor builds the branch's undo for its output (nil without GoUndo).
func (b *branch) undoFor(out []byte) (*Undo, error) {
	if b.call.opts == nil || b.call.opts.undo == nil {
		return nil, nil
	}
	return b.call.opts.undo(out)
}

// completed builds the record of the branch's successful attempt, with
// its undo's name (GoUndo), which it keeps until the record is written.
func (b *branch) completed(attempt int) func(out []byte) (*store.StepRecord, error) {
	return func(out []byte) (*store.StepRecord, error) {
		u, err := b.undoFor(out)
		if err != nil {
			return nil, fmt.Errorf("%w: step %q: %v", ErrInvalidArgument, b.call.name, err)
		}
		now := b.d.e.now()
		rec := b.record(store.StepCompleted, attempt)
		rec.Output, rec.CompletedAt = out, &now
		if u != nil {
			rec.Compensation = &u.Name
		}
		b.undo, b.doneAt = u, now
		return rec, nil
	}
}

// ctx is the context the branch's attempts run in: the delivery's for a
// settling activity once its request ID is stored (see GoActivity), else
// the parallel steps' (cancelled by the run's cancellation and the
// workflow function's return).
func (b *branch) ctx() context.Context {
	if b.call.settle && b.requestID != nil {
		return b.d.ctx
	}
	return b.d.branchCtx
}

func startBranch[T any](ctx *Context, name string, kind StepKind, opts *StepOpts,
	body func(context.Context, *attemptState) ([]byte, error)) *Future[T] {
	d := ctx.d
	f := &Future[T]{d: d, name: name, done: make(chan struct{})}
	resolve := func(raw []byte, err error) *Future[T] {
		f.raw, f.err = raw, err
		close(f.done)
		return f
	}
	if err := opts.validate(); err != nil {
		return resolve(nil, fmt.Errorf("%w: step %q: %v", ErrInvalidArgument, name, err))
	}
	hash, err := opts.inputHash()
	if err != nil {
		return resolve(nil, fmt.Errorf("%w: step %q: %v", ErrInvalidArgument, name, err))
	}
	if !d.markPendingPatches() {
		return resolve(nil, d.endErr)
	}
	seq, err := d.enterStep("step", name, false)
	if err != nil {
		return resolve(nil, err)
	}
	d.inStep.Store(false) // the workflow goes on while it runs
	if d.cancelRequested.Load() {
		if rec := d.pos.at(seq); rec == nil || rec.Kind == string(KindCompensation) {
			d.pos.giveBack()
			return resolve(nil, ErrCancelled)
		}
	}
	rec, ok := d.replay(seq, name, kind)
	if !ok || !d.sameInput(seq, name, hash, rec) {
		return resolve(nil, d.endErr)
	}
	if rec != nil {
		switch rec.Status {
		case store.StepCompleted:
			d.e.obs.StepReplayed(StepReplayedEvent{Workflow: d.wf.name, Kind: kind})
			if opts != nil && opts.undo != nil && rec.Compensation != nil {
				u, err := opts.undo(rec.Output)
				if err != nil {
					return resolve(nil, fmt.Errorf("%w: step %q: %v", ErrInvalidArgument, name, err))
				}
				var done time.Time
				if rec.CompletedAt != nil {
					done = *rec.CompletedAt
				}
				d.registerBranchUndo(seq, *u, done)
			}
			return resolve(rec.Output, nil)
		case store.StepFailed:
			return resolve(nil, stepErrorFromRecord(rec))
		case store.StepCancelled:
			return resolve(nil, ErrCancelled)
		}
	}
	activity := kind == KindActivity
	call := &stepCall{name: name, kind: kind, opts: opts, body: body, tx: kind == KindTx, requestID: activity, inputHash: hash,
		settle: activity && opts.activity.HeartbeatTimeout <= 0,
		// A parallel step returns its failure to Get whatever the run's
		// compensations; an activity that ran out of retries parks the run
		// unless ReturnExhausted, as RunActivity's.
		returnExhausted: !activity || opts.ReturnExhausted}
	b := &branch{stepState: d.newStepState(call, seq, rec)}
	if !d.flushStarted() {
		return resolve(nil, d.endErr) // the workflow goes on, and may wait for this step
	}
	if !d.takeBranchSlot() {
		return resolve(nil, d.ctx.Err())
	}
	d.branches.Add(1)
	go func() {
		defer d.branches.Done()
		defer d.releaseBranchSlot()
		raw, park, err := b.run()
		f.raw, f.err, f.park = raw, err, park
		if park != nil {
			d.branchPark.CompareAndSwap(nil, park)
		}
		close(f.done)
	}()
	return f
}

// run makes the branch's attempts until it has an outcome: its output, its
// failure (recorded, returned by Get), an interruption (the delivery's
// context ended: Get ends the delivery), or a panic (park). It keeps the
// promises a sequential step keeps, with the same stepState: an attempt
// is announced when it must be (a worker that dies in it makes it count,
// as worker_lost), a step the run's cancellation stops is recorded
// cancelled, and a settling activity of a cancelled run is stopped when
// no attempt can have taken effect, or parked once maxSettleAttempts
// more did not settle it.
func (b *branch) run() (_ []byte, _ *parkReason, _ error) {
	d := b.d
	for {
		attempt := b.attempts + 1
		if d.ctx.Err() != nil {
			return nil, nil, d.ctx.Err()
		}
		settling := b.settling()
		if b.ctx().Err() != nil || (settling && b.noEffect && b.lost == nil) {
			return nil, nil, b.cancelled(b.attempts)
		}
		if settling && b.settled >= maxSettleAttempts && b.lost == nil {
			return nil, b.unsettled(), nil
		}
		var r attemptResult
		a := &attemptState{d: d, seq: b.seq, attempt: attempt, completed: b.completed(attempt), parallel: true}
		if b.lost != nil {
			r = attemptResult{err: b.lost, started: time.Now()}
			b.lost = nil
		} else {
			if b.call.requestID && b.requestID == nil {
				// The request ID is stored before the first attempt, with
				// its announcement.
				id := uuid.Must(uuid.NewV7())
				b.requestID = &id
			}
			if b.announces(attempt) {
				rec := b.record(store.StepStarted, attempt)
				rec.Error = b.lastErr
				if err := b.write(rec); err != nil {
					return nil, nil, err
				}
			}
			if b.requestID != nil {
				a.requestID = *b.requestID
			}
			r = b.execute(b.ctx(), a)
		}
		if b.call.tx && r.err != nil {
			b.written = true // its insert may have committed: upsert from now on
		}
		switch {
		case r.p != nil: // judged below: it parks the run
		case r.err == nil:
			b.observe(attempt, "completed", r.started)
			if !a.recorded { // a tx step's is recorded in its own transaction
				rec, err := a.completed(r.out)
				if err != nil {
					return nil, nil, err
				}
				if err := b.write(rec); err != nil {
					return nil, nil, err
				}
			}
			if b.undo != nil {
				d.registerBranchUndo(b.seq, *b.undo, b.doneAt)
			}
			return r.out, nil, nil
		case outcomeLost(r.err) || d.ctx.Err() != nil:
			b.observe(attempt, "interrupted", r.started)
			return nil, nil, r.err
		case b.ctx().Err() != nil && !r.timedOut:
			b.observe(attempt, "cancelled", r.started)
			return nil, nil, b.cancelled(attempt)
		}
		b.failedAttempt(r.err, settling || b.settling())
		f := b.judge(attempt, r.err, r.p, b.noEffect, b.settled)
		b.observe(attempt, f.outcome, r.started)
		if f.park != nil {
			return nil, f.park, nil
		}
		if err := b.write(f.rec); err != nil {
			return nil, nil, err
		}
		if f.rec.Status == store.StepFailed {
			return nil, nil, stepErrorFromRecord(f.rec)
		}
		b.attempts, b.lastErr = attempt, f.rec.Error
		// The run's cancellation ends the backoff of a settling activity
		// none of whose attempts had an effect: it stops at once (above).
		var stop <-chan struct{}
		if b.call.settle && b.noEffect {
			stop = d.fwd.Done()
		}
		t := time.NewTimer(f.delay)
		select {
		case <-t.C:
		case <-b.ctx().Done():
			t.Stop()
		case <-stop:
			t.Stop()
		}
	}
}

// settling: the branch is an activity that runs to a definite outcome
// (see GoActivity) and its run's cancellation was requested: its next
// attempt is made only to learn whether an earlier one took effect.
func (b *branch) settling() bool {
	return b.call.settle && b.requestID != nil && b.d.cancelRequested.Load()
}

// cancelled is ErrCancelled for a branch that the run's cancellation (or
// the workflow function's return) stopped after n attempts. A branch with
// a record is recorded as cancelled, as a sequential step is, so a
// finished run shows no step still retrying.
func (b *branch) cancelled(n int) error {
	if !b.written || b.d.ctx.Err() != nil {
		return ErrCancelled
	}
	rec := b.record(store.StepCancelled, n)
	rec.Error = b.lastErr
	now := b.d.e.now()
	rec.CompletedAt = &now
	if err := b.write(rec); err != nil {
		return err
	}
	return ErrCancelled
}

// write writes the branch's record fenced, with the delivery's other
// writes serialized (see delivery.writeMu).
func (b *branch) write(rec *store.StepRecord) error {
	d := b.d
	sent := time.Now()
	w := &store.RecordWrite{Fence: d.fence(), Records: []*store.StepRecord{rec}, KeepLease: d.keepsLease()}
	res, err := d.commit(w)
	if err != nil {
		return err
	}
	b.written = true
	if !w.KeepLease {
		d.extendedAt(sent)
		d.progressed.Store(true)
	}
	d.noteCancel(res.CancelRequested)
	return nil
}

// settleBranch turns a parallel step's outcome into what Get returns, on
// the workflow's goroutine: a park is carried out, an interruption ends
// the delivery.
func (d *delivery) settleBranch(raw []byte, err error, park *parkReason) ([]byte, error) {
	if d.ended {
		return nil, d.endErr
	}
	var unknown *outcomeUnknownError
	switch {
	case park != nil:
		d.park(park.rec, park)
		return nil, d.endErr
	case errors.Is(err, store.ErrLeaseLost) || errors.As(err, &unknown):
		d.end(err)
		return nil, d.endErr
	case d.ctx.Err() != nil && err != nil && !errors.As(err, new(*StepError)):
		d.interrupted()
		return nil, d.endErr
	case err != nil:
		var se *StepError
		if errors.As(err, &se) || errors.Is(err, ErrCancelled) || errors.Is(err, ErrInvalidArgument) {
			return nil, err
		}
		// A write of the branch failed: as a failed write of the workflow's.
		d.end(err)
		return nil, d.endErr
	}
	return raw, nil
}

// takeBranchSlot waits for one of the run's MaxParallelSteps; false when
// the delivery ends first.
func (d *delivery) takeBranchSlot() bool {
	if d.branchSlots == nil {
		d.branchSlots = make(chan struct{}, d.wf.maxParallel)
		d.branchEnded = make(chan struct{}, 1)
		d.branchCtx, d.cancelBranches = context.WithCancelCause(d.fwd)
	}
	select {
	case d.branchSlots <- struct{}{}:
		return true
	case <-d.ctx.Done():
		return false
	}
}

// releaseBranchSlot frees a parallel step's slot and tells a wait in
// place (pauseForBranches) that a step ended.
func (d *delivery) releaseBranchSlot() {
	<-d.branchSlots
	select {
	case d.branchEnded <- struct{}{}:
	default:
	}
}

// parkPanickedBranch parks the run when a parallel step panicked, as Get
// or the workflow's return would: a wait in place calls it, since the
// run's suspension would drop the park (kept in memory only) and the step
// would run again on the next delivery. True when the delivery has ended.
func (d *delivery) parkPanickedBranch() bool {
	if p := d.branchPark.Load(); p != nil && !d.ended {
		d.park(p.rec, p)
	}
	return d.ended
}

// pauseForBranches is one pause of a wait that holds the delivery in
// place while parallel steps run, rather than ending it (a long sleep or
// backoff, a signal wait: ending it would cut the steps off, and the next
// delivery would run them again). It returns after childPoll, or sooner
// when until (nil: none) comes, a parallel step ends, the delivery's
// context ends or, with watchCancel, the run's cancellation is
// requested; the caller looks again.
func (d *delivery) pauseForBranches(until *time.Time, watchCancel bool) {
	wait := childPoll
	if until != nil {
		wait = min(wait, max(until.Sub(d.e.now()), 0))
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	var cancelled <-chan struct{}
	if watchCancel {
		cancelled = d.fwd.Done()
	}
	select {
	case <-t.C:
	case <-d.branchEnded:
	case <-cancelled:
	case <-d.ctx.Done():
	}
}

// stopBranches cancels the parallel steps still running when the workflow
// function returned, and waits for them: no write of this delivery follows
// its end. A branch that panicked unseen parks the run.
func (d *delivery) stopBranches() {
	if d.branchSlots == nil {
		return
	}
	d.flushStarted() // settling activities may take long to end
	d.cancelBranches(errWorkflowReturned)
	d.branches.Wait()
	if p := d.branchPark.Load(); p != nil && !d.ended {
		d.park(p.rec, p)
	}
}

// errWorkflowReturned cancels the parallel steps the workflow function
// left running when it returned.
var errWorkflowReturned = errors.New("pgdurable: the workflow function returned while this parallel step ran")
