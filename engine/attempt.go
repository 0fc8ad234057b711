package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// stepState is what a step's record carries from one attempt to the next,
// the same for a step the workflow waits for (attemptLoop) and a parallel
// one (branch): the two differ only in how they schedule attempts and
// write records; what an attempt is (execute) and what its failure comes to
// (judge) is one code.
type stepState struct {
	d      *delivery
	call   *stepCall
	seq    int
	log    *slog.Logger
	policy RetryPolicy

	startedAt   time.Time
	attempts    int // attempts made so far
	firstFailed *time.Time
	requestID   *uuid.UUID
	// lastErr is the latest failure's recorded error, kept in the record
	// while the next attempt runs.
	lastErr []byte
	// written: a record of this step may exist, so the next one upserts
	// it; and its position stays used even if the run's cancellation
	// stops it (a forward step stopped before anything was written gives
	// its position back to the undos).
	written bool
	// noEffect: every attempt so far failed with an error marked NoEffect
	// (see attemptLoop.stoppable).
	noEffect bool
	// settled counts the attempts made after the run's cancellation to
	// settle an activity that may have taken effect (see maxSettleAttempts).
	settled int
	// lost is the failure of the recorded attempt that never ended.
	lost error
}

// newStepState picks a step up at position seq from its record (nil for a
// new step).
func (d *delivery) newStepState(call *stepCall, seq int, rec *store.StepRecord) stepState {
	s := stepState{d: d, call: call, seq: seq, log: d.log.With("step", call.name, "seq", seq), startedAt: d.e.now(), written: rec != nil,
		noEffect: true}
	if call.opts != nil && call.opts.RetryPolicy != nil {
		s.policy = *call.opts.RetryPolicy
	}
	s.policy = s.policy.merge(d.wf.retry, &d.e.retry)
	if rec != nil {
		// The step started when its first record says, whichever delivery
		// wrote it: its ScheduleToCloseTimeout counts from there.
		s.attempts, s.firstFailed, s.requestID, s.lastErr, s.startedAt = rec.Attempts, rec.FirstFailedAt, rec.RequestID, rec.Error, rec.StartedAt
		switch {
		case rec.Status == store.StepStarted && rec.Attempts > 0:
			// Attempt rec.Attempts began and has no outcome: its worker
			// died, or lost its lease, during it. It counts, and it may
			// have taken effect.
			s.lost = &workerLostError{attempt: rec.Attempts}
			s.attempts, s.noEffect = rec.Attempts-1, false
			if info := decodeErrorInfo(rec.Error); info != nil {
				s.settled = info.SettleAttempts
			}
		case rec.Status == store.StepRetrying:
			// Records older than the flag say nothing: they may have.
			info := decodeErrorInfo(rec.Error)
			s.noEffect = info != nil && info.NoEffect
			if info != nil {
				s.settled = info.SettleAttempts
			}
		}
	}
	return s
}

// announces reports whether attempt is written down (status started)
// before it runs: an activity's attempts, every retry, and the attempts of
// a step with a ScheduleToCloseTimeout, so that an attempt whose worker
// dies counts (worker_lost) and the step's time counts from its first
// start across deliveries. A plain or tx step's first attempt is not,
// which would cost a round trip per step: a crash in it is bounded by
// MaxDeliveries.
func (s *stepState) announces(attempt int) bool {
	return s.call.requestID || attempt > 1 || s.call.opts.scheduleToClose() > 0
}

// unsettled is the park of an activity whose run was cancelled and whose
// outcome its maxSettleAttempts attempts after the cancellation did not
// learn: an operator must look (the request ID is in the record) and
// replay or discard.
func (s *stepState) unsettled() *parkReason {
	info := stepFailure(&unsettledError{attempts: s.settled, last: decodeErrorInfo(s.lastErr).Err()},
		ClassUnsettled, s.call.name, s.seq, s.attempts)
	rec := s.record(store.StepParked, s.attempts)
	rec.Error = info.json()
	s.log.Warn("cancelled run could not settle an activity; parking it", "settle_attempts", s.settled)
	return &parkReason{reason: ReasonRetriesExhausted, info: info, rec: rec}
}

