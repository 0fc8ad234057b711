package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
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
	return startBranch[T](ctx, name, KindStep, opts, func(sctx context.Context, _ *branch) ([]byte, error) {
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
	return startBranch[T](ctx, name, KindTx, opts, branchTxBody(fn))
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
func GoActivity[T any](ctx *Context, name string, opts *ActivityOpts, fn func(ctx context.Context, a *ActivityAttempt) (T, error)) *Future[T] {
	return goActivity(ctx, name, opts, fn, nil)
}

// GoActivityUndo is GoActivity with a compensation, as GoUndo.
func GoActivityUndo[T any](ctx *Context, name string, opts *ActivityOpts, fn func(ctx context.Context, a *ActivityAttempt) (T, error),
	undo func(result T) Undo) *Future[T] {
	return goActivity(ctx, name, opts, fn, undo)
}

func goActivity[T any](ctx *Context, name string, opts *ActivityOpts, fn func(context.Context, *ActivityAttempt) (T, error),
	undo func(T) Undo) *Future[T] {
	if opts == nil {
		opts = &ActivityOpts{}
	}
	sopts := &StepOpts{RetryPolicy: opts.RetryPolicy, ReturnExhausted: opts.ReturnExhausted, ScheduleToCloseTimeout: opts.ScheduleToCloseTimeout}
	if undo != nil {
		sopts = withUndo(sopts, undo)
	}
	sopts.activity = opts
	return startBranch[T](ctx, name, KindActivity, sopts, func(sctx context.Context, b *branch) ([]byte, error) {
		return runAttempt(sctx, b.d, name, opts, &ActivityAttempt{RequestID: b.requestID, Attempt: b.attempts + 1}, fn)
	})
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

// branch is one parallel step as its goroutine runs it.
type branch struct {
	d         *delivery
	seq       int
	name      string
	kind      StepKind
	opts      *StepOpts
	policy    RetryPolicy
	startedAt time.Time
	attempts  int
	requestID uuid.UUID  // an activity's, stored before its first attempt
	first     *time.Time // first failure
	lastErr   []byte
	fresh     bool // no record of this position exists yet
	// undo, once the step completed with one (GoUndo), and when.
	undo   *Undo
	doneAt time.Time
}

// undoFor builds the branch's undo for its output (nil without GoUndo).
func (b *branch) undoFor(out []byte) (*Undo, error) {
	if b.opts == nil || b.opts.undo == nil {
		return nil, nil
	}
	return b.opts.undo(out)
}

func (b *branch) record(status string, n int) *store.StepRecord {
	rec := &store.StepRecord{Seq: b.seq, Name: b.name, Kind: string(b.kind), Status: status, Attempts: n,
		FirstFailedAt: b.first, StartedAt: b.startedAt, Fresh: b.fresh}
	if b.requestID != uuid.Nil {
		rec.RequestID = &b.requestID
	}
	return rec
}

// settles reports whether the branch runs to a definite outcome whatever
// the run's cancellation: an activity that does not heartbeat, once its
// request ID is stored (see GoActivity).
func (b *branch) settles() bool {
	return b.kind == KindActivity && b.opts.activity.HeartbeatTimeout <= 0 && b.requestID != uuid.Nil
}

// ctx is the context the branch's attempts run in: the delivery's for a
// settling activity, else the parallel steps' (cancelled by the run's
// cancellation and the workflow function's return).
func (b *branch) ctx() context.Context {
	if b.settles() {
		return b.d.ctx
	}
	return b.d.branchCtx
}

func startBranch[T any](ctx *Context, name string, kind StepKind, opts *StepOpts,
	body func(context.Context, *branch) ([]byte, error)) *Future[T] {
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
	seq, err := d.enterStep("step", name)
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
	if !ok {
		return resolve(nil, d.endErr)
	}
	if rec != nil {
		switch rec.Status {
		case store.StepCompleted:
			d.e.obs.StepReplayed(d.wf.name, kind)
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
	b := &branch{d: d, seq: seq, name: name, kind: kind, opts: opts, startedAt: d.e.now(), fresh: rec == nil}
	if opts != nil && opts.RetryPolicy != nil {
		b.policy = *opts.RetryPolicy
	}
	b.policy = b.policy.merge(d.wf.retry, &d.e.retry)
	if rec != nil {
		b.attempts, b.first, b.lastErr, b.startedAt = rec.Attempts, rec.FirstFailedAt, rec.Error, rec.StartedAt
		if rec.RequestID != nil {
			b.requestID = *rec.RequestID
		}
	}
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
		raw, park, err := b.run(body)
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
// context ended: Get ends the delivery), or a panic (park).
func (b *branch) run(body func(context.Context, *branch) ([]byte, error)) (_ []byte, _ *parkReason, _ error) {
	d := b.d
	for {
		attempt := b.attempts + 1
		if d.ctx.Err() != nil {
			return nil, nil, d.ctx.Err()
		}
		if b.ctx().Err() != nil {
			return nil, nil, ErrCancelled
		}
		if b.kind == KindActivity && b.requestID == uuid.Nil {
			// The request ID is stored before the first attempt.
			b.requestID = uuid.New()
			if err := b.write(b.record(store.StepStarted, 0)); err != nil {
				return nil, nil, err
			}
		}
		started := time.Now()
		timeout, cause := attemptBound(b.opts, b.startedAt, d.e.now())
		sctx, span := d.e.tr.attempt(b.ctx(), b.name, b.kind, nil, b.seq, attempt, b.requestID)
		out, p, timedOut, err := bounded(sctx, timeout, cause, b.kind == KindTx, func(ctx context.Context) (out []byte, p *panicInfo, err error) {
			defer func() {
				if r := recover(); r != nil {
					p = &panicInfo{value: r, stack: debug.Stack()}
				}
			}()
			out, err = body(ctx, b)
			var pe *panicError // an activity's, recovered on its own goroutine
			if errors.As(err, &pe) {
				return nil, pe.p, nil
			}
			return out, nil, err
		})
		if timedOut {
			err = stepTimeout(b.name, attempt, cause, err)
		}
		attempted(span, p, err)
		observe := func(outcome string) {
			d.e.obs.StepAttempt(d.wf.name, b.name, b.kind, attempt, outcome, time.Since(started))
		}
		switch {
		case p != nil:
			observe("parked")
			info := stepFailure(&PanicError{Value: fmt.Sprint(p.value)}, ClassPanic, b.name, b.seq, attempt)
			info.Stack = truncateStack(p.stack)
			rec := b.record(store.StepParked, attempt)
			rec.Error = info.json()
			return nil, &parkReason{reason: ReasonPanic, info: info, rec: rec}, nil
		case err == nil:
			observe("completed")
			if b.kind == KindTx {
				// Recorded in its own transaction, with its undo's name.
				if b.undo != nil {
					d.registerBranchUndo(b.seq, *b.undo, b.doneAt)
				}
				return out, nil, nil
			}
			u, err := b.undoFor(out)
			if err != nil {
				return nil, nil, fmt.Errorf("%w: step %q: %v", ErrInvalidArgument, b.name, err)
			}
			now := d.e.now()
			rec := b.record(store.StepCompleted, attempt)
			rec.Output, rec.CompletedAt = out, &now
			if u != nil {
				rec.Compensation = &u.Name
			}
			if err := b.write(rec); err != nil {
				return nil, nil, err
			}
			if u != nil {
				d.registerBranchUndo(b.seq, *u, now)
			}
			return out, nil, nil
		case errors.Is(err, store.ErrLeaseLost) || d.ctx.Err() != nil:
			observe("interrupted")
			return nil, nil, err
		case b.ctx().Err() != nil && !timedOut:
			observe("cancelled")
			return nil, nil, ErrCancelled
		}
		now := d.e.now()
		if b.first == nil {
			b.first = &now
		}
		delay := retryDelay(b.policy, attempt, err)
		next := now.Add(delay)
		err = lateRetry(b.opts, b.startedAt, next, err, attempt, b.policy.MaximumAttempts)
		if info, final, exhausted := finalFailure(err, b.name, b.seq, attempt, b.policy.MaximumAttempts); final {
			if exhausted && b.kind == KindActivity && !b.opts.ReturnExhausted {
				// One of its attempts may have taken effect, its answer
				// lost: parked for an operator, as RunActivity's.
				observe("parked")
				rec := b.record(store.StepParked, attempt)
				rec.Error = info.json()
				return nil, &parkReason{reason: ReasonRetriesExhausted, info: info, rec: rec}, nil
			}
			observe("failed")
			rec := b.record(store.StepFailed, attempt)
			rec.Error, rec.CompletedAt = info.json(), &now
			if err := b.write(rec); err != nil {
				return nil, nil, err
			}
			return nil, nil, stepErrorFromRecord(rec)
		}
		observe("retry")
		info := stepFailure(err, classOf(err, ClassTransient), b.name, b.seq, attempt)
		rec := b.record(store.StepRetrying, attempt)
		rec.Error, rec.NextAttemptAt = info.json(), &next
		if err := b.write(rec); err != nil {
			return nil, nil, err
		}
		b.attempts, b.lastErr = attempt, rec.Error
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-b.ctx().Done():
			t.Stop()
		}
	}
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
	b.fresh = false
	if !w.KeepLease {
		d.extendedAt(sent)
		d.progressed.Store(true)
	}
	d.noteCancel(res.CancelRequested)
	return nil
}

// branchTxBody is txBody for a parallel tx step: its record alone commits
// with fn's writes (the workflow's own buffered record is not its to
// write).
func branchTxBody[T any](fn func(context.Context, pgx.Tx) (T, error)) func(context.Context, *branch) ([]byte, error) {
	return func(sctx context.Context, b *branch) ([]byte, error) {
		d := b.d
		var out []byte
		var already bool
		attempt := b.attempts + 1
		sent := time.Now()
		err := pgx.BeginFunc(d.ctx, d.e.pool, func(tx pgx.Tx) error {
			v, err := fn(sctx, tx)
			if err != nil {
				return err
			}
			var late *timeoutError
			if errors.As(context.Cause(sctx), &late) {
				return late // past its timeout: it failed, its writes roll back
			}
			if out, err = encodeOutput(v, d.e.cfg.MaxPayloadBytes); err != nil {
				return err
			}
			u, err := b.undoFor(out)
			if err != nil {
				return Permanent(fmt.Errorf("%w: step %q: %v", ErrInvalidArgument, b.name, err))
			}
			now := d.e.now()
			rec := b.record(store.StepCompleted, attempt)
			rec.Output, rec.CompletedAt = out, &now
			if u != nil {
				rec.Compensation = &u.Name
			}
			b.undo, b.doneAt = u, now
			cancel, written, err := store.WriteSteps(d.ctx, tx, d.fence(), "", rec)
			d.noteCancel(cancel)
			if err != nil {
				return err
			}
			if written == 0 {
				already = true
				return errAlreadyRecorded
			}
			return nil
		})
		switch {
		case err == nil:
			d.extendedAt(sent)
			d.progressed.Store(true)
			return out, nil
		case already:
			rec, gerr := store.GetStep(d.ctx, d.e.pool, d.runID, b.seq)
			if gerr == nil && rec.Status == store.StepCompleted {
				return rec.Output, nil
			}
			return nil, &outcomeUnknownError{err: fmt.Errorf("tx step %q already recorded, but reading its record: %v", b.name, gerr)}
		}
		b.fresh = false // its insert may have committed: upsert from now on
		return nil, err
	}
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
