package regress_test

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

func TestCompensateTwiceRunsUndoTwice(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	var undos atomic.Int32
	wf := engine.Define("twice", func(ctx *engine.Context, _ int) (string, error) {
		if _, err := engine.Step(ctx, "A", func(context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return "", err
		}
		u := engine.Undo{Name: "undo_A", Fn: func(context.Context, *engine.ActivityAttempt) error { undos.Add(1); return nil }}
		err1 := ctx.Compensate(u)
		err2 := ctx.Compensate(u)
		ctx.Logger().Info("compensate results", "first", err1, "second", err2)
		_, err := engine.Step(ctx, "B", func(context.Context) (int, error) { return 0, engine.Permanent(errors.New("no")) }, nil)
		return "", err
	}, nil)
	e := newEngine(t, db, nil, wf)
	res, err := wf.Start(context.Background(), e, 1, nil)
	require.NoError(t, err)
	run := waitStatus(t, e, res.RunID, 10*time.Second, engine.StatusCompensated, engine.StatusDead)
	dumpRun(t, run)
	require.Equal(t, int32(1), undos.Load(), "one forward step, one undo")
}

func TestUndoPanics(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	wf := engine.Define("undopanic", func(ctx *engine.Context, _ int) (string, error) {
		if _, err := engine.Step(ctx, "A", func(context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return "", err
		}
		if err := ctx.Compensate(engine.Undo{Name: "undo_A", Tx: nil, Fn: func(context.Context, *engine.ActivityAttempt) error { panic("boom\x00\xff") }}); err != nil {
			return "", err
		}
		_, err := engine.Step(ctx, "B", func(context.Context) (int, error) { return 0, engine.Permanent(errors.New("no")) }, nil)
		return "", err
	}, nil)
	e := newEngine(t, db, nil, wf)
	res, err := wf.Start(context.Background(), e, 1, nil)
	require.NoError(t, err)
	run := waitStatus(t, e, res.RunID, 10*time.Second, engine.StatusDead)
	dumpRun(t, run)
	jobs, _, err := e.ListDeadJobs(context.Background(), engine.ListDeadJobsParams{RunID: res.RunID})
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	require.Equal(t, engine.ReasonCompensationFailed, jobs[0].Reason)
	require.Equal(t, "undo_A", jobs[0].StepName)
}

func TestCancelPendingNeverDelivered(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	var aRuns atomic.Int32
	wf := engine.Define("pend", func(ctx *engine.Context, _ int) (string, error) {
		_, err := engine.Step(ctx, "A", func(context.Context) (int, error) { aRuns.Add(1); return 1, nil }, nil)
		return "x", err
	}, nil)
	client, err := engine.New(db.Pool, nil)
	require.NoError(t, err)
	require.NoError(t, client.Register(wf))
	res, err := wf.Start(context.Background(), client, 1, nil)
	require.NoError(t, err)
	require.NoError(t, client.Cancel(context.Background(), res.RunID))
	require.NoError(t, client.Cancel(context.Background(), res.RunID))
	e := newEngine(t, db, nil, wf)
	run := waitStatus(t, e, res.RunID, 10*time.Second, engine.StatusCancelled)
	require.Equal(t, engine.StatusCancelled, run.Status)
	require.Zero(t, aRuns.Load())
	require.NoError(t, e.Cancel(context.Background(), res.RunID), "cancelling a cancelled run again is a no-op")
}
