package engine_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
)

// A step, activity or workflow result over MaxPayloadBytes is refused on
// its one attempt with ErrOutputTooLarge, which the workflow can catch;
// nothing oversized is stored. Before, a 5 MiB result was stored whole and
// loaded again on every replay.
func TestOversizedOutputsAreRefusedAndCatchable(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 5<<20)
	var calls int
	wf := engine.Define("big-output", func(ctx *engine.Context, _ int) (string, error) {
		var caught []string
		_, err := engine.Step(ctx, "step", func(context.Context) (string, error) { calls++; return big, nil }, nil)
		var se *engine.StepError
		if errors.Is(err, engine.ErrOutputTooLarge) && errors.As(err, &se) {
			caught = append(caught, se.Class)
		}
		_, err = engine.RunActivity(ctx, "activity", nil, func(context.Context, *engine.ActivityAttempt) (string, error) { return big, nil })
		if errors.Is(err, engine.ErrOutputTooLarge) {
			caught = append(caught, "activity")
		}
		return strings.Join(caught, ","), nil
	}, nil)
	wfBig := engine.Define("big-workflow-output", func(ctx *engine.Context, _ int) (string, error) { return big, nil }, nil)
	b := setup(t, nil, wf, wfBig)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "output_too_large,activity", out)
	require.Equal(t, 1, calls, "not retried")
	var stored int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT coalesce(max(octet_length(coalesce(output::text, '') || coalesce(error::text, ''))), 0)
		FROM workflow_steps WHERE run_id = $1`, res.RunID).Scan(&stored))
	require.Less(t, stored, 64<<10, "nothing oversized is stored")

	res, err = wfBig.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	run := waitStatus(t, b.engine, res.RunID, engine.StatusDead, 10*time.Second)
	require.ErrorIs(t, run.Error.Err(), engine.ErrOutputTooLarge)
	require.Empty(t, run.Output)
}

// Signals are bounded per run, by count and by bytes (consumed ones count:
// they are kept for replays), so a run's view never grows without bound.
func TestSignalsAreBoundedPerRun(t *testing.T) {
	t.Parallel()
	wf := engine.Define("signal-bound", func(ctx *engine.Context, _ int) (string, error) {
		return engine.AwaitSignal[string](ctx, "never", 0)
	}, nil)
	b := setup(t, &engine.Config{MaxSignalsPerRun: 3, MaxSignalBytesPerRun: 64}, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	for range 3 {
		require.NoError(t, b.engine.Signal(ctx, res.RunID.String(), "other", "x"))
	}
	err = b.engine.Signal(ctx, res.RunID.String(), "other", "x")
	require.ErrorIs(t, err, engine.ErrLimitExceeded)
	require.ErrorContains(t, err, "holds 3 signals")

	res2, err := wf.Start(ctx, b.engine, 1, nil)
	require.NoError(t, err)
	require.NoError(t, b.engine.Signal(ctx, res2.RunID.String(), "other", strings.Repeat("y", 40)))
	err = b.engine.Signal(ctx, res2.RunID.String(), "other", strings.Repeat("y", 40))
	require.ErrorIs(t, err, engine.ErrLimitExceeded)
	require.ErrorContains(t, err, "64-byte bound")
	run, err := b.engine.GetRun(ctx, res2.RunID)
	require.NoError(t, err)
	require.Len(t, run.Signals, 1)
}
