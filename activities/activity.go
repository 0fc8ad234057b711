package activities

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine"
)

// Activity is a named call to the outside world. Req is what workflow code
// passes in (not stored; recomputed on replay), Resp is recorded as JSON.
type Activity[Req, Resp any] struct {
	// Name is stored with the step, so it must stay stable across deploys.
	Name string
	// Fn makes one attempt. ctx is cancelled when the attempt times out, the
	// run is cancelled or the engine shuts down; honour it.
	Fn func(ctx context.Context, call Call, req Req) (Resp, error)
	// RetryPolicy overrides the workflow's and engine's policy field by
	// field. Errors are transient unless engine.Permanent (Classify marks
	// 4xx responses so).
	RetryPolicy *engine.RetryPolicy
	// StartToCloseTimeout bounds each attempt; 0 means no limit.
	StartToCloseTimeout time.Duration
	// ScheduleToCloseTimeout bounds the activity as a whole, all attempts
	// and backoffs from its first attempt's start (see
	// engine.ActivityOpts.ScheduleToCloseTimeout); 0 means no limit. Once
	// it is up the activity is out of retries, and the run is parked.
	ScheduleToCloseTimeout time.Duration
	// HeartbeatTimeout: an attempt that does not call Call.Heartbeat for
	// this long is abandoned and retried with the same request ID; 0 means
	// no heartbeats are expected.
	HeartbeatTimeout time.Duration
	// RateLimit names a rate limit (engine.Engine.RegisterRateLimit,
	// engine.DefineRateLimit) that each attempt takes a turn of before Fn
	// is called, shared by every process: see engine.StepOpts.RateLimit.
	RateLimit string
}

// Call is what one attempt knows about itself.
type Call struct {
	// RequestID is the activity's stored request ID, identical on every
	// attempt: send it as the idempotency key.
	RequestID uuid.UUID
	// Attempt counts from 1.
	Attempt int

	attempt *engine.ActivityAttempt
}

// IdempotencyKey is RequestID as a string, the form APIs take.
func (c Call) IdempotencyKey() string { return c.RequestID.String() }

// Heartbeat reports progress from a long attempt. It keeps the attempt from
// being treated as stuck (HeartbeatTimeout) and returns ctx's error once the
// attempt should stop. Call it at least every HeartbeatTimeout/2.
func (c Call) Heartbeat(ctx context.Context) error { return c.attempt.Heartbeat(ctx) }

// CallFromContext returns the Call whose attempt context ctx is, for
// helpers deep in a call stack (NewHTTPClient's transport uses it).
func CallFromContext(ctx context.Context) (Call, bool) {
	a, ok := engine.ActivityFromContext(ctx)
	if !ok {
		return Call{}, false
	}
	return Call{RequestID: a.RequestID, Attempt: a.Attempt, attempt: a}, true
}

// Execute runs a as the run's next step (see engine.RunActivity): on replay
// the recorded response (or recorded permanent error) returns without a
// call; otherwise Fn is called with the stored request ID until it
// succeeds, fails permanently, or exhausts its retries (the run is then
// parked as dead with reason retries_exhausted, keeping the request ID for
// an operator's replay).
func Execute[Req, Resp any](ctx *engine.Context, a *Activity[Req, Resp], req Req) (Resp, error) {
	return engine.RunActivity(ctx, a.Name, a.fn(req), a.opts())
}

// Go starts a as the run's next step without waiting for it (see
// engine.GoActivity): a parallel activity with the same request-ID rules
// as Execute's; its Future's Get returns the response.
func Go[Req, Resp any](ctx *engine.Context, a *Activity[Req, Resp], req Req) *engine.Future[Resp] {
	return engine.GoActivity(ctx, a.Name, a.fn(req), a.opts())
}

func (a *Activity[Req, Resp]) opts() *engine.ActivityOpts {
	return &engine.ActivityOpts{
		RetryPolicy:            a.RetryPolicy,
		StartToCloseTimeout:    a.StartToCloseTimeout,
		ScheduleToCloseTimeout: a.ScheduleToCloseTimeout,
		HeartbeatTimeout:       a.HeartbeatTimeout,
		RateLimit:              a.RateLimit,
	}
}

func (a *Activity[Req, Resp]) fn(req Req) func(context.Context, *engine.ActivityAttempt) (Resp, error) {
	return func(actx context.Context, at *engine.ActivityAttempt) (Resp, error) {
		return a.Fn(actx, Call{RequestID: at.RequestID, Attempt: at.Attempt, attempt: at}, req)
	}
}
