package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// StepOpts tunes one step. A nil *StepOpts takes the workflow's and the
// engine's defaults.
type StepOpts struct {
	// RetryPolicy fills the fields it sets; the workflow's, the engine's
	// and DefaultRetryPolicy fill the rest.
	RetryPolicy *RetryPolicy
	// ReturnExhausted returns a step that ran out of retries to the
	// workflow as a *StepError, which errors.Is finds ErrRetriesExhausted
	// in (and the last attempt's error: ErrTimeout for a timed-out
	// activity), so the workflow can decide (a fallback, a compensation).
	//
	// Without it, a step that runs out of retries is returned only when the
	// run has compensations registered (the run then undoes its work), and
	// parks the run as dead otherwise; an activity that runs out of
	// retries always parks the run, because one of its attempts may have
	// taken effect with its answer lost (a charge made, the connection
	// cut), and only an operator, or a replay with the same request ID once
	// the service is back, can tell.
	ReturnExhausted bool
}

// Step runs fn as the run's next step and records its outcome; when the
// step is already recorded (a replay after a crash, a redelivery) it
// returns the record and fn does not run. Results go through JSON both
// ways, so live runs and replays see the same value.
//
// Outcomes:
//   - fn returns a value: recorded (one round trip, written before the next
//     step starts or with the run's completion) and returned.
//   - fn returns an error: retried per the RetryPolicy; attempts are counted
//     in Postgres. A backoff over Config.MaxInlineBackoff ends this delivery
//     and frees the worker until the retry is due.
//   - fn returns Permanent(err), a value that json.Marshal rejects, or one
//     whose JSON is over Config.MaxPayloadBytes (ErrOutputTooLarge, class
//     output_too_large): one attempt, the error is recorded and a *StepError
//     returned, on replay too.
//   - retries exhausted, fn panics, or a different step name is recorded at
//     this position (non-determinism): the run is parked as dead.
//
// After the delivery ends (parked, waiting for a retry, lease lost), Step
// returns an error without running fn; the workflow should return it.
func Step[T any](ctx *Context, name string, fn func(context.Context) (T, error), opts *StepOpts) (T, error) {
	raw, err := ctx.d.runStep(&stepCall{name: name, kind: kindStep, opts: opts, returnExhausted: opts != nil && opts.ReturnExhausted,
		body: func(sctx context.Context, a *attemptState) ([]byte, error) {
			v, err := fn(sctx)
			if err != nil {
				return nil, err
			}
			return encodeOutput(v, a.d.e.cfg.MaxPayloadBytes)
		}})
	return decodeOutput[T](name, raw, err)
}

// Step kinds, as stored in workflow_steps.kind.
const (
	kindStep     = "step"
	kindTx       = "tx"
	kindActivity = "activity"
)

// encodeOutput encodes a step's (or a workflow's) result for its record;
// an encoding over limit bytes is refused, so nothing oversized is stored
// and loaded again on every replay.
func encodeOutput(v any, limit int) ([]byte, error) {
	b, err := json.Marshal(v)
	if err == nil {
		err = checkStorable(b)
	}
	if err == nil && len(b) > limit {
		err = fmt.Errorf("%w: %d bytes, over the %d-byte limit (Config.MaxPayloadBytes)", ErrOutputTooLarge, len(b), limit)
	}
	if err != nil {
		return nil, &errUnserializableOutput{err: err}
	}
	return b, nil
}

// decodeOutput decodes a step's recorded (or just recorded) result.
func decodeOutput[T any](name string, raw []byte, err error) (T, error) {
	var out T
	if err != nil {
		return out, err
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return out, fmt.Errorf("pgdurable: decoding recorded output of step %q: %w", name, err)
	}
	return out, nil
}

// stepCall is one call of a step of any kind, as runStep executes it.
type stepCall struct {
	name, kind string
	opts       *StepOpts
	// requestID: store a request ID before the first attempt (activities).
	requestID bool
	// tx: the body writes its completed record in its own transaction.
	tx bool
	// compensationOf is the forward step an undo step compensates.
	compensationOf *int
	// settle: once begun (its request ID stored), the step runs to a
	// definite outcome even if the run is cancelled — an activity that
	// does not heartbeat may already have taken effect, and only its
	// outcome tells whether there is something to undo.
	settle bool
	// returnExhausted: StepOpts.ReturnExhausted.
	returnExhausted bool
	// parkAs, when set, parks the run with this reason on a permanent
	// failure or exhausted retries instead of returning the error
	// (compensation steps: compensation_failed).
	parkAs string
	// wake, set for a sleep, gives the time a new sleep waits until; a
	// recorded sleep waits until its recorded time instead.
	wake func() time.Time
	// body runs one attempt.
	body func(ctx context.Context, a *attemptState) ([]byte, error)
}

