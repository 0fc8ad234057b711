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

func TestHeartbeatKeepsLongStepFromRunningTwice(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	wf := engine.Define("long", func(ctx *engine.Context, in int) (int, error) {
		return engine.Step(ctx, "slow", func(context.Context) (int, error) {
			calls.Add(1)
			time.Sleep(3500 * time.Millisecond) // 3.5x the lease
			return 1, nil
		}, nil)
	}, nil)
	db := enginetest.NewDB(t)
	cfg := &engine.Config{LeaseDuration: time.Second, SweepInterval: 50 * time.Millisecond}
	// Two engines sweep and fetch; only heartbeats keep the second away.
	e1 := newEngine(t, db, cfg, true, wf)
	newEngine(t, db, cfg, true, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, e1, 1, nil)
	require.NoError(t, err)
	_, err = wf.Wait(ctx, e1, res.RunID, 20*time.Millisecond)
	require.NoError(t, err)
	require.EqualValues(t, 1, calls.Load())
	run, err := e1.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, 1, run.Deliveries)
}

func TestStopAndCancelHandsRunsBackAtOnce(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	started := make(chan struct{}, 1)
	wf := engine.Define("interruptible", func(ctx *engine.Context, in int) (int, error) {
		if _, err := engine.Step(ctx, "first", func(context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return 0, err
		}
		return engine.Step(ctx, "wait", func(sctx context.Context) (int, error) {
			if calls.Add(1) == 1 {
				started <- struct{}{}
				<-sctx.Done() // honours cancellation, as step code should
				return 0, sctx.Err()
			}
			return 2, nil
		}, nil)
	}, nil)
	db := enginetest.NewDB(t)
	// A lease far longer than the test: only the hand-back can free the run.
	cfg := &engine.Config{LeaseDuration: time.Hour}
	e1 := newEngine(t, db, cfg, true, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, e1, 1, nil)
	require.NoError(t, err)
	<-started
	require.NoError(t, e1.StopAndCancel(ctx))

	run, err := e1.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, run.Status)
	require.Equal(t, "completed", string(run.Steps[0].Status), "the finished step's record is written on the way out")

	e2 := newEngine(t, db, cfg, true, wf)
	out, err := wf.Wait(ctx, e2, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 2, out)
	require.EqualValues(t, 2, calls.Load(), "the interrupted attempt runs again; it does not count as a failure")
	run, err = e2.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, 1, run.Steps[1].Attempts)
}
