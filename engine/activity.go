package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// ActivityOpts tunes an activity: a step that calls something outside the
// engine's database. A nil *ActivityOpts takes the defaults. Package
// activities fills these from an Activity's fields.
type ActivityOpts struct {
	// RetryPolicy fills the fields it sets; the workflow's, the engine's
	// and DefaultRetryPolicy fill the rest.
	RetryPolicy *RetryPolicy
	// StartToCloseTimeout bounds each attempt (not the activity as a whole):
	// past it the attempt's context is cancelled and the attempt fails with
	// class "timeout", transient. 0 means no limit.
	StartToCloseTimeout time.Duration
	// ScheduleToCloseTimeout bounds the activity as a whole, as
	// StepOpts.ScheduleToCloseTimeout bounds a step: all attempts and
	// backoffs, from its first attempt's start, across deliveries (0: no
	// bound; negative: ErrInvalidArgument). An attempt gets at most the
	// time left (its context is cancelled then, whether or not the
	// activity heartbeats), and a retry whose backoff would end past it is
	// not made; the activity then fails as if its retries ran out, with
	// the timeout in its error (ErrTimeout, ErrRetriesExhausted): it parks
	// the run unless ReturnExhausted.
	ScheduleToCloseTimeout time.Duration
	// HeartbeatTimeout is how long an attempt may go without calling
	// ActivityAttempt.Heartbeat before it is treated as stuck: its context
	// is cancelled, it is abandoned and retried with the same request ID
	// (class "heartbeat_timeout"). 0 means attempts need not heartbeat.
	//
	// It also decides what a run's cancellation does to a running attempt:
	// one that heartbeats has its context cancelled (Heartbeat returns the
	// error) and should stop without effect; one that does not is left to
	// finish its call, and when that succeeded its undo runs.
	HeartbeatTimeout time.Duration
	// ReturnExhausted returns an activity that ran out of retries to the
	// workflow as a *StepError instead of parking the run (see
	// StepOpts.ReturnExhausted for the default and why). With it, "the
	// charge timed out on its last attempt, try the fallback provider" is
	// errors.Is(err, ErrTimeout); MaximumAttempts 1 returns the first
	// failure.
	ReturnExhausted bool
	// Input is the activity's input (the request it sends), checked on
	// replay as StepOpts.Input is.
	Input any
	// RateLimit names a rate limit each attempt takes a turn of before it
	// calls out (StepOpts.RateLimit): the card processor's 100 requests a
	// second, shared by every process.
	RateLimit string
}

// ActivityAttempt is one attempt of an activity, as its function sees it.
type ActivityAttempt struct {
	// RequestID is stored before the first attempt and is the same on
	// every attempt, after crashes and after an operator's replay: send it
	// as the idempotency key (Stripe's Idempotency-Key header).
	RequestID uuid.UUID
	// Attempt counts from 1.
	Attempt int

	lastBeat atomic.Int64 // unix nanoseconds of the latest Heartbeat
	d        *delivery
}

// Heartbeat tells the engine the attempt is alive (see
// ActivityOpts.HeartbeatTimeout). It returns ctx's error once the attempt
// should stop: the run was cancelled, the engine is shutting down, the
// lease was lost or the attempt timed out. Safe for concurrent use, and
// cheap to call often: it writes to the database (renewing the lease and
// learning of a cancellation) at most once per Config.HeartbeatInterval
// (LeaseDuration/3 by default), together with the delivery's own lease
// heartbeat, so a cancellation reaches it within about that long.
func (a *ActivityAttempt) Heartbeat(ctx context.Context) error {
	a.lastBeat.Store(time.Now().UnixNano())
	if d := a.d; d != nil {
		// A failure here is the lease heartbeat's to report.
		_ = d.beatIfDue(d.e.cfg.HeartbeatInterval)
	}
	return ctx.Err()
}

type activityKey struct{}

// ActivityFromContext returns the attempt whose context ctx is (or derives
// from), so helpers such as an HTTP transport can read its request ID.
func ActivityFromContext(ctx context.Context) (*ActivityAttempt, bool) {
	a, ok := ctx.Value(activityKey{}).(*ActivityAttempt)
	return a, ok
}

// abandonGrace is how long an attempt whose context is done gets to return
// before the engine stops waiting for it and moves on.
const abandonGrace = 100 * time.Millisecond