// failedAttempt folds attempt's failure err into what the next record
// carries: whether every failure so far had no effect and, when settling
// (an activity retried after its run's cancellation), one more settle
// attempt.
func (s *stepState) failedAttempt(err error, settling bool) {
	s.noEffect = s.noEffect && hasNoEffect(err)
	if settling {
		s.settled++
	}
}

// record builds this step's record of attempt n.
func (s *stepState) record(status string, n int) *store.StepRecord {
	return &store.StepRecord{Seq: s.seq, Name: s.call.name, Kind: string(s.call.kind), Status: status, Attempts: n,
		RequestID: s.requestID, FirstFailedAt: s.firstFailed, StartedAt: s.startedAt, CompensationOf: s.call.compensationOf,
		InputHash: s.call.inputHash, Fresh: !s.written}
}

// attemptState is what one attempt knows about itself.
type attemptState struct {
	d            *delivery
	seq, attempt int
	requestID    uuid.UUID
	// prev is the record of the step before a tx step, not yet written,
	// which commits in the tx step's transaction (nil for a parallel step:
	// the workflow's buffered record is not its to write).
	prev *store.StepRecord
	// parallel: a parallel step's (Go), on its own goroutine: it neither
	// joins the workflow's chain of tx steps nor leaves one (see txChain).
	parallel bool
	// completed builds the record of a successful attempt; a body that
	// writes it in its own transaction (a tx step) sets recorded.
	completed   func(out []byte) (*store.StepRecord, error)
	completedAt time.Time // the completed record's time, once built
	recorded    bool
}

// panicInfo is a panic recovered from a step's attempt, with its stack.
type panicInfo struct {
	value any
	stack []byte
}

// attemptResult is what came of one attempt.
type attemptResult struct {
	out      []byte
	p        *panicInfo // it panicked
	err      error
	timedOut bool // it passed its StartToCloseTimeout or ScheduleToCloseTimeout
	started  time.Time
}

// execute makes one attempt of the step, in a context of parent: its
// span, the bound of its timeouts (see attemptBound and bounded), and its
// panic recovered. Every kind of step makes its attempts here.
func (s *stepState) execute(parent context.Context, a *attemptState) attemptResult {
	d, call := s.d, s.call
	r := attemptResult{started: time.Now()}
	if d.e.replay != nil {
		d.e.replay.stop(s.seq, call.name, call.kind)
		r.err = errReplayStopped
		return r
	}
	if call.opts != nil && call.opts.RateLimit != "" {
		if r.err = d.e.takeTurn(parent, call.opts.RateLimit); r.err != nil {
			return r
		}
		r.started = time.Now()
	}
	timeout, cause := attemptBound(call.opts, s.startedAt, d.e.now())
	sctx, span := d.e.tr.attempt(parent, call.name, call.kind, call.compensationOf, s.seq, a.attempt, a.requestID)
	r.out, r.p, r.timedOut, r.err = bounded(sctx, timeout, cause, call.tx, func(ctx context.Context) ([]byte, *panicInfo, error) {
		return runBody(ctx, call.body, a)
	})
	if r.timedOut && !outcomeLost(r.err) {
		// A lost outcome stays one (a tx step whose timeout cut the
		// connection of the transaction it shared: the steps before it
		// did not commit), so the delivery ends instead of retrying.
		r.out, r.p, r.err = nil, nil, stepTimeout(call.name, a.attempt, cause, r.err)
	}
	attempted(span, r.p, r.err)
	return r
}

// runBody runs body once, recovering a panic with its stack (a body that
// runs user code on another goroutine returns its panic as *panicError).
func runBody(ctx context.Context, body func(context.Context, *attemptState) ([]byte, error), a *attemptState) (out []byte, p *panicInfo, err error) {
	defer func() {
		if r := recover(); r != nil {
			p = &panicInfo{value: r, stack: debug.Stack()}
		}
	}()
	out, err = body(ctx, a)
	var pe *panicError
	if errors.As(err, &pe) {
		return nil, pe.p, nil
	}
	return out, nil, err
}

// panicError carries a panic recovered on another goroutine.
type panicError struct{ p *panicInfo }

func (e *panicError) Error() string { return fmt.Sprintf("panic: %v", e.p.value) }

// observe reports the end of attempt, begun at started, to the observer
// (outcome: completed, retry, failed, parked, cancelled, interrupted).
func (s *stepState) observe(attempt int, outcome string, started time.Time) {
	s.d.e.obs.StepAttempt(StepAttemptEvent{Workflow: s.d.wf.name, Step: s.call.name, Kind: s.call.kind, Attempt: attempt, Outcome: outcome, Duration: time.Since(started)})
}

