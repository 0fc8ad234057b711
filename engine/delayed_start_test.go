package engine_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// delayedWorkflow counts its runs' first steps.
func delayedWorkflow(name string, ran *atomic.Int64) *engine.Workflow[int, int] {
	return engine.Define(name, func(ctx *engine.Context, in int) (int, error) {
		return engine.Step(ctx, "work", func(context.Context) (int, error) { ran.Add(1); return in * 2, nil }, nil)
	}, nil)
}

// A delayed run waits, holding no River job, and is not picked up one
// second before its start time on the engine's clock; at its time it runs.
// StartAt and Delay give the same start; both at once, or a negative
// delay, are refused.
func TestDelayedStartIsNotPickedUpEarly(t *testing.T) {
	t.Parallel()
	clock := enginetest.NewClock(clockStart)
	var ran atomic.Int64
	wf := delayedWorkflow("delayed", &ran)
	b := setup(t, &engine.Config{Clock: clock}, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 21, &engine.StartOpts{Delay: time.Hour})
	require.NoError(t, err)
	require.Equal(t, engine.StatusWaiting, res.Status)
	atRes, err := wf.Start(ctx, b.engine, 1, &engine.StartOpts{StartAt: clockStart.Add(time.Hour)})
	require.NoError(t, err)
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, clockStart.Add(time.Hour), run.WakeAt.UTC())
	require.Nil(t, run.StartedAt)
	var jobs int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgdurable.river_job`).Scan(&jobs))
	require.Zero(t, jobs, "a delayed run has no River job while it waits")

	dueAfter(t, b.engine, clock, res.RunID, time.Hour)
	require.Zero(t, ran.Load(), "not run before its time")
	out, err := wf.Wait(ctx, b.engine, res.RunID, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 42, out)
	_, err = wf.Wait(ctx, b.engine, atRes.RunID, 20*time.Millisecond)
	require.NoError(t, err)
	require.EqualValues(t, 2, ran.Load())

	_, err = wf.Start(ctx, b.engine, 1, &engine.StartOpts{Delay: time.Minute, StartAt: clockStart.Add(2 * time.Hour)})
	require.ErrorIs(t, err, engine.ErrInvalidArgument)
	_, err = wf.Start(ctx, b.engine, 1, &engine.StartOpts{Delay: -time.Second})
	require.ErrorIs(t, err, engine.ErrInvalidArgument)
	past, err := wf.Start(ctx, b.engine, 1, &engine.StartOpts{StartAt: clockStart.Add(-time.Hour)})
	require.NoError(t, err)
	require.NotEqual(t, engine.StatusWaiting, past.Status, "a start time in the past starts now")
}

// Cancelling a delayed run while it waits ends it cancelled without its
// workflow's steps having run, and leaves no River job behind; StartNow
// then reports it closed.
func TestCancelledDelayedRunLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	var ran atomic.Int64
	wf := delayedWorkflow("delayed-cancel", &ran)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 1, &engine.StartOpts{Delay: 24 * time.Hour})
	require.NoError(t, err)
	require.NoError(t, b.engine.Cancel(ctx, res.RunID))
	_, err = wf.Wait(ctx, b.engine, res.RunID, 20*time.Millisecond)
	require.ErrorIs(t, err, engine.ErrCancelled)
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, run.Status)
	require.Nil(t, run.WakeAt)
	require.Empty(t, run.Steps)
	require.Zero(t, ran.Load())
	eventually(t, 10*time.Second, "the run's River ticket to finish", func() bool {
		var open int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgdurable.river_job WHERE state NOT IN ('completed', 'cancelled', 'discarded')`).Scan(&open))
		return open == 0
	})
	require.ErrorIs(t, b.engine.StartNow(ctx, res.RunID), engine.ErrRunClosed)
}

// StartNow starts a delayed run at once; a second call is a no-op until it
// runs; on a run that has started it is refused.
func TestStartNowStartsADelayedRun(t *testing.T) {
	t.Parallel()
	var ran atomic.Int64
	wf := delayedWorkflow("delayed-now", &ran)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 5, &engine.StartOpts{Delay: 24 * time.Hour})
	require.NoError(t, err)
	require.NoError(t, b.engine.StartNow(ctx, res.RunID))
	out, err := wf.Wait(ctx, b.engine, res.RunID, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 10, out)
	require.ErrorIs(t, b.engine.StartNow(ctx, res.RunID), engine.ErrRunClosed)

	sleeper := engine.Define("sleeper", func(ctx *engine.Context, _ int) (int, error) {
		return 0, engine.Sleep(ctx, time.Hour)
	}, nil)
	b2 := setup(t, nil, sleeper)
	sres, err := sleeper.Start(ctx, b2.engine, 0, nil)
	require.NoError(t, err)
	waitStatus(t, b2.engine, sres.RunID, engine.StatusWaiting, 10*time.Second)
	require.ErrorIs(t, b2.engine.StartNow(ctx, sres.RunID), engine.ErrInvalidArgument, "a sleeping run has started")
}

// StartMany takes delays per start.
func TestStartManyDelaysEachStartOnItsOwn(t *testing.T) {
	t.Parallel()
	var ran atomic.Int64
	wf := delayedWorkflow("delayed-many", &ran)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.StartMany(ctx, b.engine, []engine.StartParams[int]{
		{Input: 1, Opts: &engine.StartOpts{Delay: time.Hour}},
		{Input: 2},
	})
	require.NoError(t, err)
	require.Equal(t, engine.StatusWaiting, res[0].Status)
	_, err = wf.Wait(ctx, b.engine, res[1].RunID, 20*time.Millisecond)
	require.NoError(t, err)
	run, err := b.engine.GetRun(ctx, res[0].RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusWaiting, run.Status)
	require.EqualValues(t, 1, ran.Load())
}

// A signal to a run waiting for its delayed start does not start it (as
// StartOpts.StartAt and Signal document; Temporal's StartDelay would end
// at the signal): the run keeps waiting, undelivered, with the signal
// buffered, and once started (StartNow here) its AwaitSignal receives it.
func TestSignalDoesNotStartADelayedRunEarly(t *testing.T) {
	t.Parallel()
	wf := engine.Define("delayed-awaits", func(ctx *engine.Context, _ int) (string, error) {
		return engine.AwaitSignal[string](ctx, "go", 0)
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, &engine.StartOpts{Delay: time.Hour, WorkflowID: "later"})
	require.NoError(t, err)
	before, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.NoError(t, b.engine.Signal(ctx, "later", "go", "now", nil))
	// A signal that wakes a run makes it pending and enqueues its delivery
	// in the signal's own transaction: committed, neither happened.
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusWaiting, run.Status)
	var jobs int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgdurable.river_job WHERE args->>'run_id' = $1`, res.RunID.String()).Scan(&jobs))
	require.Zero(t, jobs, "no delivery was enqueued")
	require.Zero(t, run.Deliveries, "not started by the signal")
	require.Nil(t, run.StartedAt)
	require.Equal(t, before.WakeAt, run.WakeAt, "its start time stands")
	require.Len(t, run.Signals, 1)
	require.Nil(t, run.Signals[0].ConsumedSeq, "the signal waits in the buffer")

	require.NoError(t, b.engine.StartNow(ctx, res.RunID))
	out, err := wf.Wait(ctx, b.engine, res.RunID, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "now", out, "once started, the run receives the buffered signal")
}
