package regress_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/activities"
	"github.com/pgdurable/pgdurable/compensation"
	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// A: cancel while a plain forward Step runs leaves a hole in the step
// sequence (the interrupted step has no record but its seq is consumed); the
// undo is recorded after the hole. Any later delivery (here: the undo's
// retry backoff > MaxInlineBackoff suspends the run) replays and maps the
// undo's record onto the hole -> nondeterminism.
func TestCancelDuringPlainStepThenUndoRetryBackoff(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	createEvents(t, db.Pool)
	var undoCalls atomic.Int32
	bStarted := make(chan struct{}, 1)
	wf := engine.Define("gap", func(ctx *engine.Context, _ int) (string, error) {
		saga := compensation.New(ctx)
		if _, err := compensation.Step(saga, "A", func(sctx context.Context) (int, error) {
			return 1, logEvent(sctx, db.Pool, ctx.RunID(), "A", "")
		}, compensation.Undo[int]{Name: "undo_A", Fn: func(uctx context.Context, call activities.Call, _ int) error {
			if undoCalls.Add(1) == 1 {
				_ = logEvent(uctx, db.Pool, ctx.RunID(), "undo_A_failed", call.IdempotencyKey())
				return errors.New("refund API flaked")
			}
			return logEvent(uctx, db.Pool, ctx.RunID(), "undo_A", call.IdempotencyKey())
		}, RetryPolicy: &engine.RetryPolicy{InitialInterval: 1500 * time.Millisecond, MaximumAttempts: 5}}, nil); err != nil {
			return "", err
		}
		if _, err := engine.Step(ctx, "B", func(sctx context.Context) (int, error) {
			_ = logEvent(sctx, db.Pool, ctx.RunID(), "B", "")
			select {
			case bStarted <- struct{}{}:
			default:
			}
			select {
			case <-sctx.Done():
				return 0, sctx.Err()
			case <-time.After(30 * time.Second):
				return 2, nil
			}
		}, nil); err != nil {
			return "", err
		}
		return "done", nil
	}, nil)
	e := newEngine(t, db, nil, wf)
	ctx := context.Background()
	res, err := wf.Start(ctx, e, 1, nil)
	require.NoError(t, err)
	<-bStarted
	require.NoError(t, e.Cancel(ctx, res.RunID))
	run := waitStatus(t, e, res.RunID, 20*time.Second, engine.StatusCancelled, engine.StatusDead)
	dumpRun(t, run)
	t.Logf("events: %v", events(t, db.Pool, res.RunID))
	require.Equal(t, engine.StatusCancelled, run.Status, "cancelled run must end cancelled after its undo's retry")
}

// B: Cancel lands while a forward step's attempt runs; the attempt then fails
// with a long backoff (Retry-After 1h). Cancel returned nil (the run was
// running, so no wake-up), and the suspend overwrites the run to waiting
// until the backoff ends: the cancel is ignored for an hour.
func TestCancelRacingWithSuspend(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	createEvents(t, db.Pool)
	var eng atomic.Pointer[engine.Engine]
	var undos atomic.Int32
	wf := engine.Define("suspendrace", func(ctx *engine.Context, _ int) (string, error) {
		saga := compensation.New(ctx)
		if _, err := compensation.Step(saga, "A", func(context.Context) (int, error) { return 1, nil },
			compensation.Undo[int]{Name: "undo_A", Fn: func(context.Context, activities.Call, int) error { undos.Add(1); return nil }}, nil); err != nil {
			return "", err
		}
		if _, err := engine.Step(ctx, "B", func(sctx context.Context) (int, error) {
			// The user cancels while this attempt is in flight (e.g. the API
			// answered 429 with Retry-After: 3600).
			if err := eng.Load().Cancel(context.Background(), ctx.RunID()); err != nil {
				return 0, engine.Permanent(err)
			}
			return 0, engine.RetryAfter(errors.New("HTTP 429"), time.Hour)
		}, nil); err != nil {
			return "", err
		}
		return "done", nil
	}, nil)
	e := newEngine(t, db, nil, wf)
	eng.Store(e)
	res, err := wf.Start(context.Background(), e, 1, nil)
	require.NoError(t, err)
	run := waitStatus(t, e, res.RunID, 10*time.Second, engine.StatusCancelled)
	dumpRun(t, run)
	if run.WakeAt != nil {
		t.Logf("wake_at in %s", time.Until(*run.WakeAt).Round(time.Second))
	}
	require.Equal(t, engine.StatusCancelled, run.Status, "a cancelled run must compensate promptly, not after the backoff")
}

