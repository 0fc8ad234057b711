package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// "The charge timed out → try the fallback provider": with ReturnExhausted
// an activity that times out on its last attempt comes back to the
// workflow as a *StepError that errors.Is finds ErrTimeout,
// context.DeadlineExceeded and ErrRetriesExhausted in. Without it, the
// default stands: the run is parked, because a timed-out call may have
// taken effect.
func TestTimedOutActivityCanBeHandledByTheWorkflow(t *testing.T) {
	t.Parallel()
	slow := func(ctx context.Context, _ *engine.ActivityAttempt) (string, error) {
		<-ctx.Done()
		return "", ctx.Err()
	}
	policy := &engine.RetryPolicy{InitialInterval: 10 * time.Millisecond, MaximumAttempts: 2}
	handled := engine.Define("fallback", func(ctx *engine.Context, _ int) (string, error) {
		_, err := engine.RunActivity(ctx, "primary",
			slow, &engine.ActivityOpts{
				StartToCloseTimeout: 50 * time.Millisecond, RetryPolicy: policy, ReturnExhausted: true,
			})
		if errors.Is(err, engine.ErrTimeout) && errors.Is(err, context.DeadlineExceeded) && errors.Is(err, engine.ErrRetriesExhausted) {
			return engine.RunActivity(ctx, "fallback", func(context.Context, *engine.ActivityAttempt) (string, error) {
				return "charged by the fallback", nil
			}, nil)
		}
		return "", err
	}, nil)
	parked := engine.Define("parked", func(ctx *engine.Context, _ int) (string, error) {
		return engine.RunActivity(ctx, "primary", slow, &engine.ActivityOpts{StartToCloseTimeout: 50 * time.Millisecond, RetryPolicy: policy})
	}, nil)
	b := setup(t, nil, handled, parked)
	ctx := testCtx(t)
	res, err := handled.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	out, err := handled.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "charged by the fallback", out)
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, "failed", string(run.Steps[0].Status))
	require.Equal(t, 2, run.Steps[0].Attempts)
	require.Equal(t, "timeout", string(run.Steps[0].Error.Class))

	res, err = parked.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	run = waitStatus(t, b.engine, res.RunID, engine.StatusDead, 10*time.Second)
	require.Equal(t, engine.ReasonRetriesExhausted, openDeadJob(t, b.engine, res.RunID).Reason)
	require.Contains(t, run.Error.Message, "retries exhausted after 2 attempts")
}

// A plain step that runs out of retries parks the run when there is
// nothing to compensate; with ReturnExhausted the workflow gets the error.
func TestExhaustedStepCanBeReturnedToTheWorkflow(t *testing.T) {
	t.Parallel()
	wf := engine.Define("exhausted", func(ctx *engine.Context, _ int) (string, error) {
		_, err := engine.Step(ctx, "flaky", func(context.Context) (int, error) {
			return 0, errors.New("503")
		}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: time.Millisecond, MaximumAttempts: 3}, ReturnExhausted: true})
		var se *engine.StepError
		if errors.As(err, &se) && errors.Is(err, engine.ErrRetriesExhausted) {
			return "gave up after " + se.Message, nil
		}
		return "", err
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "gave up after retries exhausted after 3 attempts: 503", out)
}

// A retry policy that makes no sense is refused where it is given, naming
// the field, instead of being replaced by defaults.
func TestNonsenseRetryPoliciesAreRefused(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	for _, tc := range []struct {
		policy engine.RetryPolicy
		field  string
	}{
		{engine.RetryPolicy{BackoffCoefficient: 0.5}, "BackoffCoefficient"},
		{engine.RetryPolicy{InitialInterval: -time.Second}, "InitialInterval"},
		{engine.RetryPolicy{MaximumInterval: -time.Second}, "MaximumInterval"},
		{engine.RetryPolicy{InitialInterval: time.Minute, MaximumInterval: time.Second}, "MaximumInterval"},
		{engine.RetryPolicy{MaximumAttempts: -1}, "MaximumAttempts"},
	} {
		p := tc.policy
		_, err := engine.New(db.Pool, &engine.Config{RetryPolicy: &p})
		require.ErrorContains(t, err, "RetryPolicy."+tc.field, "New")
		e, err := engine.New(db.Pool, nil)
		require.NoError(t, err)
		wf := engine.Define("bad-policy", func(*engine.Context, int) (int, error) { return 0, nil }, &engine.WorkflowOpts{RetryPolicy: &p})
		require.ErrorContains(t, e.Register(wf), "RetryPolicy."+tc.field, "Register")
		_, err = wf.Start(context.Background(), e, 0, nil)
		require.ErrorContains(t, err, "RetryPolicy."+tc.field, "Start")
	}

	// A step's own policy is refused by the step, before it takes a position.
	wf := engine.Define("bad-step-policy", func(ctx *engine.Context, _ int) (string, error) {
		_, err := engine.Step(ctx, "s", func(context.Context) (int, error) { return 1, nil },
			&engine.StepOpts{RetryPolicy: &engine.RetryPolicy{BackoffCoefficient: 0.1}})
		if errors.Is(err, engine.ErrInvalidArgument) {
			return err.Error(), nil
		}
		return "", err
	}, nil)
	e := newEngine(t, db, nil, true, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, e, 0, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Contains(t, out, "RetryPolicy.BackoffCoefficient 0.1 is below 1")
}

// An initial interval above the inherited maximum (1 minute by default)
// raises the maximum instead of being cut to it.
func TestInitialIntervalAboveTheDefaultMaximumRaisesIt(t *testing.T) {
	t.Parallel()
	clock := enginetest.NewClock(time.Now())
	flaky := engine.Define("slow-flaky", func(ctx *engine.Context, _ int) (int, error) {
		return engine.Step(ctx, "s", func(context.Context) (int, error) {
			return 0, errors.New("later")
		}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: 5 * time.Minute, DisableJitter: true}})
	}, nil)
	b := setup(t, &engine.Config{Clock: clock}, flaky)
	ctx := testCtx(t)
	res, err := flaky.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	run := waitStatus(t, b.engine, res.RunID, engine.StatusWaiting, 10*time.Second)
	require.NotNil(t, run.Steps[0].NextAttemptAt)
	require.Equal(t, 5*time.Minute, run.Steps[0].NextAttemptAt.Sub(clock.Now()).Round(time.Second), "the 1-minute default maximum does not cut it")
}
