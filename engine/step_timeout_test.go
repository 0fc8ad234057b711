package engine_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
)

// A step that ignores its context past its StartToCloseTimeout is
// abandoned: the workflow sees the typed timeout error (class timeout,
// errors.Is ErrTimeout) long before the function would have returned, and
// the recorded error says the same on replay.
func TestStepIgnoringItsContextPastItsTimeoutReturnsTheTimeoutError(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	wf := engine.Define("stuck-step", func(ctx *engine.Context, _ int) (string, error) {
		_, err := engine.Step(ctx, "stuck", func(context.Context) (int, error) {
			<-release // ignores its context
			return 1, nil
		}, &engine.StepOpts{StartToCloseTimeout: 100 * time.Millisecond, ReturnExhausted: true,
			RetryPolicy: &engine.RetryPolicy{MaximumAttempts: 1}})
		var se *engine.StepError
		if errors.Is(err, engine.ErrTimeout) && errors.As(err, &se) {
			return string(se.Class), nil
		}
		return "", errors.New("not a timeout: " + errText(err))
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	start := time.Now()
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, string(engine.ClassTimeout), out)
	require.Less(t, time.Since(start), 5*time.Second)
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.ClassTimeout, run.Steps[0].Error.Class)
	require.Contains(t, run.Steps[0].Error.Message, "start-to-close timeout")
}