// attemptState is what one attempt knows about itself.
type attemptState struct {
	d            *delivery
	seq, attempt int
	requestID    uuid.UUID
	// completed builds the record of a successful attempt; a body that
	// writes it in its own transaction (a tx step) sets recorded.
	completed func(out []byte) *store.StepRecord
	recorded  bool
}

type panicInfo struct {
	value any
	stack []byte
}

// enterStep takes the next step position for a step of any kind (what
// names it in errors: "step", "signal"), or says why none may start. On
// success the caller must clear d.inStep when the step is done.
func (d *delivery) enterStep(what, name string) (int, error) {
	if d.ended {
		return 0, d.endErr
	}
	if err := checkName(what+" name", name, 200); err != nil {
		// Not recorded and no position used: it fails the same way on replay.
		return 0, fmt.Errorf("pgdurable: %w", err)
	}
	if !d.inStep.CompareAndSwap(false, true) {
		return 0, fmt.Errorf("pgdurable: %s %q called while another step runs; steps cannot nest or run concurrently", what, name)
	}
	return d.pos.take(), nil
}

// runStep is the replay logic shared by every kind of step.
func (d *delivery) runStep(call *stepCall) ([]byte, error) {
	name, kind, opts := call.name, call.kind, call.opts
	if opts != nil {
		if err := opts.RetryPolicy.validate(); err != nil {
			// Not recorded and no position used: the same on replay.
			return nil, fmt.Errorf("%w: step %q: %v", ErrInvalidArgument, name, err)
		}
	}
	seq, err := d.enterStep("step", name)
	if err != nil {
		return nil, err
	}
	defer d.inStep.Store(false)
	forward := call.compensationOf == nil
	if forward && d.cancelRequested.Load() {
		if rec := d.pos.at(seq); rec == nil || rec.Kind == kindCompensation {
			d.pos.giveBack() // never started: the undos take its place
			return nil, ErrCancelled
		}
	}
	// Replay, the hot path: nothing here allocates.
	rec, ok := d.replay(seq, name, kind)
	if !ok {
		return nil, d.endErr
	}
	if rec != nil {
		switch rec.Status {
		case store.StepCompleted:
			d.e.obs.StepReplayed(d.wf.name, kind)
			return rec.Output, nil
		case store.StepFailed:
			return nil, stepErrorFromRecord(rec)
		case store.StepCancelled:
			return nil, ErrCancelled // stopped by the cancellation, which stands
		}
	}
	return d.attempts(call, seq, rec)
}

