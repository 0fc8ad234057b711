package engine_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/internal/crashtest"
)

// envBlockSlowTx: crash-activity-tx's tx step hangs (its transaction open)
// until the test kills the worker; crash-budget's step hangs the same way.
const envBlockSlowTx = "PGDURABLE_TEST_BLOCK_SLOW_TX"

// budget is crash-budget's ScheduleToCloseTimeout.
const budget = 5 * time.Second

// deadlineCrashWorkflows are crash workflows for what a worker's death
// must not undo: an activity's recorded outcome, a step's time budget.
func deadlineCrashWorkflows(pool *pgxpool.Pool) []engine.Registration {
	// activityTx calls an activity, then runs a tx step that is slow (under
	// envBlockSlowTx, it never commits).
	activityTx := engine.Define("crash-activity-tx", func(ctx *engine.Context, _ crashIn) (int, error) {
		n, err := engine.RunActivity(ctx, "charge", func(actx context.Context, a *engine.ActivityAttempt) (int, error) {
			return 1, bumpCalls(context.WithoutCancel(actx), pool, ctx.RunID(), "charge")
		}, nil)
		if err != nil {
			return 0, err
		}
		return engine.TxStep(ctx, "record", func(sctx context.Context, tx pgx.Tx) (int, error) {
			if err := bumpCalls(context.WithoutCancel(sctx), pool, ctx.RunID(), "record"); err != nil {
				return 0, err
			}
			if os.Getenv(envBlockSlowTx) == "1" {
				<-make(chan struct{}) // a slow transaction: killed before it commits
			}
			return n + 1, nil
		}, nil)
	}, nil)
	// budgeted runs one step with a ScheduleToCloseTimeout that never
	// returns before its context ends (or, under envBlockSlowTx, at all).
	budgeted := engine.Define("crash-budget", func(ctx *engine.Context, _ crashIn) (int, error) {
		return engine.Step(ctx, "slow", func(sctx context.Context) (int, error) {
			if err := bumpCalls(context.WithoutCancel(sctx), pool, ctx.RunID(), "slow"); err != nil {
				return 0, err
			}
			if os.Getenv(envBlockSlowTx) == "1" {
				<-make(chan struct{})
			}
			<-sctx.Done()
			return 0, sctx.Err()
		}, &engine.StepOpts{ScheduleToCloseTimeout: budget, ReturnExhausted: true})
	}, nil)
	return []engine.Registration{activityTx, budgeted}
}

// An activity's outcome is written when it returns, not with the next tx
// step's transaction: a worker killed while that transaction is slow
// leaves the activity completed, and the next delivery does not call it
// again (nor records a lost attempt).
func TestActivityOutcomeIsRecordedBeforeASlowTxStep(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	createCallsTable(t, db.Pool)
	wfs := crashWorkflows(db.Pool)
	client := newEngine(t, db, nil, false, wfs...)
	ctx := testCtx(t)
	res, err := client.StartJSON(ctx, "crash-activity-tx", []byte(`{}`), nil)
	require.NoError(t, err)
	child := crashtest.StartWorker(t, db, time.Second, envBlockSlowTx+"=1")
	eventually(t, 30*time.Second, "the tx step to start", func() bool { return calls(t, db.Pool, res.RunID, "record") == 1 })
	run, err := client.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StepCompleted, run.Steps[0].Status, "the activity's outcome is recorded while the tx step runs")
	crashtest.Kill(t, child)

	worker := newEngine(t, db, &engine.Config{LeaseDuration: time.Second}, true, wfs...)
	run = waitStatus(t, worker, res.RunID, engine.StatusCompleted, 30*time.Second)
	require.Equal(t, 1, calls(t, db.Pool, res.RunID, "charge"), "the activity is not called again")
	require.Equal(t, 1, run.Steps[0].Attempts)
	require.Nil(t, run.Steps[0].Error, "no lost attempt is recorded")
	require.JSONEq(t, `2`, string(run.Output))
}

// A step's ScheduleToCloseTimeout counts from its first attempt's start
// across deliveries: a worker killed halfway through the budget does not
// give the next delivery a fresh one.
func TestScheduleToCloseTimeoutSurvivesAKilledWorker(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	createCallsTable(t, db.Pool)
	wfs := crashWorkflows(db.Pool)
	client := newEngine(t, db, nil, false, wfs...)
	ctx := testCtx(t)
	res, err := client.StartJSON(ctx, "crash-budget", []byte(`{}`), nil)
	require.NoError(t, err)
	child := crashtest.StartWorker(t, db, time.Second, envBlockSlowTx+"=1")
	eventually(t, 30*time.Second, "the step to start", func() bool { return calls(t, db.Pool, res.RunID, "slow") == 1 })
	began := time.Now()
	time.Sleep(budget / 2)
	crashtest.Kill(t, child)

	worker := newEngine(t, db, &engine.Config{LeaseDuration: time.Second}, true, wfs...)
	run := waitStatus(t, worker, res.RunID, engine.StatusFailed, 30*time.Second)
	ended := time.Since(began)
	require.ErrorIs(t, run.Error.Err(), engine.ErrTimeout)
	require.Equal(t, 2, calls(t, db.Pool, res.RunID, "slow"))
	// A fresh budget would end it past 2.5 s (the kill) + about 1 s (the
	// lease) + 5 s; the first attempt's budget ends at 5 s.
	require.Less(t, ended, budget+1500*time.Millisecond, "the step's budget ran from its first attempt")
}
