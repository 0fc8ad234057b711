package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// A process that does not register a workflow hands its runs back at
// once, so a process that does (a rolling deploy: the old and the new
// binary run side by side) takes them within a second or two. Before, the
// process that fetched it held it back for 30 s each time.
func TestRunOfAnUnregisteredWorkflowReachesAProcessThatRegistersIt(t *testing.T) {
	t.Parallel()
	wf := echoWorkflow("only-on-new")
	other := echoWorkflow("other")
	db := enginetest.NewDB(t)
	old := newEngine(t, db, nil, true, other) // does not register only-on-new
	ctx := testCtx(t)
	res, err := wf.Start(ctx, old, 7, nil)
	require.NoError(t, err)
	eventually(t, 10*time.Second, "the old process to hand the run back", func() bool {
		var snoozed bool
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) > 0 FROM pgdurable.river_job WHERE coalesce((metadata->>'snoozes')::int, 0) >= 1`).Scan(&snoozed))
		return snoozed
	})
	handedBackAt := time.Now()
	defer func() {
		var snoozes, attempt int
		_ = db.Pool.QueryRow(ctx, `SELECT coalesce((metadata->>'snoozes')::int, 0), attempt FROM pgdurable.river_job`).Scan(&snoozes, &attempt)
		t.Logf("snoozes %d attempt %d", snoozes, attempt)
	}()
	updated := newEngine(t, db, nil, true, wf, other)
	out, err := wf.Wait(ctx, updated, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 7, out)
	took := time.Since(handedBackAt)
	t.Logf("completed %s after the hand-back", took.Round(time.Millisecond))
	require.Less(t, took, 15*time.Second, "not the old 30 s hold")
	run, err := updated.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, 0, run.StalledDeliveries, "hand-backs are not crashes")
}

// An activity that calls Heartbeat in a tight loop writes to the database
// about once per HeartbeatInterval (LeaseDuration/3), not once per call.
func TestHeartbeatsWriteAtMostOncePerInterval(t *testing.T) {
	t.Parallel()
	enginetest.SkipOnCitus(t, "counts the runs' updates with a trigger, which Citus refuses on a distributed table")
	started := make(chan struct{})
	var calls int
	wf := engine.Define("busy-heartbeat", func(ctx *engine.Context, _ int) (int, error) {
		return engine.RunActivity(ctx, "busy", func(actx context.Context, a *engine.ActivityAttempt) (int, error) {
			close(started)
			for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); {
				if err := a.Heartbeat(actx); err != nil {
					return 0, err
				}
				calls++
				time.Sleep(time.Millisecond)
			}
			return calls, nil
		}, &engine.ActivityOpts{HeartbeatTimeout: 5 * time.Second})
	}, nil)
	// HeartbeatInterval 1 s: 3 s of heartbeats may write about 3 times.
	b := setup(t, &engine.Config{LeaseDuration: 3 * time.Second}, wf)
	ctx := testCtx(t)
	_, err := b.db.Pool.Exec(ctx, `CREATE SEQUENCE run_updates;
		CREATE FUNCTION count_update() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM nextval('run_updates'); RETURN NEW; END $$;`)
	require.NoError(t, err)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	<-started
	_, err = b.db.Pool.Exec(ctx, `CREATE TRIGGER count_update AFTER UPDATE ON `+b.db.RunTable("workflow_runs", res.RunID)+` FOR EACH ROW EXECUTE FUNCTION count_update()`)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Greater(t, out, 1000, "Heartbeat was called often")
	var updates int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM run_updates`).Scan(&updates))
	t.Logf("%d Heartbeat calls, %d run updates (heartbeats and the completion)", out, updates)
	require.LessOrEqual(t, updates, int64(6), "about one heartbeat write per second, plus the completion")
}

// New refuses lease settings it cannot honour: a lease under a second, a
// heartbeat no shorter than the lease, negative intervals.
func TestNewRefusesBadLeaseSettings(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	for _, cfg := range []engine.Config{
		{LeaseDuration: 500 * time.Millisecond},
		{LeaseDuration: time.Second, HeartbeatInterval: 5 * time.Second},
		{HeartbeatInterval: -time.Second},
		{SweepInterval: -time.Second},
		{MaxInlineBackoff: -time.Second},
	} {
		_, err := engine.New(db.Pool, &cfg)
		require.Error(t, err, "%+v", cfg)
	}
	_, err := engine.New(db.Pool, &engine.Config{LeaseDuration: time.Second, HeartbeatInterval: 990 * time.Millisecond})
	require.NoError(t, err)
	_, err = engine.New(db.Pool, &engine.Config{MaxWorkers: engine.MaxMaxWorkers + 1})
	require.ErrorContains(t, err, "MaxWorkers 10001 is over 10000")
	_, err = engine.New(db.Pool, &engine.Config{MaxWorkers: engine.MaxMaxWorkers})
	require.NoError(t, err)
}

// Config.Retention is at least MinRetention (a minute) or negative: a
// typo of 1ns would delete every finished run at every sweep.
func TestNewRefusesARetentionUnderAMinute(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	_, err := engine.New(db.Pool, &engine.Config{Retention: time.Nanosecond})
	require.ErrorContains(t, err, "Retention 1ns is below the 1m0s minimum")
	for _, ok := range []time.Duration{-1, engine.MinRetention, engine.DefaultRetention} {
		_, err := engine.New(db.Pool, &engine.Config{Retention: ok})
		require.NoError(t, err, ok)
	}
}

// panickyObserver panics on every event it overrides.
type panickyObserver struct{ engine.NopObserver }

func (panickyObserver) RunStarted(engine.RunStartedEvent)     { panic("observer boom") }
func (panickyObserver) RunEnded(engine.RunEndedEvent)         { panic("observer boom") }
func (panickyObserver) StepAttempt(engine.StepAttemptEvent)   { panic("observer boom") }
func (panickyObserver) StepReplayed(engine.StepReplayedEvent) { panic("observer boom") }

// An Observer that panics loses its events and nothing else: a
// sequential step's run is not parked as if its workflow had panicked,
// and a parallel step's panic does not kill the process (an attack pass
// found both).
func TestAPanickingObserverLosesOnlyItsEvents(t *testing.T) {
	t.Parallel()
	wf := engine.Define("observed-by-a-panic", func(ctx *engine.Context, in int) (int, error) {
		a, err := engine.Step(ctx, "seq", func(context.Context) (int, error) { return in, nil }, nil)
		if err != nil {
			return 0, err
		}
		b, err := engine.Go(ctx, "par", func(context.Context) (int, error) { return 2 * in, nil }, nil).Get(ctx)
		return a + b, err
	}, nil)
	b := setup(t, &engine.Config{Observer: panickyObserver{}}, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 7, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 21, out)
}