// outcomeLost reports whether err says that an attempt's outcome cannot be
// known by this delivery: its lease was lost, or the commit of its record
// got no answer. The delivery ends; the next one reads the records.
func outcomeLost(err error) bool {
	var unknown *outcomeUnknownError
	return errors.Is(err, store.ErrLeaseLost) || errors.As(err, &unknown) || errors.Is(err, errReplayStopped)
}

// failure is what a failed attempt comes to: its record (status parked,
// failed or retrying), with the park's reason or the retry's time.
type failure struct {
	rec     *store.StepRecord
	park    *parkReason // parked: an operator must act
	delay   time.Duration
	next    time.Time // retrying: when the next attempt is due
	outcome string    // for the observer: parked, failed, retry
}

// judge classifies attempt's failure (err, or the panic p): a panic parks
// the run; a failure that is final (permanent, out of attempts or of the
// step's time) parks it when nothing can undo it automatically, and is
// recorded as failed otherwise; any other is retried after the policy's
// backoff. noEffect and settled go into a retry's record (see attemptLoop).
func (s *stepState) judge(attempt int, err error, p *panicInfo, noEffect bool, settled int) failure {
	d, call, name := s.d, s.call, s.call.name
	now := d.e.now()
	if s.firstFailed == nil {
		s.firstFailed = &now
	}
	rec := s.record("", attempt)
	parkAs := func(reason DeadReason) DeadReason {
		if call.parkAs != "" {
			return call.parkAs
		}
		return reason
	}
	if p != nil {
		info := stepFailure(&PanicError{Value: fmt.Sprint(p.value)}, ClassPanic, name, s.seq, attempt)
		info.Stack = truncateStack(p.stack)
		rec.Status, rec.Error = store.StepParked, info.json()
		s.log.Error("step panicked", "attempt", attempt, "error_class", info.Class, "panic", info.Message)
		return failure{rec: rec, park: &parkReason{reason: parkAs(ReasonPanic), info: info, rec: rec}, outcome: "parked"}
	}
	delay := retryDelay(s.policy, attempt, err)
	next := now.Add(delay)
	// A retry that would begin past the step's deadline is not made: the
	// step fails as if its retries ran out, the timeout in its error.
	err = lateRetry(call.opts, s.startedAt, next, err, attempt, s.policy.MaximumAttempts)
	if info, final, exhausted := finalFailure(err, name, s.seq, attempt, s.policy.MaximumAttempts); final {
		// An activity that ran out of retries may have taken effect on an
		// attempt whose answer was lost; compensating now would skip its
		// undo. Parked, a replay settles it with the same request ID. (A
		// parallel step reads no compensations: it is an activity, or
		// returns its failure.)
		if call.parkAs != "" || (exhausted && !call.returnExhausted && (call.requestID || !d.hasCompensations())) {
			reason := parkAs(ReasonRetriesExhausted)
			rec.Status, rec.Error = store.StepParked, info.json()
			s.log.Warn("step failed; parking the run", "reason", reason, "attempt", attempt, "error_class", info.Class, "error", info.Message)
			return failure{rec: rec, park: &parkReason{reason: reason, info: info, rec: rec}, outcome: "parked"}
		}
		// Recorded and returned: the workflow decides, and a run that
		// returns it runs its compensations. What it gets is decoded from
		// the record, as a replay will decode it.
		rec.Status, rec.Error, rec.CompletedAt = store.StepFailed, info.json(), &now
		s.log.Info("step failed", "attempt", attempt, "retries_exhausted", exhausted, "error_class", info.Class, "error", info.Message)
		return failure{rec: rec, outcome: "failed"}
	}
	info := stepFailure(err, classOf(err, ClassTransient), name, s.seq, attempt)
	info.NoEffect, info.SettleAttempts = noEffect, settled
	rec.Status, rec.Error, rec.NextAttemptAt = store.StepRetrying, info.json(), &next
	s.log.Info("step failed; will retry", "attempt", attempt, "error_class", info.Class, "error", info.Message, "backoff", delay)
	return failure{rec: rec, delay: delay, next: next, outcome: "retry"}
}

