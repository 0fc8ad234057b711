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

// A run timeout cancels a sleeping run at its deadline on the engine's
// clock, not before: its compensation runs, it ends cancelled with
// ErrTimeout and ErrCancelled in its error, and it stays stopped.
func TestRunTimeoutCancelsASleepingRunAtItsDeadline(t *testing.T) {
	t.Parallel()
	clock := enginetest.NewClock(clockStart)
	var undone, after atomic.Int64
	wf := engine.Define("timed-sleeper", func(ctx *engine.Context, _ int) (int, error) {
		if _, err := engine.Step(ctx, "reserve", func(context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return 0, err
		}
		if err := ctx.Compensate(engine.Undo{Name: "release", Fn: func(context.Context, *engine.ActivityAttempt) error {
			undone.Add(1)
			return nil
		}}); err != nil {
			return 0, err
		}
		if err := engine.Sleep(ctx, 24*time.Hour); err != nil {
			return 0, err
		}
		after.Add(1)
		return 1, nil
	}, nil)
	b := setup(t, &engine.Config{Clock: clock}, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, &engine.StartOpts{RunTimeout: time.Hour})
	require.NoError(t, err)
	waitStatus(t, b.engine, res.RunID, engine.StatusWaiting, 10*time.Second)
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, clockStart.Add(time.Hour), run.DeadlineAt.UTC())
	require.EqualValues(t, time.Hour.Milliseconds(), run.RunTimeoutMS)

	clock.Advance(time.Hour - time.Second)
	time.Sleep(time.Second) // sweeps run: not yet
	run, err = b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusWaiting, run.Status, "cancelled before its deadline")
	require.Nil(t, run.CancelRequestedAt)

	clock.Advance(time.Second)
	_, err = wf.Wait(ctx, b.engine, res.RunID, 20*time.Millisecond)
	require.ErrorIs(t, err, engine.ErrCancelled)
	require.ErrorIs(t, err, engine.ErrTimeout)
	run, err = b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, run.Status)
	require.Equal(t, engine.ClassTimeout, run.Error.Class)
	require.Nil(t, run.DeadlineAt, "an ended run leaves the deadline sweep")
	require.EqualValues(t, 1, undone.Load())
	require.Zero(t, after.Load())
}

// A running run past its deadline has its forward step's context
// cancelled; the clock starts at the first pick-up, so a delayed run's
// wait does not count.
func TestRunTimeoutStopsARunningStepAndStartsAtPickUp(t *testing.T) {
	t.Parallel()
	wf := engine.Define("timed-busy", func(ctx *engine.Context, _ int) (int, error) {
		return engine.Step(ctx, "busy", func(sctx context.Context) (int, error) {
			<-sctx.Done()
			return 0, sctx.Err()
		}, nil)
	}, nil)
	b := setup(t, &engine.Config{SweepInterval: 50 * time.Millisecond}, wf)
	ctx := testCtx(t)
	start := time.Now()
	res, err := wf.Start(ctx, b.engine, 0, &engine.StartOpts{RunTimeout: 500 * time.Millisecond})
	require.NoError(t, err)
	_, err = wf.Wait(ctx, b.engine, res.RunID, 20*time.Millisecond)
	require.ErrorIs(t, err, engine.ErrTimeout)
	require.GreaterOrEqual(t, time.Since(start), 500*time.Millisecond)
	require.Less(t, time.Since(start), 5*time.Second)

	delayed, err := wf.Start(ctx, b.engine, 0, &engine.StartOpts{RunTimeout: time.Hour, Delay: 24 * time.Hour})
	require.NoError(t, err)
	run, err := b.engine.GetRun(ctx, delayed.RunID)
	require.NoError(t, err)
	require.Nil(t, run.DeadlineAt, "the clock starts at the first pick-up")

	_, err = wf.Start(ctx, b.engine, 0, &engine.StartOpts{RunTimeout: -time.Second})
	require.True(t, errors.Is(err, engine.ErrInvalidArgument))
}