func errText(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

// An attempt past its timeout counts as a failed attempt and is retried:
// two attempts that wait out their context, then one that returns.
func TestTimedOutAttemptsAreRetried(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	wf := engine.Define("slow-then-fast", func(ctx *engine.Context, _ int) (int64, error) {
		return engine.Step(ctx, "slow", func(sctx context.Context) (int64, error) {
			if n := calls.Add(1); n < 3 {
				<-sctx.Done()
				return 0, sctx.Err()
			}
			return calls.Load(), nil
		}, &engine.StepOpts{StartToCloseTimeout: 50 * time.Millisecond, RetryPolicy: &engine.RetryPolicy{InitialInterval: time.Millisecond}})
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.EqualValues(t, 3, out)
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, 3, run.Steps[0].Attempts)
}

// A ScheduleToCloseTimeout stops retrying once the next backoff would end
// past it: the step fails with the timeout, not after all its attempts.
func TestScheduleToCloseTimeoutStopsRetrying(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	wf := engine.Define("deadline-step", func(ctx *engine.Context, _ int) (string, error) {
		_, err := engine.Step(ctx, "flaky", func(context.Context) (int, error) {
			calls.Add(1)
			return 0, errors.New("upstream unavailable")
		}, &engine.StepOpts{ScheduleToCloseTimeout: 500 * time.Millisecond, ReturnExhausted: true,
			RetryPolicy: &engine.RetryPolicy{InitialInterval: 150 * time.Millisecond, BackoffCoefficient: 1, MaximumAttempts: 100}})
		if errors.Is(err, engine.ErrTimeout) && errors.Is(err, engine.ErrRetriesExhausted) {
			return "deadline", nil
		}
		return "", errors.New("not a deadline: " + errText(err))
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	start := time.Now()
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "deadline", out)
	require.Less(t, time.Since(start), 3*time.Second)
	require.GreaterOrEqual(t, calls.Load(), int64(2))
	require.LessOrEqual(t, calls.Load(), int64(4), "stopped by the deadline, not after 100 attempts")
}

// A tx step's attempt past its timeout is awaited and rolls back, even when
// its function ignores its context and returns success late: only the
// attempt that finished in time wrote its row.
func TestTxStepPastItsTimeoutRollsBack(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	wf := engine.Define("tx-timeout", func(ctx *engine.Context, _ int) (int64, error) {
		runID := ctx.RunID()
		return engine.TxStep(ctx, "reserve", func(_ context.Context, tx pgx.Tx) (int64, error) {
			n := calls.Add(1)
			if _, err := tx.Exec(context.Background(), `INSERT INTO reservations (run_id, note) VALUES ($1, $2)`,
				runID, "attempt"); err != nil {
				return 0, err
			}
			if n == 1 {
				time.Sleep(300 * time.Millisecond) // ignores its context
			}
			return n, nil
		}, &engine.StepOpts{StartToCloseTimeout: 100 * time.Millisecond, RetryPolicy: &engine.RetryPolicy{InitialInterval: time.Millisecond}})
	}, nil)
	b := setup(t, nil, wf)
	createReservations(t, b)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.EqualValues(t, 2, out)
	require.Equal(t, []string{"attempt"}, reservations(t, b, res.RunID), "the late attempt rolled back")
}

// Negative timeouts are refused before the step takes a position.
func TestNegativeStepTimeoutsAreRefused(t *testing.T) {
	t.Parallel()
	wf := engine.Define("neg-timeout", func(ctx *engine.Context, _ int) (string, error) {
		_, err := engine.Step(ctx, "s", func(context.Context) (int, error) { return 1, nil }, &engine.StepOpts{StartToCloseTimeout: -time.Second})
		if !errors.Is(err, engine.ErrInvalidArgument) {
			return "", errors.New("accepted")
		}
		_, err = engine.RunActivity(ctx, "a", func(context.Context, *engine.ActivityAttempt) (int, error) { return 1, nil }, &engine.ActivityOpts{ScheduleToCloseTimeout: -time.Second})
		if !errors.Is(err, engine.ErrInvalidArgument) {
			return "", errors.New("activity accepted")
		}
		return "refused", nil
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "refused", out)
}

// ActivityOpts.ScheduleToCloseTimeout bounds an activity as a whole, as
// StepOpts' does a step, for RunActivity and GoActivity alike: retries
// stop once the next backoff would end past it, and an attempt still
// running at it has its context cancelled (an activity that does not
// heartbeat too) and fails with the timeout. Before, ActivityOpts had no
// such field.
func TestActivityScheduleToCloseTimeout(t *testing.T) {
	t.Parallel()
	var flakyCalls, stuckCalls atomic.Int64
	var stuckCancelled atomic.Int64
	flaky := func(context.Context, *engine.ActivityAttempt) (int, error) {
		flakyCalls.Add(1)
		return 0, errors.New("upstream unavailable")
	}
	stuck := func(ctx context.Context, _ *engine.ActivityAttempt) (int, error) {
		stuckCalls.Add(1)
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) { // the deadline's, not the delivery's end
				stuckCancelled.Add(1)
			}
			return 0, ctx.Err()
		case <-time.After(20 * time.Second):
			return 1, nil
		}
	}
	deadline := func(err error) (string, error) {
		if errors.Is(err, engine.ErrTimeout) && errors.Is(err, engine.ErrRetriesExhausted) {
			return "deadline", nil
		}
		return "", errors.New("not a deadline: " + errText(err))
	}
	retries := &engine.RetryPolicy{InitialInterval: 150 * time.Millisecond, BackoffCoefficient: 1, MaximumAttempts: 100}
	wf := engine.Define("deadline-activity", func(ctx *engine.Context, parallel bool) (string, error) {
		var err error
		for _, fn := range []func(context.Context, *engine.ActivityAttempt) (int, error){flaky, stuck} {
			opts := &engine.ActivityOpts{ScheduleToCloseTimeout: 500 * time.Millisecond, ReturnExhausted: true, RetryPolicy: retries}
			if parallel {
				_, err = engine.GoActivity(ctx, "call", fn, opts).Get(ctx)
			} else {
				_, err = engine.RunActivity(ctx, "call", fn, opts)
			}
			if out, err := deadline(err); err != nil {
				return out, err
			}
		}
		return "deadline", nil
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	for i, parallel := range []bool{false, true} {
		start := time.Now()
		res, err := wf.Start(ctx, b.engine, parallel, nil)
		require.NoError(t, err)
		out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
		require.NoError(t, err, "GoActivity: %v", parallel)
		require.Equal(t, "deadline", out)
		require.Less(t, time.Since(start), 5*time.Second)
		require.LessOrEqual(t, flakyCalls.Load(), int64(4*(i+1)), "stopped by the deadline, not after 100 attempts")
		require.Equal(t, int64(i+1), stuckCalls.Load(), "the stuck attempt used the time up: no retry")
		require.Eventually(t, func() bool { return stuckCancelled.Load() == int64(i+1) }, 5*time.Second, 10*time.Millisecond,
			"the stuck attempt's context is cancelled at the deadline (GoActivity: %v)", parallel)
	}
}