// C: a run that failed and is compensating is cancelled; its compensation
// crosses a delivery boundary (undo retry backoff). README: "Cancelling again
// changes nothing"; the run should end compensated with its original error.
func TestCancelDuringFailureCompensationChangesOutcome(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	createEvents(t, db.Pool)
	var undoCalls atomic.Int32
	wf := engine.Define("failcomp", func(ctx *engine.Context, _ int) (string, error) {
		saga := compensation.New(ctx)
		if _, err := compensation.Step(saga, "A", func(context.Context) (int, error) { return 1, nil },
			compensation.Undo[int]{Name: "undo_A", Fn: func(uctx context.Context, call activities.Call, _ int) error {
				if undoCalls.Add(1) == 1 {
					return errors.New("flake")
				}
				return logEvent(uctx, db.Pool, ctx.RunID(), "undo_A", "")
			}, RetryPolicy: &engine.RetryPolicy{InitialInterval: 1500 * time.Millisecond}}, nil); err != nil {
			return "", err
		}
		if _, err := engine.Step(ctx, "B", func(context.Context) (int, error) {
			return 0, engine.Permanent(errors.New("card declined"))
		}, nil); err != nil {
			return "", err
		}
		return "done", nil
	}, nil)
	e := newEngine(t, db, nil, wf)
	ctx := context.Background()
	res, err := wf.Start(ctx, e, 1, nil)
	require.NoError(t, err)
	for i := 0; i < 500 && undoCalls.Load() == 0; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, e.Cancel(ctx, res.RunID))
	run := waitStatus(t, e, res.RunID, 15*time.Second, engine.StatusCompensated, engine.StatusCancelled, engine.StatusDead)
	dumpRun(t, run)
	require.Equal(t, engine.StatusCompensated, run.Status, "cancel during compensation must change nothing")
	require.Contains(t, run.Error.Message, "card declined")
}

// D: the delivery learns of the cancellation from the retry record's write,
// then still starts the step's next attempt (with a cancelled ctx).
func TestRetryAttemptStartsAfterCancelKnown(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	var eng atomic.Pointer[engine.Engine]
	var attempts atomic.Int32
	var ctxErrAt2 atomic.Value
	wf := engine.Define("retryaftercancel", func(ctx *engine.Context, _ int) (string, error) {
		if _, err := engine.Step(ctx, "B", func(sctx context.Context) (int, error) {
			n := attempts.Add(1)
			if n == 1 {
				if err := eng.Load().Cancel(context.Background(), ctx.RunID()); err != nil {
					return 0, engine.Permanent(err)
				}
				return 0, errors.New("transient")
			}
			ctxErrAt2.Store(sctx.Err() != nil)
			return 0, errors.New("transient again")
		}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: 50 * time.Millisecond}}); err != nil {
			return "", err
		}
		return "done", nil
	}, nil)
	e := newEngine(t, db, nil, wf)
	eng.Store(e)
	res, err := wf.Start(context.Background(), e, 1, nil)
	require.NoError(t, err)
	run := waitStatus(t, e, res.RunID, 10*time.Second, engine.StatusCancelled)
	dumpRun(t, run)
	t.Logf("attempts=%d, ctx already cancelled at attempt 2: %v", attempts.Load(), ctxErrAt2.Load())
	require.Equal(t, int32(1), attempts.Load(), "no attempt should start once the delivery knows of the cancel")
}

// E: an error class with a NUL byte / invalid UTF-8 (WithClass is public API)
// makes the failure record unwritable.
func TestGarbageErrorClass(t *testing.T) {
	t.Parallel()
	for _, class := range []string{"bad\x00class", "bad\xffclass"} {
		class := class
		t.Run("", func(t *testing.T) {
			t.Parallel()
			db := enginetest.NewDB(t)
			var calls atomic.Int32
			wf := engine.Define("garbageclass", func(ctx *engine.Context, _ int) (string, error) {
				_, err := engine.Step(ctx, "A", func(context.Context) (int, error) {
					calls.Add(1)
					return 0, engine.Permanent(engine.WithClass(errors.New("declined"), engine.ErrorClass(class)))
				}, nil)
				return "", err
			}, nil)
			e := newEngine(t, db, &engine.Config{LeaseDuration: time.Second}, wf)
			res, err := wf.Start(context.Background(), e, 1, nil)
			require.NoError(t, err)
			run := waitStatus(t, e, res.RunID, 6*time.Second, engine.StatusFailed)
			dumpRun(t, run)
			t.Logf("class %q: step fn called %d times", class, calls.Load())
			require.Equal(t, engine.StatusFailed, run.Status)
			require.Equal(t, int32(1), calls.Load(), "a Permanent error runs once")
		})
	}
}

// E2: an undo failing with a garbage class must park compensation_failed.
func TestGarbageErrorClassInUndo(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	var calls atomic.Int32
	wf := engine.Define("garbageundo", func(ctx *engine.Context, _ int) (string, error) {
		saga := compensation.New(ctx)
		if _, err := compensation.Step(saga, "A", func(context.Context) (int, error) { return 1, nil },
			compensation.Undo[int]{Name: "undo_A", Fn: func(context.Context, activities.Call, int) error {
				calls.Add(1)
				return engine.Permanent(engine.WithClass(errors.New("refund rejected \x00\xff"), "http_\xff"))
			}}, nil); err != nil {
			return "", err
		}
		_, err := engine.Step(ctx, "B", func(context.Context) (int, error) { return 0, engine.Permanent(errors.New("no")) }, nil)
		return "", err
	}, nil)
	e := newEngine(t, db, &engine.Config{LeaseDuration: time.Second}, wf)
	res, err := wf.Start(context.Background(), e, 1, nil)
	require.NoError(t, err)
	run := waitStatus(t, e, res.RunID, 6*time.Second, engine.StatusDead)
	dumpRun(t, run)
	t.Logf("undo called %d times", calls.Load())
	require.Equal(t, engine.StatusDead, run.Status)
	jobs, _, err := e.ListDeadJobs(context.Background(), engine.ListDeadJobsParams{RunID: res.RunID})
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	require.Equal(t, engine.ReasonCompensationFailed, jobs[0].Reason)
	require.Equal(t, int32(1), calls.Load())
}
