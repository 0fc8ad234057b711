package engine_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
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

// A ticket that River fetched and whose delivery died before claiming the
// run is found however many stale tickets come before it: a killed
// process leaves a running ticket per delivery it ran until River's
// rescuer comes for them, and a first page of 1,000 of those hid the
// orphan behind them until then.
func TestOrphanedTicketIsFoundBehindManyStaleOnes(t *testing.T) {
	t.Parallel()
	wf := engine.Define("orphan-behind", func(ctx *engine.Context, n int) (int, error) {
		return engine.Step(ctx, "one", func(context.Context) (int, error) { return n, nil }, nil)
	}, nil)
	db := enginetest.NewDB(t)
	ctx := testCtx(t)
	// Older stale tickets, for runs that ended elsewhere; too young for
	// River's rescuer, which takes them after a minute.
	_, err := db.Pool.Exec(ctx, `INSERT INTO pgdurable.river_job (args, kind, queue, state, attempt, max_attempts, priority,
		attempted_at, attempted_by, scheduled_at)
		SELECT jsonb_build_object('run_id', gen_random_uuid()), 'pgdurable.run', 'pgdurable', 'running', 1, 25, 1,
		       now() - interval '25 seconds', ARRAY['dead-process'], now()
		FROM generate_series(1, 1500)`)
	require.NoError(t, err)
	client := newEngine(t, db, &engine.Config{LeaseDuration: time.Second}, false, wf)
	res, err := wf.Start(ctx, client, 7, nil)
	require.NoError(t, err)
	// Its ticket was fetched by a process that died before its claim.
	_, err = db.Pool.Exec(ctx, `UPDATE pgdurable.river_job SET state = 'running', attempt = 1, attempted_at = now() - interval '20 seconds',
		attempted_by = ARRAY['dead-process'] WHERE args->>'run_id' = $1`, res.RunID.String())
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `UPDATE `+db.RunTable("workflow_runs", res.RunID)+` SET enqueued_at = now() - interval '20 seconds' WHERE run_id = $1`, res.RunID)
	require.NoError(t, err)

	worker := newEngine(t, db, &engine.Config{LeaseDuration: time.Second}, true, wf)
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second) // River's rescuer would come only after 35 s
	defer cancel()
	out, err := wf.Wait(wctx, worker, res.RunID, 50*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 7, out)
}

// A heartbeat interval close to the lease still keeps it: a beat is skipped
// only while the lease has half an interval to spare at the next tick.
// Before, a beat right after the claim was skipped whenever the lease had
// more than LeaseDuration − interval/2 left, and with an interval near the
// lease the next tick came too late (found by an attack pass: 9 of 30 runs
// lost their lease at a 3 s lease and a 2.5 s interval).
func TestHeartbeatIntervalNearTheLeaseKeepsIt(t *testing.T) {
	t.Parallel()
	wf := engine.Define("long-step-near-lease", func(ctx *engine.Context, _ int) (int, error) {
		return engine.Step(ctx, "long", func(context.Context) (int, error) {
			time.Sleep(9 * time.Second)
			return 1, nil
		}, nil)
	}, nil)
	// An interval at 90% of the lease, three intervals long a step: at a
	// 1 s lease the 100 ms to spare made a loaded CI machine's pauses lose
	// every lease of a heartbeat batch at once (all 10 runs, twice).
	b := setup(t, &engine.Config{LeaseDuration: 3 * time.Second, HeartbeatInterval: 2700 * time.Millisecond}, wf)
	ctx := testCtx(t)
	ids := make([]uuid.UUID, 10)
	for i := range ids {
		res, err := wf.Start(ctx, b.engine, 0, nil)
		require.NoError(t, err)
		ids[i] = res.RunID
	}
	for _, id := range ids {
		_, err := wf.Wait(ctx, b.engine, id, 20*time.Millisecond)
		require.NoError(t, err)
		run, err := b.engine.GetRun(ctx, id)
		require.NoError(t, err)
		require.Equal(t, 1, run.Deliveries, "the lease held through the step")
	}
}