// attempts runs a step that has no outcome yet: its first attempt, or the
// next after its recorded ones (rec, nil for a new step).
func (d *delivery) attempts(call *stepCall, seq int, rec *store.StepRecord) ([]byte, error) {
	name, kind, opts := call.name, call.kind, call.opts
	log := d.log.With("step", name, "seq", seq)
	forward := call.compensationOf == nil

	attempts := 0
	var firstFailed, nextAttempt *time.Time
	var requestID *uuid.UUID
	// lastErr is the latest failure's recorded error, kept in the record
	// while the next attempt runs.
	var lastErr []byte
	// noEffect: every attempt so far failed with an error marked NoEffect
	// (see stoppable).
	noEffect := true
	// settled counts the attempts made after the run's cancellation to
	// settle an activity that may have taken effect (see maxSettleAttempts).
	settled := 0
	// lost is the failure of the recorded attempt that never ended.
	var lost error
	startedAt := d.e.now()
	// written: a record of this step exists, so its position stays used
	// even if the run's cancellation stops it; a forward step stopped
	// before anything was written gives its position back to the undos.
	written := rec != nil
	// cancelled stops the step for the run's cancellation. A step with a
	// record is recorded as cancelled (with n attempts), written with the
	// compensation's first write, so a finished run shows no step still
	// retrying; one without gives its position back to the undos.
	cancelled := func(n int) ([]byte, error) {
		if !written {
			d.pos.giveBack()
			return nil, ErrCancelled
		}
		rec := &store.StepRecord{Seq: seq, Name: name, Kind: kind, Status: store.StepCancelled, Attempts: n,
			RequestID: requestID, FirstFailedAt: firstFailed, StartedAt: startedAt, Error: lastErr,
			CompensationOf: call.compensationOf}
		now := d.e.now()
		rec.CompletedAt = &now
		d.buf.stopped = rec
		return nil, ErrCancelled
	}
	if rec != nil {
		attempts, firstFailed, nextAttempt, requestID, lastErr = rec.Attempts, rec.FirstFailedAt, rec.NextAttemptAt, rec.RequestID, rec.Error
		switch {
		case rec.Status == store.StepStarted && rec.Attempts > 0:
			// Attempt rec.Attempts began and has no outcome: its worker
			// died, or lost its lease, during it. It counts, and it may
			// have taken effect.
			lost = &workerLostError{attempt: rec.Attempts}
			attempts, noEffect = rec.Attempts-1, false
			if info := decodeErrorInfo(rec.Error); info != nil {
				settled = info.SettleAttempts
			}
		case rec.Status == store.StepRetrying:
			// Records older than the flag say nothing: they may have.
			info := decodeErrorInfo(rec.Error)
			noEffect = info != nil && info.NoEffect
			if info != nil {
				settled = info.SettleAttempts
			}
		}
	}
	// stoppable: the run's cancellation stops this step before its next
	// attempt. An activity that settles (it does not heartbeat, so its call
	// is never cut short) is stopped only when none of its attempts can
	// have taken effect; otherwise it is retried with its request ID until
	// its outcome is known, so that its undo runs if it took effect.
	stoppable := func() bool { return forward && d.cancelRequested.Load() && !(call.settle && !noEffect) }
	// settling: the next attempt is one made after the cancellation to
	// learn the outcome of an activity that may have taken effect.
	settling := func() bool { return forward && call.settle && d.cancelRequested.Load() }
	if stoppable() {
		return cancelled(attempts)
	}
	stepCtx := d.fwd
	if !forward {
		stepCtx = d.ctx // compensations are not cancelled by the run's cancellation
	}
	if call.wake != nil && d.pos.at(seq) == nil {
		// A new sleep: a long one is recorded with its wake time as the
		// delivery ends; a short one waits in place below.
		wake := call.wake()
		if wake.Sub(startedAt) > d.e.cfg.MaxInlineBackoff {
			d.suspend(sleepRecord(seq, startedAt, wake), wake)
			return nil, d.endErr
		}
		nextAttempt = &wake
	}
	if call.requestID && requestID == nil {
		// The request ID is stored with the first attempt's announcement:
		// every later attempt, after any crash or replay, sends this same ID.
		id := uuid.Must(uuid.NewV7())
		requestID = &id
	}
	if nextAttempt != nil && lost == nil && !d.waitUntil(*nextAttempt, stoppable) {
		return nil, d.endErr
	}
	if d.e.draining.Load() {
		// Stop: hand the run back at this step boundary.
		d.interrupted()
		return nil, d.endErr
	}

	if requestID != nil {
		log = log.With("request_id", requestID.String())
	}
	policy := RetryPolicy{}
	if opts != nil && opts.RetryPolicy != nil {
		policy = *opts.RetryPolicy
	}
	policy = policy.merge(d.wf.retry, &d.e.retry)
	// record builds this step's record of attempt n.
	record := func(status string, n int) *store.StepRecord {
		return &store.StepRecord{Seq: seq, Name: name, Kind: kind, Status: status, Attempts: n, RequestID: requestID,
			FirstFailedAt: firstFailed, StartedAt: startedAt, CompensationOf: call.compensationOf}
	}
	// unannounced is the record as it was before attempt n was announced,
	// for a hand-back that does not count the attempt.
	unannounced := func(n int) *store.StepRecord {
		if n == 1 {
			return record(store.StepStarted, 0) // the request ID only
		}
		rec := record(store.StepRetrying, n-1)
		now := d.e.now()
		rec.Error, rec.NextAttemptAt = lastErr, &now
		return rec
	}
	for {
		attempt := attempts + 1
		announced := false
		var out []byte
		var p *panicInfo
		var err error
		a := &attemptState{d: d, seq: seq, attempt: attempt}
		attemptStart := time.Now()
		if lost != nil {
			err, lost = lost, nil
		} else {
			if !d.mayStartStep() {
				return nil, d.endErr
			}
			if stoppable() {
				return cancelled(attempts) // no further attempt once the cancellation is known
			}
			if settling() && settled >= maxSettleAttempts {
				// Its outcome is still unknown: an operator must look (the
				// request ID is in the record) and replay or discard.
				info := stepFailure(&unsettledError{attempts: settled, last: decodeErrorInfo(lastErr).Err()},
					ClassUnsettled, name, seq, attempts)
				rec := record(store.StepParked, attempts)
				rec.Error = info.json()
				log.Warn("cancelled run could not settle an activity; parking it", "settle_attempts", settled)
				d.park(rec, &parkReason{reason: ReasonRetriesExhausted, info: info, rec: rec})
				return nil, d.endErr
			}
			// Everything before this step is recorded before it runs. An
			// activity's attempts and every retry are announced with it
			// (status started), so an attempt whose worker dies counts;
			// a plain or tx step's first attempt is not, which would cost a
			// round trip per step: a crash in it is bounded by MaxDeliveries.
			if call.requestID || attempt > 1 {
				rec := record(store.StepStarted, attempt)
				rec.Error = lastErr
				if !d.write(d.buf.takeWith(rec)...) {
					return nil, d.endErr
				}
				written, announced = true, true
				if stoppable() {
					// The announcement brought the cancellation: the attempt
					// does not start, and is not counted.
					return cancelled(attempts)
				}
			} else if !d.flush() {
				return nil, d.endErr
			}
			if requestID != nil {
				a.requestID = *requestID
			}
			a.completed = func(out []byte) *store.StepRecord {
				now := d.e.now()
				rec := record(store.StepCompleted, attempt)
				rec.Output, rec.CompletedAt = out, &now
				return rec
			}
			out, p, err = d.attempt(stepCtx, call.body, a)
		}
		now := d.e.now()
		observe := func(outcome string) {
			d.e.obs.StepAttempt(d.wf.name, name, kind, attempt, outcome, time.Since(attemptStart))
		}
		if err == nil && p == nil {
			observe("completed")
			if a.recorded {
				d.lastRecorded = seq
			} else {
				d.buf.pending = a.completed(out)
			}
			return out, nil
		}
		var unknown *outcomeUnknownError
		if errors.Is(err, store.ErrLeaseLost) || errors.As(err, &unknown) {
			observe("interrupted")
			d.end(err)
			return nil, d.endErr
		}
		if d.ctx.Err() != nil {
			// A shutdown or a lost lease interrupted the attempt. After a
			// shutdown the run is handed back with the attempt uncounted.
			observe("interrupted")
			if announced {
				d.buf.pending = unannounced(attempt)
			}
			d.interrupted()
			return nil, d.endErr
		}
		if forward && !call.settle && d.fwd.Err() != nil {
			// The run was cancelled under this attempt: no outcome, no record.
			observe("cancelled")
			log.Info("step stopped by the run's cancellation", "attempt", attempt)
			return cancelled(attempt)
		}
		if firstFailed == nil {
			firstFailed = &now
		}
		noEffect = noEffect && hasNoEffect(err)
		if settling() {
			settled++
		}
		rec := record("", attempt)
		var unserializable *errUnserializableOutput
		if p != nil {
			info := stepFailure(&PanicError{Value: fmt.Sprint(p.value)}, ClassPanic, name, seq, attempt)
			info.Stack = truncateStack(p.stack)
			rec.Status, rec.Error = store.StepParked, info.json()
			observe("parked")
			log.Error("step panicked", "attempt", attempt, "error_class", info.Class, "panic", info.Message)
			reason := ReasonPanic
			if call.parkAs != "" {
				reason = call.parkAs
			}
			d.park(rec, &parkReason{reason: reason, info: info, rec: rec})
			return nil, d.endErr
		}
		if errors.As(err, &unserializable) || IsPermanent(err) || attempt >= policy.MaximumAttempts {
			exhausted := !IsPermanent(err) && unserializable == nil
			var info *ErrorInfo
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
			reason := ReasonRetriesExhausted
			if call.parkAs != "" {
				reason = call.parkAs
			}
			if call.parkAs != "" || (exhausted && !call.returnExhausted && (len(d.compensations) == 0 || call.requestID)) {
				// Nothing can undo this automatically: an operator must act.
				// An activity that ran out of retries may have taken effect
				// on an attempt whose answer was lost; compensating now would
				// skip its undo. Parked, a replay settles it with the same
				// request ID.
				rec.Status, rec.Error = store.StepParked, info.json()
				observe("parked")
				log.Warn("step failed; parking the run", "reason", reason, "attempt", attempt, "error_class", info.Class, "error", info.Message)
				d.park(rec, &parkReason{reason: reason, info: info, rec: rec})
				return nil, d.endErr
			}
			// Recorded and returned: the workflow decides, and a run that
			// returns it runs its compensations. What it gets is decoded
			// from the record, as a replay will decode it.
			rec.Status, rec.Error, rec.CompletedAt = store.StepFailed, info.json(), &now
			d.buf.pending = rec
			observe("failed")
			log.Info("step failed", "attempt", attempt, "retries_exhausted", exhausted, "error_class", info.Class, "error", info.Message)
			return nil, stepErrorFromRecord(rec)
		}
		info := stepFailure(err, classOf(err, ClassTransient), name, seq, attempt)
		info.NoEffect, info.SettleAttempts = noEffect, settled
		delay := policy.backoff(attempt)
		var ra *retryAfterError
		if errors.As(err, &ra) && ra.delay > delay {
			delay = ra.delay
		}
		next := now.Add(delay)
		rec.Status, rec.Error, rec.NextAttemptAt = store.StepRetrying, info.json(), &next
		lastErr = rec.Error
		observe("retry")
		log.Info("step failed; will retry", "attempt", attempt, "error_class", info.Class, "error", info.Message, "backoff", delay)
		if stoppable() {
			// Cancelled meanwhile: record the failed attempt, retry no more.
			written, lastErr = true, rec.Error
			return cancelled(attempt)
		}
		if delay > d.e.cfg.MaxInlineBackoff {
			d.suspend(rec, next)
			return nil, d.endErr
		}
		if !d.write(rec) {
			return nil, d.endErr
		}
		written = true
		if !d.wait(delay, stoppable) {
			return nil, d.endErr
		}
		attempts = attempt
	}
}