// RunActivity runs fn as the run's next step, of kind activity: a request
// ID is stored (with the previous step's record, one round trip) before the
// first attempt, every attempt receives it, and the outcome is recorded
// with the delivery's next write (the second round trip), and never later
// than the moment the workflow goes on to wait for something: a tx step's
// transaction, a parallel step, a timer or signal. A crash after that
// does not call fn again. Replay returns the recorded
// outcome; a replay that finds the request ID stored but no outcome (a
// crash between the call and its record) calls fn again with the same ID,
// so an idempotent API applies the effect once.
//
// Each attempt runs on its own goroutine so a stuck call can be abandoned
// (StartToCloseTimeout, HeartbeatTimeout); fn must honour its context.
// Most code uses package activities, which wraps this with typed requests
// and HTTP helpers.
func RunActivity[T any](ctx *Context, name string, fn func(ctx context.Context, a *ActivityAttempt) (T, error), opts *ActivityOpts) (T, error) {
	if opts == nil {
		opts = &ActivityOpts{}
	}
	sopts := &StepOpts{RetryPolicy: opts.RetryPolicy, ScheduleToCloseTimeout: opts.ScheduleToCloseTimeout, Input: opts.Input,
		RateLimit: opts.RateLimit}
	raw, err := ctx.d.runStep(&stepCall{name: name, kind: KindActivity, opts: sopts, requestID: true,
		settle: opts.HeartbeatTimeout <= 0, returnExhausted: opts.ReturnExhausted,
		body: activityBody(name, opts, fn)})
	return decodeOutput[T](name, raw, err)
}

// timeoutError is an attempt's timeout: errors.Is finds ErrTimeout and
// context.DeadlineExceeded in it, live and on replay.
type timeoutError struct{ what string }

func (e *timeoutError) Error() string { return e.what }
func (e *timeoutError) Is(target error) bool {
	return target == ErrTimeout || target == context.DeadlineExceeded
}

var (
	errStartToClose = &timeoutError{"start-to-close timeout"}
	errNoHeartbeat  = &timeoutError{"heartbeat timeout"}
)

// activityBody is the body of RunActivity and GoActivity alike: one
// attempt of fn (see runAttempt) with the step's request ID.
func activityBody[T any](name string, opts *ActivityOpts, fn func(context.Context, *ActivityAttempt) (T, error)) func(context.Context, *attemptState) ([]byte, error) {
	return func(sctx context.Context, a *attemptState) ([]byte, error) {
		return runAttempt(sctx, a.d, name, opts, &ActivityAttempt{RequestID: a.requestID, Attempt: a.attempt}, fn)
	}
}

// runAttempt runs one attempt of an activity's fn on its own goroutine, so
// that a stuck call can be abandoned: past its StartToCloseTimeout or
// HeartbeatTimeout it gets abandonGrace to return, and a delivery that is
// interrupted lets it finish while the lease holds.
func runAttempt[T any](sctx context.Context, d *delivery, name string, opts *ActivityOpts, a *ActivityAttempt, fn func(context.Context, *ActivityAttempt) (T, error)) ([]byte, error) {
	a.lastBeat.Store(time.Now().UnixNano())
	a.d = d
	actx, cancel := context.WithCancelCause(context.WithValue(sctx, activityKey{}, a))
	defer cancel(nil)
	if opts.StartToCloseTimeout > 0 {
		var stop context.CancelFunc
		actx, stop = context.WithTimeoutCause(actx, opts.StartToCloseTimeout, errStartToClose)
		defer stop()
	}
	type result struct {
		out []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- result{err: &panicError{&panicInfo{value: r, stack: debug.Stack()}}}
			}
		}()
		v, err := fn(actx, a)
		if err != nil {
			done <- result{err: err}
			return
		}
		out, err := encodeOutput(v, d.e.cfg.MaxPayloadBytes)
		done <- result{out: out, err: err}
	}()

	var beats <-chan time.Time
	if opts.HeartbeatTimeout > 0 {
		t := time.NewTicker(max(opts.HeartbeatTimeout/4, time.Millisecond))
		defer t.Stop()
		beats = t.C
	}
	for {
		select {
		case r := <-done:
			if r.err != nil && sctx.Err() == nil && actx.Err() != nil {
				return nil, attemptTimeout(name, a, context.Cause(actx), r.err)
			}
			return r.out, r.err
		case <-beats:
			if since := time.Since(time.Unix(0, a.lastBeat.Load())); since > opts.HeartbeatTimeout {
				cancel(errNoHeartbeat)
			}
		case <-actx.Done():
			grace := abandonGrace
			if sctx.Err() != nil {
				// The delivery is interrupted (StopAndCancel, a shutdown's
				// timeout). A call that still answers while the lease holds
				// has its result recorded as the run is handed back, so the
				// next worker does not call it again.
				grace = d.leaseLeft()
			}
			select {
			case r := <-done:
				if r.err == nil {
					return r.out, nil // finished in time
				}
			case <-time.After(grace):
			}
			if sctx.Err() != nil {
				return nil, sctx.Err() // runStep hands the run back
			}
			return nil, attemptTimeout(name, a, context.Cause(actx), nil)
		}
	}
}

// attemptTimeout is a transient error classed "timeout" or "heartbeat_timeout".
func attemptTimeout(name string, a *ActivityAttempt, cause, err error) error {
	class := ClassTimeout // or heartbeat_timeout, an activity's own
	if errors.Is(cause, errNoHeartbeat) {
		class = ErrorClass("heartbeat_timeout")
	}
	msg := fmt.Errorf("activity %q attempt %d: %w", name, a.Attempt, cause)
	if err != nil {
		msg = fmt.Errorf("%w (the call returned: %v)", msg, err)
	}
	return WithClass(msg, class)
}
