package engine_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// A parallel step started before the workflow waits (a long Sleep, an
// AwaitSignal with nothing buffered, a retry's long backoff) runs once,
// to its end: the delivery waits in place while it runs instead of ending
// and cutting it off, and suspends once no parallel step is left.
func TestParallelStepRunsOnceWhileTheWorkflowWaits(t *testing.T) {
	t.Parallel()
	var slowCalls, flakyCalls atomic.Int32
	slow := func(context.Context) (int, error) {
		slowCalls.Add(1)
		time.Sleep(1500 * time.Millisecond)
		return 7, nil
	}
	wf := engine.Define("branch-while-waiting", func(ctx *engine.Context, wait string) (int, error) {
		f := engine.Go(ctx, "slow", slow, nil)
		switch wait {
		case "sleep":
			if err := engine.Sleep(ctx, 3*time.Second); err != nil {
				return 0, err
			}
		case "signal-late", "signal-early":
			if _, err := engine.AwaitSignal[int](ctx, "go", 0); err != nil {
				return 0, err
			}
		case "backoff":
			if _, err := engine.Step(ctx, "flaky", func(context.Context) (int, error) {
				if flakyCalls.Add(1) == 1 {
					return 0, errors.New("503")
				}
				return 1, nil
			}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: 3 * time.Second, MaximumInterval: 3 * time.Second}}); err != nil {
				return 0, err
			}
		}
		return f.Get(ctx)
	}, nil)
	b := setup(t, &engine.Config{MaxInlineBackoff: 200 * time.Millisecond}, wf)
	ctx := testCtx(t)
	for _, wait := range []string{"sleep", "signal-late", "signal-early", "backoff"} {
		slowCalls.Store(0)
		res, err := wf.Start(ctx, b.engine, wait, nil)
		require.NoError(t, err)
		switch wait {
		case "signal-early": // taken in place while the parallel step runs
			time.Sleep(300 * time.Millisecond)
			require.NoError(t, b.engine.Signal(ctx, res.RunID.String(), "go", 1, nil))
		case "signal-late": // after the parallel step ended and the run suspended
			waitStatus(t, b.engine, res.RunID, engine.StatusWaiting, 10*time.Second)
			require.NoError(t, b.engine.Signal(ctx, res.RunID.String(), "go", 1, nil))
		}
		out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
		require.NoError(t, err, wait)
		require.Equal(t, 7, out, wait)
		require.EqualValues(t, 1, slowCalls.Load(), "%s: the parallel step ran once", wait)
	}
}

// A wait that holds its delivery in place while a parallel step runs
// writes its deadline down first: a Select's timer and a Sleep keep the
// time they started with across a stop and another engine's delivery
// (the parallel step, which never finishes, runs again there).
func TestDeadlinesWaitedInPlaceSurviveARedelivery(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"select", "sleep"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			var started atomic.Int32
			wf := engine.Define("deadline-in-place", func(ctx *engine.Context, _ int) (string, error) {
				f := engine.Go(ctx, "blocked", func(sctx context.Context) (int, error) {
					started.Add(1)
					<-sctx.Done()
					return 0, sctx.Err()
				}, nil)
				if kind == "sleep" {
					return "slept", engine.Sleep(ctx, time.Hour)
				}
				sel, err := engine.Select(ctx, "step-or-timeout", engine.OnFuture(f), engine.OnTimer(time.Hour))
				if err != nil {
					return "", err
				}
				return map[int]string{0: "step", 1: "timer"}[sel.Index], nil
			}, nil)
			db := enginetest.NewDB(t)
			clock := enginetest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			cfg := &engine.Config{Clock: clock, LeaseDuration: time.Second}
			first := newEngine(t, db, cfg, true, wf)
			ctx := testCtx(t)
			res, err := wf.Start(ctx, first, 0, nil)
			require.NoError(t, err)
			eventually(t, 10*time.Second, "the wait's start to be written", func() bool {
				run, err := first.GetRun(ctx, res.RunID)
				require.NoError(t, err)
				for _, s := range run.Steps {
					if s.Kind != engine.KindStep && s.Status == engine.StepStarted {
						return true
					}
				}
				return false
			})
			clock.Advance(30 * time.Minute)
			stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			require.NoError(t, first.StopAndCancel(stopCtx))

			second := newEngine(t, db, cfg, true, wf)
			eventually(t, 10*time.Second, "the parallel step to run again", func() bool { return started.Load() == 2 })
			clock.Advance(31 * time.Minute) // 61 minutes after the wait began: past its hour
			out, err := wf.Wait(ctx, second, res.RunID, 10*time.Millisecond)
			require.NoError(t, err)
			require.Equal(t, map[string]string{"select": "timer", "sleep": "slept"}[kind], out)
		})
	}
}

// A parallel step that panics while the workflow waits in place for a
// signal parks the run then, as Get would, instead of the run suspending
// with the panic forgotten and the step running again on its next
// delivery (found by an attack pass).
func TestParallelStepPanicDuringAWaitInPlaceParksTheRun(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	wf := engine.Define("panic-while-waiting", func(ctx *engine.Context, _ int) (int, error) {
		f := engine.Go(ctx, "boom", func(context.Context) (int, error) {
			calls.Add(1)
			time.Sleep(300 * time.Millisecond)
			panic("kaboom")
		}, nil)
		if _, err := engine.AwaitSignal[int](ctx, "go", 0); err != nil {
			return 0, err
		}
		return f.Get(ctx)
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	waitStatus(t, b.engine, res.RunID, engine.StatusDead, 10*time.Second)
	require.Equal(t, engine.ReasonPanic, openDeadJob(t, b.engine, res.RunID).Reason)
	require.EqualValues(t, 1, calls.Load())
}

// A graceful Stop lets a parallel step that is running finish before the
// run is handed back at the workflow's next step boundary, as it lets a
// sequential step finish: the next delivery replays the step instead of
// running it again (found by a fresh-user pass: the step was cut off).
func TestStopLetsARunningParallelStepFinish(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	started := make(chan struct{}, 2)
	wf := engine.Define("stop-with-branch", func(ctx *engine.Context, _ int) (int, error) {
		f := engine.Go(ctx, "slow", func(context.Context) (int, error) {
			calls.Add(1)
			started <- struct{}{}
			time.Sleep(1500 * time.Millisecond)
			return 7, nil
		}, nil)
		if err := engine.Sleep(ctx, 300*time.Millisecond); err != nil {
			return 0, err
		}
		if _, err := engine.Step(ctx, "after", func(context.Context) (int, error) { return 0, nil }, nil); err != nil {
			return 0, err
		}
		return f.Get(ctx)
	}, nil)
	db := enginetest.NewDB(t)
	first := newEngine(t, db, nil, true, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, first, 0, nil)
	require.NoError(t, err)
	<-started
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, first.Stop(stopCtx))
	second := newEngine(t, db, nil, true, wf)
	out, err := wf.Wait(ctx, second, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 7, out)
	require.EqualValues(t, 1, calls.Load(), "the parallel step ran once")
}