// attempt runs body once, recovering a panic with its stack (a body that
// runs user code on another goroutine returns its panic as *panicError).
func (d *delivery) attempt(ctx context.Context, body func(context.Context, *attemptState) ([]byte, error), a *attemptState) (out []byte, p *panicInfo, err error) {
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

// waitUntil waits for a retry that is due at t: in place when it is close,
// otherwise by ending the delivery until then. False when the delivery ended.
func (d *delivery) waitUntil(t time.Time, stoppable func() bool) bool {
	left := t.Sub(d.e.now())
	if left <= 0 {
		return true
	}
	if left > d.e.cfg.MaxInlineBackoff {
		d.suspend(nil, t)
		return false
	}
	return d.wait(left, stoppable)
}

// wait waits for dur unless the delivery is interrupted first (false), or
// the run's cancellation makes stoppable true, which cuts the wait short
// (true: the caller's stop check follows).
func (d *delivery) wait(dur time.Duration, stoppable func() bool) bool {
	t := time.NewTimer(dur)
	defer t.Stop()
	cancelled := d.fwd.Done()
	for {
		select {
		case <-t.C:
			return true
		case <-cancelled:
			if stoppable() {
				return true
			}
			cancelled = nil // a settling step waits out its backoff
		case <-d.ctx.Done():
			d.interrupted()
			return false
		}
	}
}

// maxSettleAttempts bounds the attempts a cancelled run makes to learn the
// outcome of an activity that may have taken effect (see Cancel): past it
// the run is parked, the outcome left to an operator.
const maxSettleAttempts = 3

// unsettledError parks a cancelled run whose activity's outcome is still
// unknown after maxSettleAttempts attempts.
type unsettledError struct {
	attempts int
	last     error
}

func (e *unsettledError) Error() string {
	last := "no error recorded"
	if e.last != nil {
		last = errorText(e.last)
	}
	return fmt.Sprintf("the run was cancelled, and %d attempts since could not learn whether this activity took effect "+
		"(last: %s): check it with its request ID, then replay the dead job to settle it and compensate, or discard it",
		e.attempts, last)
}
func (e *unsettledError) Unwrap() error        { return e.last }
func (e *unsettledError) Is(target error) bool { return target == ErrRetriesExhausted }

// workerLostError is the failure of an attempt that began and never ended:
// its worker died, or lost its lease, during it.
type workerLostError struct{ attempt int }

func (e *workerLostError) Error() string {
	return fmt.Sprintf("attempt %d did not finish: its worker died or lost its lease during it", e.attempt)
}
func (e *workerLostError) ErrorClass() string   { return ClassWorkerLost }
func (e *workerLostError) Is(target error) bool { return target == ErrWorkerLost }

// stepFailure records a step's failure: err's chain, with the step's name,
// position and attempt.
func stepFailure(err error, class, name string, seq, attempt int) *ErrorInfo {
	info := newErrorInfo(err, class)
	info.Step, info.Seq, info.Attempt = name, &seq, attempt
	return info
}

// stepErrorFromRecord decodes a failed step's record into the error the
// workflow sees: the same for the live delivery that recorded it and for
// every replay.
func stepErrorFromRecord(rec *store.StepRecord) *StepError {
	info := decodeErrorInfo(rec.Error)
	if info == nil {
		info = &ErrorInfo{Class: ClassPermanent, Message: "no error recorded"}
	}
	return &StepError{Step: rec.Name, Seq: rec.Seq, Attempt: rec.Attempts, Class: info.Class,
		Message: info.Message, Err: info.Err()}
}