// attemptLoop runs the attempts of one step the workflow waits for (Step,
// TxStep, RunActivity, an undo, a sleep) that has no outcome yet: its
// first attempt, or the next after the attempts already recorded. Its
// records go through the delivery's buffer and writes; a retry waits in
// place or suspends the run.
type attemptLoop struct {
	stepState
	forward bool // not an undo: the run's cancellation stops it
	// ctx is the context attempts run in: a forward step's is cancelled by
	// the run's cancellation; an undo's, and a settling activity's, not.
	ctx context.Context

	nextAttempt *time.Time // when the next attempt is due: a backoff, a sleep's wake time
}

// newAttemptLoop picks a step up at position seq from its record (nil for
// a new step).
func (d *delivery) newAttemptLoop(call *stepCall, seq int, rec *store.StepRecord) *attemptLoop {
	l := &attemptLoop{stepState: d.newStepState(call, seq, rec), forward: call.compensationOf == nil, ctx: d.fwd}
	if !l.forward || call.settle {
		// Compensations are not cancelled by the run's cancellation. An
		// activity that does not heartbeat is not interrupted by it
		// either: its call finishes, and if it took effect its undo runs.
		// Cutting it short would leave an effect (a charge) that no one
		// knows to undo.
		l.ctx = d.ctx
	}
	if rec == nil {
		return l
	}
	l.nextAttempt = rec.NextAttemptAt
	return l
}

// stoppable: the run's cancellation stops this step before its next
// attempt. An activity that settles (it does not heartbeat, so its call
// is never cut short) is stopped only when none of its attempts can have
// taken effect; otherwise it is retried with its request ID until its
// outcome is known, so that its undo runs if it took effect.
func (l *attemptLoop) stoppable() bool {
	return l.forward && l.d.cancelRequested.Load() && !(l.call.settle && !l.noEffect)
}

// settling: the next attempt is one made after the cancellation to learn
// the outcome of an activity that may have taken effect.
func (l *attemptLoop) settling() bool {
	return l.forward && l.call.settle && l.d.cancelRequested.Load()
}

// cancelled stops the step for the run's cancellation. A step with a
// record is recorded as cancelled (with n attempts), written with the
// compensation's first write, so a finished run shows no step still
// retrying; one without gives its position back to the undos.
func (l *attemptLoop) cancelled(n int) ([]byte, error) {
	if !l.written {
		l.d.pos.giveBack()
		return nil, ErrCancelled
	}
	rec := l.record(store.StepCancelled, n)
	rec.Error = l.lastErr
	now := l.d.e.now()
	rec.CompletedAt = &now
	l.d.buf.stopped = rec
	return nil, ErrCancelled
}

// stop is cancelled as next returns it: the step is done.
func (l *attemptLoop) stop(n int) (out []byte, done bool, err error) {
	out, err = l.cancelled(n)
	return out, true, err
}

// unannounced is the record as it was before attempt n was announced, for
// a hand-back that does not count the attempt.
func (l *attemptLoop) unannounced(n int) *store.StepRecord {
	if n == 1 {
		return l.record(store.StepStarted, 0) // the request ID only
	}
	rec := l.record(store.StepRetrying, n-1)
	now := l.d.e.now()
	rec.Error, rec.NextAttemptAt = l.lastErr, &now
	return rec
}

