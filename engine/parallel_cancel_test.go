package engine_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
)

// A run's cancellation treats a GoActivity that does not heartbeat as it
// treats a RunActivity: when none of its failed attempts can have taken
// effect (NoEffect) it is tried no more and the run ends cancelled; when
// one may have, it gets at most 3 more attempts to settle, then the run
// is parked (class unsettled). Before (found by an attack pass), the
// parallel one went on for all its MaximumAttempts, and the run ended dead
// with retries exhausted.
func TestACancelledRunSettlesAParallelActivityAsASequentialOne(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		noEffect bool
		status   engine.RunStatus
		class    engine.ErrorClass
		maxAfter int64 // calls after the cancellation, at most
	}{
		{"no effect", true, engine.StatusCancelled, engine.ClassCancelled, 1},
		{"may have had an effect", false, engine.StatusDead, engine.ClassUnsettled, 4},
	} {
		for _, parallel := range []bool{false, true} {
			name := tc.name + "/sequential"
			if parallel {
				name = tc.name + "/parallel"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				var calls atomic.Int64
				fn := func(context.Context, *engine.ActivityAttempt) (int, error) {
					calls.Add(1)
					if tc.noEffect {
						return 0, engine.NoEffect(errors.New("429: refused before processing"))
					}
					return 0, errors.New("503")
				}
				opts := &engine.ActivityOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: 300 * time.Millisecond,
					BackoffCoefficient: 1, DisableJitter: true, MaximumAttempts: 12}}
				wf := engine.Define("settle-"+map[bool]string{false: "seq", true: "par"}[parallel]+"-"+map[bool]string{false: "5xx", true: "429"}[tc.noEffect],
					func(ctx *engine.Context, _ int) (int, error) {
						if parallel {
							return engine.GoActivity(ctx, "charge", fn, opts).Get(ctx)
						}
						return engine.RunActivity(ctx, "charge", fn, opts)
					}, nil)
				b := setup(t, nil, wf)
				ctx := testCtx(t)
				res, err := wf.Start(ctx, b.engine, 0, nil)
				require.NoError(t, err)
				eventually(t, 10*time.Second, "two calls", func() bool { return calls.Load() >= 2 })
				atCancel := calls.Load()
				require.NoError(t, b.engine.Cancel(ctx, res.RunID))
				run := waitStatus(t, b.engine, res.RunID, tc.status, 20*time.Second)
				require.Equal(t, tc.class, run.Error.Class)
				require.LessOrEqual(t, calls.Load()-atCancel, tc.maxAfter, "calls after the cancellation")
				require.NotEqual(t, engine.StepRetrying, run.Steps[0].Status, "no step left retrying")
			})
		}
	}
}

// A parallel step the run's cancellation stops, or that the workflow
// function leaves running when it returns, is recorded cancelled, as a
// sequential step is: a finished run shows no step still retrying. Before
// (found by an attack pass), it stayed retrying with a next attempt time.
func TestAStoppedParallelStepIsRecordedCancelled(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	fail := func(context.Context) (int, error) { calls.Add(1); return 0, errors.New("boom") }
	opts := &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: 400 * time.Millisecond, BackoffCoefficient: 1,
		DisableJitter: true, MaximumAttempts: 20}}
	cancelled := engine.Define("stopped-par-cancelled", func(ctx *engine.Context, _ int) (int, error) {
		return engine.Go(ctx, "s", fail, opts).Get(ctx)
	}, nil)
	abandoned := engine.Define("stopped-par-abandoned", func(ctx *engine.Context, _ int) (int, error) {
		engine.Go(ctx, "s", fail, opts)
		return 1, engine.Sleep(ctx, 600*time.Millisecond) // in place: the step keeps retrying meanwhile
	}, nil)
	b := setup(t, nil, cancelled, abandoned)
	ctx := testCtx(t)

	res, err := cancelled.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	eventually(t, 10*time.Second, "two calls", func() bool { return calls.Load() >= 2 })
	require.NoError(t, b.engine.Cancel(ctx, res.RunID))
	run := waitStatus(t, b.engine, res.RunID, engine.StatusCancelled, 10*time.Second)
	require.Equal(t, engine.StepCancelled, run.Steps[0].Status)
	require.Nil(t, run.Steps[0].NextAttemptAt)
	require.GreaterOrEqual(t, run.Steps[0].Attempts, 2)

	res, err = abandoned.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	run = waitStatus(t, b.engine, res.RunID, engine.StatusCompleted, 10*time.Second)
	var step engine.StepInfo
	for _, s := range run.Steps {
		if s.Name == "s" {
			step = s
		}
	}
	require.Equal(t, engine.StepCancelled, step.Status, "the step the workflow left running")
	require.Nil(t, step.NextAttemptAt)
}
