// Package compensation writes sagas: each forward step registers, once it
// has succeeded, the step that undoes it. When the run fails permanently,
// exhausts a step's retries, or is cancelled, the engine runs the
// registered undos newest first, each a durable step with its own retries,
// in a context the run's cancellation does not cancel; then the run ends
// compensated (keeping the original error) or cancelled.
//
// A crash in the middle of compensating resumes with the next undo; none
// runs twice. An undo that fails permanently or exhausts its retries parks
// the run as dead with reason compensation_failed, naming the undo; an
// operator's replay after the fix runs the remaining undos only.
//
//	saga := compensation.New(ctx)
//	_, err := compensation.TxStep(saga, "reserve_inventory", reserve, compensation.TxUndo[int]{
//		Name: "release_inventory", Fn: release,
//	}, nil)
//	if err != nil {
//		return "", err
//	}
//	ch, err := compensation.Activity(saga, charge, req, compensation.Undo[Charge]{
//		Name: "refund", Fn: refund, // Fn gets its own stored request ID: the refund's idempotency key
//	})
//	if err != nil {
//		return "", err // compensations run: release_inventory (and refund, had the charge succeeded)
//	}
package compensation

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdurable/pgdurable/activities"
	"github.com/pgdurable/pgdurable/engine"
)

// Saga is a run's list of undos; the engine keeps it and replays it with
// the workflow, so a Saga holds nothing but the run's context.
type Saga struct{ ctx *engine.Context }

// New returns the saga of the run behind ctx.
func New(ctx *engine.Context) *Saga { return &Saga{ctx: ctx} }

// Undo undoes a forward step whose result was T with a call outside the
// database (a refund, a cancellation email).
type Undo[T any] struct {
	// Name is the undo step's stored name.
	Name string
	// Fn undoes the effect. call.RequestID is the undo's own request ID,
	// stored before its first attempt: send it as the idempotency key.
	Fn func(ctx context.Context, call activities.Call, result T) error
	// RetryPolicy, StartToCloseTimeout and RateLimit as for activities.
	RetryPolicy         *engine.RetryPolicy
	StartToCloseTimeout time.Duration
	RateLimit           string
}

// TxUndo undoes a forward step whose result was T inside the engine's
// database, in one transaction with the undo's record: exactly once.
type TxUndo[T any] struct {
	Name        string
	Fn          func(ctx context.Context, tx pgx.Tx, result T) error
	RetryPolicy *engine.RetryPolicy
}

// undo is u for result as the engine runs it (a missing Fn stays missing,
// for the engine to report).
func (u Undo[T]) undo(result T) engine.Undo {
	if u.Fn == nil {
		return engine.Undo{Name: u.Name}
	}
	return engine.Undo{
		Name: u.Name,
		Fn: func(actx context.Context, _ *engine.ActivityAttempt) error {
			call, _ := activities.CallFromContext(actx)
			return u.Fn(actx, call, result)
		},
		RetryPolicy:         u.RetryPolicy,
		StartToCloseTimeout: u.StartToCloseTimeout,
		RateLimit:           u.RateLimit,
	}
}

func (u Undo[T]) register(ctx *engine.Context, result T) error { return ctx.Compensate(u.undo(result)) }

func (u TxUndo[T]) undo(result T) engine.Undo {
	if u.Fn == nil {
		return engine.Undo{Name: u.Name}
	}
	return engine.Undo{
		Name:        u.Name,
		Tx:          func(tctx context.Context, tx pgx.Tx) error { return u.Fn(tctx, tx, result) },
		RetryPolicy: u.RetryPolicy,
	}
}

func (u TxUndo[T]) register(ctx *engine.Context, result T) error {
	return ctx.Compensate(u.undo(result))
}

// Step runs forward as engine.Step and, when it succeeds (live or on
// replay), registers undo with the result. A registration error (a
// malformed undo) is returned as the step's error.
func Step[T any](s *Saga, name string, forward func(context.Context) (T, error), undo Undo[T], opts *engine.StepOpts) (T, error) {
	out, err := engine.Step(s.ctx, name, forward, opts)
	if err != nil {
		return out, err
	}
	return out, undo.register(s.ctx, out)
}

// TxStep runs forward as engine.TxStep and registers a database undo.
func TxStep[T any](s *Saga, name string, forward func(context.Context, pgx.Tx) (T, error), undo TxUndo[T], opts *engine.StepOpts) (T, error) {
	out, err := engine.TxStep(s.ctx, name, forward, opts)
	if err != nil {
		return out, err
	}
	return out, undo.register(s.ctx, out)
}

// Activity runs a as activities.Execute and registers undo with its response.
func Activity[Req, Resp any](s *Saga, a *activities.Activity[Req, Resp], req Req, undo Undo[Resp]) (Resp, error) {
	out, err := activities.Execute(s.ctx, a, req)
	if err != nil {
		return out, err
	}
	return out, undo.register(s.ctx, out)
}

// Go runs forward as a parallel step (engine.GoUndo) whose undo is
// registered when it completes: undos run newest first by the time their
// steps completed, and a step that did not complete registers none.
func Go[T any](s *Saga, name string, forward func(context.Context) (T, error), undo Undo[T], opts *engine.StepOpts) *engine.Future[T] {
	return engine.GoUndo(s.ctx, name, forward, undo.undo, opts)
}

// GoTx runs forward as a parallel tx step (engine.GoTxUndo) with a
// database undo, as Go.
func GoTx[T any](s *Saga, name string, forward func(context.Context, pgx.Tx) (T, error), undo TxUndo[T], opts *engine.StepOpts) *engine.Future[T] {
	return engine.GoTxUndo(s.ctx, name, forward, undo.undo, opts)
}