// run makes attempts until the step has an outcome or the delivery ends.
func (l *attemptLoop) run() ([]byte, error) {
	d, call := l.d, l.call
	if l.stoppable() {
		return l.cancelled(l.attempts)
	}
	if call.wake != nil && d.pos.at(l.seq) == nil {
		// A new sleep: a long one is recorded with its wake time as the
		// delivery ends; a short one waits in place below.
		wake := call.wake()
		if wake.Sub(l.startedAt) > d.e.cfg.MaxInlineBackoff {
			rec := sleepRecord(l.seq, l.startedAt, wake)
			if !d.branchesRunning() {
				d.suspend(rec, wake)
				return nil, d.endErr
			}
			// Parallel steps run: the sleep waits in place (waitUntil),
			// its wake time written first.
			if !d.write(d.buf.takeWith(rec)...) {
				return nil, d.endErr
			}
			l.written = true
		}
		l.nextAttempt = &wake
	}
	if call.requestID && l.requestID == nil {
		// The request ID is stored with the first attempt's announcement:
		// every later attempt, after any crash or replay, sends this same ID.
		id := uuid.Must(uuid.NewV7())
		l.requestID = &id
	}
	if l.nextAttempt != nil && l.lost == nil && !d.waitUntil(*l.nextAttempt, l.stoppable) {
		return nil, d.endErr
	}
	if d.e.draining.Load() || d.queuePaused() {
		// Stop, or a pause of the run's queue: hand the run back at this
		// step boundary, once the parallel steps still running have ended:
		// they are running steps, which a graceful stop and a pause let
		// finish (StopAndCancel cuts them short).
		for d.branchesRunning() && d.ctx.Err() == nil {
			d.pauseForBranches(nil, false)
		}
		if d.parkPanickedBranch() {
			return nil, d.endErr
		}
		d.interrupted()
		return nil, d.endErr
	}
	if l.requestID != nil {
		l.log = l.log.With("request_id", l.requestID.String())
	}
	for {
		out, done, err := l.next()
		if done {
			return out, err
		}
	}
}

// next makes the next attempt; done is false when it failed and is to be
// retried in place.
func (l *attemptLoop) next() (out []byte, done bool, err error) {
	d := l.d
	attempt := l.attempts + 1
	announced := false
	var r attemptResult
	if l.lost != nil {
		r = attemptResult{err: l.lost, started: time.Now()}
		l.lost = nil
	} else {
		var stop bool
		if announced, stop, out, err = l.begin(attempt); stop {
			return out, true, err
		}
		a := &attemptState{d: d, seq: l.seq, attempt: attempt}
		if l.requestID != nil {
			a.requestID = *l.requestID
		}
		if l.call.tx {
			// Committed with the tx step's record (see begin); it stays
			// buffered if the transaction rolls back.
			a.prev = d.buf.pending
		}
		a.completed = func(out []byte) (*store.StepRecord, error) {
			now := d.e.now()
			rec := l.record(store.StepCompleted, attempt)
			rec.Output, rec.CompletedAt = out, &now
			a.completedAt = now
			return rec, nil
		}
		r = l.execute(l.ctx, a)
		if r.err == nil && r.p == nil {
			l.observe(attempt, "completed", r.started)
			if a.recorded {
				d.buf.take() // a.prev, committed with the step's record
				d.lastRecorded, d.lastRecordedAt = l.seq, a.completedAt
			} else {
				// Written with the delivery's next write, or sooner when
				// the workflow goes on to wait (see flushStarted).
				d.buf.pending, _ = a.completed(r.out)
			}
			return r.out, true, nil
		}
	}
	switch {
	case outcomeLost(r.err):
		l.observe(attempt, "interrupted", r.started)
		d.end(r.err)
		return nil, true, d.endErr
	case d.ctx.Err() != nil:
		// A shutdown or a lost lease interrupted the attempt. After a
		// shutdown the run is handed back with the attempt uncounted.
		l.observe(attempt, "interrupted", r.started)
		if announced {
			d.buf.pending = l.unannounced(attempt)
		}
		d.interrupted()
		return nil, true, d.endErr
	}
	if l.forward && !l.call.settle && d.fwd.Err() != nil {
		// The run was cancelled under this attempt: no outcome, no record.
		l.observe(attempt, "cancelled", r.started)
		l.log.Info("step stopped by the run's cancellation", "attempt", attempt)
		return l.stop(attempt)
	}
	return l.failed(attempt, r)
}

