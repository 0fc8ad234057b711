package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// tickets counts the River jobs that deliver runID.
func tickets(t *testing.T, db *enginetest.DB, runID uuid.UUID) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM river_job WHERE kind = 'pgdurable.run' AND args->>'run_id' = $1`, runID.String()).Scan(&n))
	return n
}

// A run started in a process that works its workflow executes there at
// once, without a River ticket; one started by a client process, in the
// caller's transaction, or while every worker is busy gets a ticket.
func TestStartDispatchesToAFreeWorkerOfTheStartingProcess(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	inStep := make(chan struct{}, 10)
	wf := engine.Define("dispatched", func(ctx *engine.Context, in int) (int, error) {
		return engine.Step(ctx, "s", func(context.Context) (int, error) {
			if in == 1 {
				inStep <- struct{}{}
				<-release
			}
			return in, nil
		}, nil)
	}, nil)
	db := enginetest.NewDB(t)
	worker := newEngine(t, db, &engine.Config{MaxWorkers: 1}, true, wf)
	client := newEngine(t, db, nil, false, wf)
	ctx := testCtx(t)

	first, err := wf.Start(ctx, worker, 1, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusRunning, first.Status, "claimed by the start itself")
	<-inStep
	require.Zero(t, tickets(t, db, first.RunID))

	busy, err := wf.Start(ctx, worker, 2, nil) // the one worker is busy
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, busy.Status)
	fromClient, err := wf.Start(ctx, client, 3, nil)
	require.NoError(t, err)
	var inTx *engine.StartResult
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		inTx, err = wf.StartTx(ctx, worker, tx, 4, nil)
		return err
	}))
	for _, r := range []*engine.StartResult{busy, fromClient, inTx} {
		require.Equal(t, 1, tickets(t, db, r.RunID))
	}

	close(release)
	for i, r := range []*engine.StartResult{first, busy, fromClient, inTx} {
		out, err := wf.Wait(ctx, worker, r.RunID, 10*time.Millisecond)
		require.NoError(t, err)
		require.Equal(t, i+1, out)
		run, err := worker.GetRun(ctx, r.RunID)
		require.NoError(t, err)
		require.Equal(t, 1, run.Deliveries)
	}
}

// A run dispatched in its starting process whose worker process dies is
// redelivered when its lease expires, as any other run.
func TestDispatchedRunOfAKilledWorkerFinishesElsewhere(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	createCallsTable(t, db.Pool)
	ctx := testCtx(t)
	child := enginetest.StartWorker(t, db, 2*time.Second, envBlockStep3+"=1", enginetest.EnvWorkerStarts+"=crash-three:1")
	var runID uuid.UUID
	eventually(t, 30*time.Second, "the child's run to record step 2", func() bool {
		err := db.Pool.QueryRow(ctx, `SELECT run_id FROM workflow_steps WHERE seq = 1 AND status = 'completed'`).Scan(&runID)
		return err == nil
	})
	require.Zero(t, tickets(t, db, runID), "dispatched in the child without a ticket")
	enginetest.Kill(t, child)

	worker := newEngine(t, db, &engine.Config{LeaseDuration: 2 * time.Second, SweepInterval: 100 * time.Millisecond}, true,
		crashWorkflows(db.Pool)...)
	run := waitStatus(t, worker, runID, engine.StatusCompleted, 30*time.Second)
	require.Equal(t, 2, run.Deliveries)
	for _, s := range []string{"s1", "s2", "s3"} {
		require.Equal(t, 1, calls(t, db.Pool, runID, s), s)
	}
}
