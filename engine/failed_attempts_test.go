package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
)

// outcome is an AttemptFailure without its time, to compare.
func outcomes(fs []engine.AttemptFailure) []string {
	var out []string
	for _, f := range fs {
		if f.Replayed {
			out = append(out, "replayed")
			continue
		}
		out = append(out, fmt.Sprintf("%d %s %s: %s", f.Attempt, f.Status, f.Class, f.Message))
	}
	return out
}

// A step's failed attempts are recorded with their outcome and time, oldest
// first: retries, the attempt that parked the run, and a replay's mark;
// the attempt that completes the step is not among them. At most 20 are
// kept, the latest.
func TestStepsKeepTheirFailedAttempts(t *testing.T) {
	t.Parallel()
	var calls, fixed atomic.Int32
	fast := &engine.RetryPolicy{InitialInterval: time.Millisecond, MaximumInterval: time.Millisecond}
	flaky := engine.Define("flaky", func(ctx *engine.Context, mode string) (int, error) {
		policy := *fast
		policy.MaximumAttempts = 3
		if mode == "many" {
			policy.MaximumAttempts = 25
		}
		return engine.Step(ctx, "call", func(context.Context) (int, error) {
			n := calls.Add(1)
			switch {
			case mode == "twice" && n <= 2:
				return 0, fmt.Errorf("upstream said no (%d)", n)
			case mode == "park" && fixed.Load() == 0:
				return 0, errors.New("still broken")
			case mode == "permanent":
				return 0, engine.Permanent(errors.New("bad request"))
			case mode == "many":
				return 0, errors.New("down")
			}
			return int(n), nil
		}, &engine.StepOpts{RetryPolicy: &policy})
	}, nil)
	b := setup(t, nil, flaky)
	ctx := testCtx(t)
	start := func(mode string) *engine.Run {
		t.Helper()
		calls.Store(0)
		res, err := flaky.Start(ctx, b.engine, mode, &engine.StartOpts{WorkflowID: "flaky-" + mode})
		require.NoError(t, err)
		var want engine.RunStatus
		switch mode {
		case "twice":
			want = engine.StatusCompleted
		case "permanent":
			want = engine.StatusFailed
		default:
			want = engine.StatusDead
		}
		return waitStatus(t, b.engine, res.RunID, want, 30*time.Second)
	}

	began := time.Now()
	run := start("twice")
	step := run.Steps[0]
	require.Equal(t, 3, step.Attempts)
	require.Equal(t, []string{"1 retrying transient: upstream said no (1)", "2 retrying transient: upstream said no (2)"}, outcomes(step.FailedAttempts))
	for _, f := range step.FailedAttempts {
		require.WithinRange(t, f.At, began.Add(-time.Second), time.Now().Add(time.Second))
	}
	require.False(t, step.FailedAttempts[1].At.Before(step.FailedAttempts[0].At))

	run = start("permanent")
	require.Equal(t, []string{"1 failed permanent: bad request"}, outcomes(run.Steps[0].FailedAttempts))

	run = start("park")
	require.Equal(t, []string{"1 retrying transient: still broken", "2 retrying transient: still broken",
		"3 parked transient: retries exhausted after 3 attempts: still broken"}, outcomes(run.Steps[0].FailedAttempts))
	fixed.Store(1)
	_, err := b.engine.ReplayDeadJob(ctx, openDeadJob(t, b.engine, run.RunID).ID, nil)
	require.NoError(t, err)
	run = waitStatus(t, b.engine, run.RunID, engine.StatusCompleted, 30*time.Second)
	require.Equal(t, []string{"1 retrying transient: still broken", "2 retrying transient: still broken",
		"3 parked transient: retries exhausted after 3 attempts: still broken", "replayed"}, outcomes(run.Steps[0].FailedAttempts))
	require.Equal(t, 1, run.Steps[0].Attempts, "the replay's attempt completed it")

	run = start("many")
	fs := run.Steps[0].FailedAttempts
	require.Len(t, fs, 20, "the latest 20")
	require.Equal(t, 6, fs[0].Attempt)
	require.Equal(t, 25, fs[19].Attempt)
	require.Equal(t, engine.StepParked, fs[19].Status)
}