// begin checks that attempt may start and announces it when it must be:
// stop is true (with what the step returns) when it may not.
func (l *attemptLoop) begin(attempt int) (announced, stop bool, out []byte, err error) {
	d := l.d
	if !d.mayStartStep() {
		return false, true, nil, d.endErr
	}
	if l.stoppable() {
		out, err = l.cancelled(l.attempts) // no further attempt once the cancellation is known
		return false, true, out, err
	}
	if l.settling() && l.settled >= maxSettleAttempts {
		p := l.unsettled()
		d.park(p.rec, p)
		return false, true, nil, d.endErr
	}
	// Everything before this step is recorded before it runs, and the
	// attempt is announced with it when it must be (see announces).
	if l.announces(attempt) {
		rec := l.record(store.StepStarted, attempt)
		rec.Error = l.lastErr
		if !d.write(d.buf.takeWith(rec)...) {
			return false, true, nil, d.endErr
		}
		l.written = true
		if !d.mayStartStep() { // as after a flush, below
			return true, true, nil, d.endErr
		}
		if l.stoppable() {
			// The announcement brought the cancellation: the attempt
			// does not start, and is not counted.
			out, err = l.cancelled(l.attempts)
			return true, true, out, err
		}
		return true, false, nil, nil
	}
	if l.call.tx {
		// A tx step writes the previous step's record in its own
		// transaction, with its own record: both commit or neither. Only
		// a record whose step no row shows started waits for it (a plain
		// step's first attempt: a crash in a slow tx step runs that step
		// again, as Step promises); an activity's outcome is written now.
		if !d.flushStarted() || !d.mayStartStep() {
			return false, true, nil, d.endErr
		}
		return false, false, nil, nil
	}
	if !d.flush() || !d.mayStartStep() {
		// The lease is checked again after the flush: a process paused
		// while its flush committed wakes up to a reply that proves
		// nothing about now, when another delivery may own the run.
		return false, true, nil, d.endErr
	}
	return false, false, nil, nil
}

// failed handles attempt's failure (see judge): the run is parked, the
// failure recorded and returned, or the step retried, in place (done
// false) or after the delivery ends.
func (l *attemptLoop) failed(attempt int, r attemptResult) (out []byte, done bool, _ error) {
	d := l.d
	l.failedAttempt(r.err, l.settling())
	f := l.judge(attempt, r.err, r.p, l.noEffect, l.settled)
	l.observe(attempt, f.outcome, r.started)
	switch {
	case f.park != nil:
		d.park(f.rec, f.park)
		return nil, true, d.endErr
	case f.rec.Status == store.StepFailed:
		d.buf.pending = f.rec
		return nil, true, stepErrorFromRecord(f.rec)
	}
	l.lastErr = f.rec.Error
	if l.stoppable() {
		// Cancelled meanwhile: record the failed attempt, retry no more.
		l.written = true
		return l.stop(attempt)
	}
	if f.delay > d.e.cfg.MaxInlineBackoff && !d.branchesRunning() {
		d.suspend(f.rec, f.next)
		return nil, true, d.endErr
	}
	if !d.write(d.buf.takeWith(f.rec)...) {
		return nil, true, d.endErr
	}
	l.written = true
	if !d.waitUntil(f.next, l.stoppable) {
		return nil, true, d.endErr
	}
	l.attempts = attempt
	return nil, false, nil
}

// retryDelay is the wait before the attempt after attempt: the policy's
// backoff, or longer when the error asks for it (RetryAfter).
func retryDelay(p RetryPolicy, attempt int, err error) time.Duration {
	delay := p.backoff(attempt)
	var ra *retryAfterError
	if errors.As(err, &ra) && ra.delay > delay {
		delay = ra.delay
	}
	return delay
}

// retryable reports whether a failed attempt may be tried again: its
// output was storable, it did not fail permanently, attempts are left, and
// the step's time is not up (see lateRetry).
func retryable(err error, attempt, maxAttempts int) bool {
	var unserializable *errUnserializableOutput
	var late *scheduleToCloseError
	return !errors.As(err, &unserializable) && !IsPermanent(err) && attempt < maxAttempts && !errors.As(err, &late)
}

// lateRetry is err, or, when err is retryable but a retry at next would
// begin past the ScheduleToCloseTimeout of a step (opts) that started at
// started, a *scheduleToCloseError around it.
func lateRetry(opts *StepOpts, started, next time.Time, err error, attempt, maxAttempts int) error {
	if !retryable(err, attempt, maxAttempts) || opts == nil || opts.ScheduleToCloseTimeout <= 0 || !next.After(started.Add(opts.ScheduleToCloseTimeout)) {
		return err
	}
	return &scheduleToCloseError{timeout: opts.ScheduleToCloseTimeout, last: err}
}

