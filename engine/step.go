package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// StepOpts tunes one step. A nil *StepOpts takes the workflow's and the
// engine's defaults.
type StepOpts struct {
	// RetryPolicy fills the fields it sets; the workflow's, the engine's
	// and DefaultRetryPolicy fill the rest.
	RetryPolicy *RetryPolicy
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
//   - fn returns Permanent(err), or a value that json.Marshal rejects: one
//     attempt, the error is recorded and a *StepError returned, on replay too.
//   - retries exhausted, fn panics, or a different step name is recorded at
//     this position (non-determinism): the run is parked as dead.
//
// After the delivery ends (parked, waiting for a retry, lease lost), Step
// returns an error without running fn; the workflow should return it.
func Step[T any](ctx *Context, name string, fn func(context.Context) (T, error), opts *StepOpts) (T, error) {
	var zero T
	raw, err := ctx.runStep(name, kindStep, opts, func(sctx context.Context) ([]byte, error) {
		v, err := fn(sctx)
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(v)
		if err == nil {
			err = checkStorable(b)
		}
		if err != nil {
			return nil, &errUnserializableOutput{err: err}
		}
		return b, nil
	})
	if err != nil {
		return zero, err
	}
	var out T
	if err := json.Unmarshal(raw, &out); err != nil {
		return zero, fmt.Errorf("pgdurable: decoding recorded output of step %q: %w", name, err)
	}
	return out, nil
}

const kindStep = "step"

type panicInfo struct {
	value any
	stack []byte
}

// runStep is the replay logic shared by every kind of step.
func (c *Context) runStep(name, kind string, opts *StepOpts, body func(context.Context) ([]byte, error)) ([]byte, error) {
	if c.ended {
		return nil, c.endErr
	}
	if err := checkName("step name", name, 200); err != nil {
		// Not recorded and no position used: it fails the same way on replay.
		return nil, fmt.Errorf("pgdurable: %w", err)
	}
	if !c.inStep.CompareAndSwap(false, true) {
		return nil, fmt.Errorf("pgdurable: step %q called while another step runs; steps cannot nest or run concurrently", name)
	}
	defer c.inStep.Store(false)
	seq := c.seq
	c.seq++
	log := c.log.With("step", name, "seq", seq)

	attempts := 0
	var firstFailed, nextAttempt *time.Time
	if seq < len(c.steps) {
		rec := &c.steps[seq]
		if rec.Name != name || rec.Kind != kind {
			c.park(nil, parkNonDeterminism(seq, name, kind, rec))
			return nil, c.endErr
		}
		switch rec.Status {
		case store.StepCompleted:
			return rec.Output, nil
		case store.StepFailed:
			return nil, stepErrorFromRecord(rec)
		}
		attempts, firstFailed, nextAttempt = rec.Attempts, rec.FirstFailedAt, rec.NextAttemptAt
	}
	// Everything before this step is recorded before it runs.
	if !c.flush() {
		return nil, c.endErr
	}
	if nextAttempt != nil && !c.waitUntil(*nextAttempt) {
		return nil, c.endErr
	}
	if c.e.draining.Load() {
		// Stop: hand the run back at this step boundary.
		c.interrupted()
		return nil, c.endErr
	}

	policy := RetryPolicy{}
	if opts != nil && opts.RetryPolicy != nil {
		policy = *opts.RetryPolicy
	}
	policy = policy.merge(c.wf.retry, &c.e.retry)
	startedAt := c.e.now()
	for {
		if !c.mayStartStep() {
			return nil, c.endErr
		}
		attempt := attempts + 1
		out, err, p := c.attempt(body)
		now := c.e.now()
		if err == nil && p == nil {
			c.pending = &store.StepRecord{Seq: seq, Name: name, Kind: kind, Status: store.StepCompleted,
				Attempts: attempt, Output: out, FirstFailedAt: firstFailed, StartedAt: startedAt, CompletedAt: &now}
			return out, nil
		}
		if c.Err() != nil {
			// Shutdown or a lost lease interrupted the attempt: it does not count.
			c.interrupted()
			return nil, c.endErr
		}
		if firstFailed == nil {
			firstFailed = &now
		}
		info := &ErrorInfo{Class: ClassTransient, Step: name, Seq: &seq, Attempt: attempt}
		rec := &store.StepRecord{Seq: seq, Name: name, Kind: kind, Attempts: attempt,
			FirstFailedAt: firstFailed, StartedAt: startedAt}
		var unserializable *errUnserializableOutput
		switch {
		case p != nil:
			info.Class, info.Message, info.Stack = ClassPanic, fmt.Sprintf("panic: %v", p.value), truncateStack(p.stack)
			rec.Status, rec.Error = store.StepParked, info.json()
			log.Error("step panicked", "attempt", attempt, "error_class", info.Class, "panic", info.Message)
			c.park(rec, &parkReason{reason: "panic", info: info, rec: rec})
			return nil, c.endErr
		case errors.As(err, &unserializable), IsPermanent(err):
			info.Class, info.Message = ClassPermanent, err.Error()
			if unserializable != nil {
				info.Class = ClassUnserializable
			}
			rec.Status, rec.Error, rec.CompletedAt = store.StepFailed, info.json(), &now
			c.pending = rec
			log.Info("step failed permanently", "attempt", attempt, "error_class", info.Class, "error", info.Message)
			return nil, &StepError{Step: name, Seq: seq, Attempt: attempt, Class: info.Class, Message: info.Message, Err: err}
		case attempt >= policy.MaximumAttempts:
			info.Message = err.Error()
			rec.Status, rec.Error = store.StepParked, info.json()
			log.Warn("step retries exhausted", "attempt", attempt, "error_class", info.Class, "error", info.Message)
			c.park(rec, &parkReason{reason: "retries_exhausted", info: info, rec: rec})
			return nil, c.endErr
		}
		delay := policy.backoff(attempt)
		var ra *retryAfterError
		if errors.As(err, &ra) && ra.delay > delay {
			delay = ra.delay
		}
		next := now.Add(delay)
		info.Message = err.Error()
		rec.Status, rec.Error, rec.NextAttemptAt = store.StepRetrying, info.json(), &next
		log.Info("step failed; will retry", "attempt", attempt, "error_class", info.Class, "error", info.Message, "backoff", delay)
		if delay > c.e.cfg.MaxInlineBackoff {
			c.suspend(rec, next)
			return nil, c.endErr
		}
		if !c.write(rec) || !c.sleep(delay) {
			return nil, c.endErr
		}
		attempts = attempt
	}
}

// attempt runs body once, recovering a panic with its stack.
func (c *Context) attempt(body func(context.Context) ([]byte, error)) (out []byte, err error, p *panicInfo) {
	defer func() {
		if r := recover(); r != nil {
			p = &panicInfo{value: r, stack: debug.Stack()}
		}
	}()
	out, err = body(c.Context)
	return out, err, nil
}

// waitUntil waits for a retry that is due at t: in place when it is close,
// otherwise by ending the delivery until then. False when the delivery ended.
func (c *Context) waitUntil(t time.Time) bool {
	d := t.Sub(c.e.now())
	if d <= 0 {
		return true
	}
	if d > c.e.cfg.MaxInlineBackoff {
		c.suspend(nil, t)
		return false
	}
	return c.sleep(d)
}

// sleep waits d unless the delivery is interrupted first.
func (c *Context) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.Done():
		c.interrupted()
		return false
	}
}

func stepErrorFromRecord(rec *store.StepRecord) *StepError {
	info := decodeErrorInfo(rec.Error)
	if info == nil {
		info = &ErrorInfo{Class: ClassPermanent, Message: "no error recorded"}
	}
	return &StepError{Step: rec.Name, Seq: rec.Seq, Attempt: rec.Attempts, Class: info.Class,
		Message: info.Message, Err: errors.New(info.Message)}
}