// finalFailure classifies a failed attempt: final when it is not to be
// retried (its output cannot be stored, it failed permanently, or it was
// the last of maxAttempts or of the step's time), with the error to record;
// exhausted when out of attempts or time rather than failed for good.
func finalFailure(err error, name string, seq, attempt, maxAttempts int) (info *ErrorInfo, final, exhausted bool) {
	if retryable(err, attempt, maxAttempts) {
		return nil, false, false
	}
	var unserializable *errUnserializableOutput
	errors.As(err, &unserializable)
	exhausted = !IsPermanent(err) && unserializable == nil
	switch {
	case errors.Is(err, ErrOutputTooLarge):
		info = stepFailure(err, ClassOutputTooLarge, name, seq, attempt)
	case unserializable != nil:
		info = stepFailure(err, ClassUnserializable, name, seq, attempt)
	case exhausted:
		info = stepFailure(&retriesExhaustedError{attempts: attempt, err: err}, classOf(err, ClassTransient), name, seq, attempt)
	default:
		info = stepFailure(err, classOf(err, ClassPermanent), name, seq, attempt)
	}
	return info, true, exhausted
}

// attemptBound is how long an attempt of a step with opts, started at
// started, may take from now, and the timeout that bounds it: its
// StartToCloseTimeout or what is left of its ScheduleToCloseTimeout,
// whichever ends first (0: no bound).
func attemptBound(opts *StepOpts, started, now time.Time) (time.Duration, error) {
	if opts == nil {
		return 0, nil
	}
	timeout, cause := opts.StartToCloseTimeout, error(errStepStartToClose)
	if opts.ScheduleToCloseTimeout > 0 {
		if left := started.Add(opts.ScheduleToCloseTimeout).Sub(now); timeout <= 0 || left < timeout {
			timeout, cause = max(left, time.Millisecond), errStepScheduleToClose
		}
	}
	return timeout, cause
}

// bounded runs one attempt (run) in a context of parent that ends after
// timeout with cause (timeout <= 0: no bound). Past the bound, an awaited
// attempt (a tx step's: its transaction must end first) is waited for;
// any other gets abandonGrace to return and is abandoned after it (it may
// still finish in the background; its result is dropped). timedOut
// reports that the bound passed while parent was live; err is then what
// the attempt returned, if it did.
func bounded(parent context.Context, timeout time.Duration, cause error, awaited bool,
	run func(context.Context) ([]byte, *panicInfo, error)) (out []byte, p *panicInfo, timedOut bool, err error) {
	if timeout <= 0 {
		out, p, err = run(parent)
		return out, p, false, err
	}
	ctx, cancel := context.WithTimeoutCause(parent, timeout, cause)
	defer cancel()
	expired := func() bool { return parent.Err() == nil && ctx.Err() != nil }
	type result struct {
		out []byte
		p   *panicInfo
		err error
	}
	done := make(chan result, 1)
	attempt := func() {
		out, p, err := run(ctx)
		done <- result{out, p, err}
	}
	if awaited {
		attempt()
	} else {
		go attempt()
	}
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		if !expired() {
			r = <-done // parent ended (a cancellation, the delivery's end): as without a bound
			break
		}
		select {
		case r = <-done:
		case <-time.After(abandonGrace):
			return nil, nil, true, nil
		}
	}
	if r.p == nil && r.err != nil && expired() {
		return nil, nil, true, r.err
	}
	return r.out, r.p, false, r.err
}

// stepTimeout is the transient failure, classed "timeout", of attempt of
// step name past its bound (cause); err is what the attempt returned, if
// it did.
func stepTimeout(name string, attempt int, cause, err error) error {
	msg := fmt.Errorf("step %q attempt %d: %w", name, attempt, cause)
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		msg = fmt.Errorf("%w (the step returned: %v)", msg, err)
	}
	return WithClass(msg, ClassTimeout)
}

var (
	errStepStartToClose    = &timeoutError{"start-to-close timeout"}
	errStepScheduleToClose = &timeoutError{"schedule-to-close timeout"}
)

// scheduleToCloseError ends a step whose next retry would begin past its
// ScheduleToCloseTimeout.
type scheduleToCloseError struct {
	timeout time.Duration
	last    error
}

func (e *scheduleToCloseError) Error() string {
	return fmt.Sprintf("schedule-to-close timeout: the step's %s would pass before its next attempt (last: %v)", e.timeout, errorText(e.last))
}
func (e *scheduleToCloseError) Unwrap() error        { return e.last }
func (e *scheduleToCloseError) Is(target error) bool { return target == ErrTimeout }
func (e *scheduleToCloseError) ErrorClass() string   { return string(ClassTimeout) }
