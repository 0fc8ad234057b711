package engine_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/internal/crashtest"
)

// tickets counts the River jobs that deliver runID.
func tickets(t *testing.T, db *enginetest.DB, runID uuid.UUID) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pgdurable.river_job WHERE kind = 'pgdurable.run' AND args->>'run_id' = $1`, runID.String()).Scan(&n))
	return n
}

// A run started in a process that works its workflow executes there at
// once, without a River ticket; one started while every worker is busy is
// held there (pending, no ticket) and runs when a worker frees up; one
// started by a client process, or in the caller's transaction, gets a
// ticket.
func TestStartDispatchesToAFreeWorkerOfTheStartingProcess(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	inStep := make(chan struct{}, 10)
	wf := engine.Define("dispatched", func(ctx *engine.Context, in int) (int, error) {
		return engine.Step(ctx, "s", func(sctx context.Context) (int, error) {
			if in == 1 {
				inStep <- struct{}{}
				select {
				case <-release:
				case <-sctx.Done():
				}
			}
			return in, nil
		}, nil)
	}, nil)
	db := enginetest.NewDB(t)
	worker := newEngine(t, db, &engine.Config{MaxWorkers: 1}, true, wf)
	client := newEngine(t, db, nil, false, wf)
	ctx := testCtx(t)
	warmUp(t, wf, worker) // a process holds runs only once it knows how long its deliveries take

	first, err := wf.Start(ctx, worker, 1, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusRunning, first.Status, "claimed by the start itself")
	<-inStep
	require.Zero(t, tickets(t, db, first.RunID))

	held, err := wf.Start(ctx, worker, 2, nil) // the one worker is busy
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, held.Status)
	require.Zero(t, tickets(t, db, held.RunID), "held by the starting process")
	fromClient, err := wf.Start(ctx, client, 3, nil)
	require.NoError(t, err)
	var inTx *engine.StartResult
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		inTx, err = wf.StartTx(ctx, worker, tx, 4, nil)
		return err
	}))
	for _, r := range []*engine.StartResult{fromClient, inTx} {
		require.Equal(t, 1, tickets(t, db, r.RunID))
	}

	close(release)
	for i, r := range []*engine.StartResult{first, held, fromClient, inTx} {
		out, err := wf.Wait(ctx, worker, r.RunID, 10*time.Millisecond)
		require.NoError(t, err)
		require.Equal(t, i+1, out)
		run, err := worker.GetRun(ctx, r.RunID)
		require.NoError(t, err)
		require.Equal(t, 1, run.Deliveries)
	}
	require.Zero(t, tickets(t, db, held.RunID), "the held run ran in its process, without River")
}

// warmUp runs one quick run of wf (input 0) on e to its end: a process
// holds runs only once a delivery of its has ended.
func warmUp(t *testing.T, wf *engine.Workflow[int, int], e *engine.Engine) {
	t.Helper()
	ctx := testCtx(t)
	r, err := wf.Start(ctx, e, 0, nil)
	require.NoError(t, err)
	_, err = wf.Wait(ctx, e, r.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	// Wait returns as the run's end commits; its delivery frees its worker
	// a moment later. Starting before then would find every worker busy.
	eventually(t, 10*time.Second, "the warm-up run's worker to be free", func() bool {
		return engine.FreeWorkers(e) > 0
	})
}

// A held run whose process stays busy past the hold (about a second) gets
// a River ticket, and another process runs it; a process that stops gives
// the runs it holds tickets at once.
func TestHeldRunsGoToRiverWhenTheirProcessCannotRunThem(t *testing.T) {
	t.Parallel()
	inStep := make(chan struct{}, 10)
	wf := engine.Define("held", func(ctx *engine.Context, in int) (int, error) {
		return engine.Step(ctx, "s", func(sctx context.Context) (int, error) {
			if in < 0 {
				inStep <- struct{}{}
				<-sctx.Done() // busy until its engine stops
			}
			return in, nil
		}, nil)
	}, nil)
	db := enginetest.NewDB(t)
	ctx := testCtx(t)
	cfg := &engine.Config{MaxWorkers: 1, LeaseDuration: time.Second, SweepInterval: 100 * time.Millisecond}

	busy := newEngine(t, db, cfg, true, wf)
	warmUp(t, wf, busy)
	_, err := wf.Start(ctx, busy, -1, nil)
	require.NoError(t, err)
	<-inStep
	expires, err := wf.Start(ctx, busy, 1, nil)
	require.NoError(t, err)
	require.Zero(t, tickets(t, db, expires.RunID))
	other := newEngine(t, db, &engine.Config{SweepInterval: 100 * time.Millisecond}, true, wf)
	out, err := wf.Wait(ctx, other, expires.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 1, out)
	require.Equal(t, 1, tickets(t, db, expires.RunID), "it got a ticket once its hold passed")

	stopping := newEngine(t, db, cfg, true, wf)
	warmUp(t, wf, stopping)
	_, err = wf.Start(ctx, stopping, -2, nil)
	require.NoError(t, err)
	<-inStep
	released, err := wf.Start(ctx, stopping, 2, nil)
	require.NoError(t, err)
	require.NoError(t, stopping.StopAndCancel(ctx))
	require.Equal(t, 1, tickets(t, db, released.RunID), "released with a ticket by the stop")
	out, err = wf.Wait(ctx, other, released.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 2, out)
}

// A run dispatched in its starting process whose worker process dies is
// redelivered when its lease expires, as any other run.
func TestDispatchedRunOfAKilledWorkerFinishesElsewhere(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	createCallsTable(t, db.Pool)
	ctx := testCtx(t)
	child := crashtest.StartWorker(t, db, 2*time.Second, envBlockStep3+"=1", crashtest.EnvWorkerStarts+"=crash-three:1")
	var runID uuid.UUID
	eventually(t, 30*time.Second, "the child's run to record step 2", func() bool {
		err := db.Pool.QueryRow(ctx, db.SQL(`SELECT run_id FROM pgdurable.workflow_steps WHERE seq = 1 AND status = 'completed'`)).Scan(&runID)
		return err == nil
	})
	require.Zero(t, tickets(t, db, runID), "dispatched in the child without a ticket")
	crashtest.Kill(t, child)

	worker := newEngine(t, db, &engine.Config{LeaseDuration: 2 * time.Second, SweepInterval: 100 * time.Millisecond}, true,
		crashWorkflows(db.Pool)...)
	run := waitStatus(t, worker, runID, engine.StatusCompleted, 30*time.Second)
	require.Equal(t, 2, run.Deliveries)
	for _, s := range []string{"s1", "s2", "s3"} {
		require.Equal(t, 1, calls(t, db.Pool, runID, s), s)
	}
}

// Wait on a run that ends in the waiting process returns as its end
// commits, not at the next poll; Observer.RunEnded names the run.
func TestWaitWakesWhenTheRunEndsInThisProcess(t *testing.T) {
	t.Parallel()
	wf := engine.Define("woken", func(ctx *engine.Context, in int) (int, error) {
		return engine.Step(ctx, "s", func(context.Context) (int, error) { return in * 2, nil }, nil)
	}, nil)
	ended := make(chan uuid.UUID, 10)
	b := setup(t, &engine.Config{Observer: endedObserver{ended: ended}}, wf)
	ctx := testCtx(t)
	for i := range 5 {
		start := time.Now()
		res, err := wf.Start(ctx, b.engine, i, nil)
		require.NoError(t, err)
		out, err := wf.Wait(ctx, b.engine, res.RunID, time.Hour)
		require.NoError(t, err)
		require.Equal(t, i*2, out)
		require.Less(t, time.Since(start), 10*time.Second, "woken, not polled")
		require.Equal(t, res.RunID, <-ended)
	}
}

type endedObserver struct {
	engine.NopObserver
	ended chan<- uuid.UUID
}

func (o endedObserver) RunEnded(ev engine.RunEndedEvent) { o.ended <- ev.RunID }

// A start planned as held whose insert lands after Stop released the held
// runs (it waited on another transaction's row for its workflow ID) gets
// its River job at once, not when its hold passes.
func TestStartLandingAfterStopIsReleased(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	inStep := make(chan struct{}, 1)
	wf := engine.Define("held-race", func(ctx *engine.Context, in int) (int, error) {
		return engine.Step(ctx, "s", func(sctx context.Context) (int, error) {
			if in < 0 {
				inStep <- struct{}{}
				<-sctx.Done()
			}
			return in, nil
		}, nil)
	}, nil)
	ctx := testCtx(t)
	e := newEngine(t, db, &engine.Config{MaxWorkers: 1}, true, wf)
	_, err := wf.Start(ctx, e, -1, nil) // takes the only worker
	require.NoError(t, err)
	<-inStep
	blocker, err := db.Pool.Begin(ctx) // holds workflow ID "w", uncommitted
	require.NoError(t, err)
	client := newEngine(t, db, nil, false, wf)
	_, err = wf.StartTx(ctx, client, blocker, 5, &engine.StartOpts{WorkflowID: "w"})
	require.NoError(t, err)
	done := make(chan *engine.StartResult, 1)
	go func() {
		r, err := wf.Start(ctx, e, 5, &engine.StartOpts{WorkflowID: "w"}) // planned held; waits on the blocker
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, e.StopAndCancel(ctx))
	require.NoError(t, blocker.Rollback(ctx)) // the held start's insert lands now
	r := <-done
	var heldUntil *time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT held_until FROM pgdurable.workflow_runs WHERE run_id = $1`), r.RunID).Scan(&heldUntil))
	require.Nil(t, heldUntil)
	require.Equal(t, 1, tickets(t, db, r.RunID))
}

// Runs started through a busy process reach an idle one: two processes
// with one worker each, four runs of a workflow whose step blocks started
// through the first; one runs on each process at once (the first process
// knows nothing of how long its deliveries take, so it holds none), and
// each of the other two starts as soon as a worker of either frees up.
func TestAnIdleProcessGetsWorkABusyOneWasGiven(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := testCtx(t)
	type process struct {
		release chan struct{}
		started atomic.Int32
		e       *engine.Engine
	}
	var procs [2]*process
	for i := range procs {
		p := &process{release: make(chan struct{}, 4)}
		wf := engine.Define("blocking", func(ctx *engine.Context, _ int) (int, error) {
			return engine.Step(ctx, "block", func(sctx context.Context) (int, error) {
				p.started.Add(1)
				select {
				case <-p.release:
				case <-sctx.Done():
				}
				return i, nil
			}, nil)
		}, nil)
		p.e = newEngine(t, db, &engine.Config{MaxWorkers: 1}, true, wf)
		procs[i] = p
	}
	started := func() (a, b int32) { return procs[0].started.Load(), procs[1].started.Load() }
	for range 4 {
		_, err := procs[0].e.StartJSON(ctx, "blocking", []byte(`0`), nil)
		require.NoError(t, err)
	}
	began := time.Now()
	eventually(t, 10*time.Second, "a run on each process", func() bool { a, b := started(); return a == 1 && b == 1 })
	require.Less(t, time.Since(began), time.Second, "a run on each process within a second")
	for i, p := range []*process{procs[1], procs[0]} {
		p.release <- struct{}{}
		began := time.Now()
		eventually(t, 10*time.Second, "the next run to start", func() bool { a, b := started(); return a+b == int32(3+i) })
		require.Less(t, time.Since(began), time.Second, "a freed worker takes the next run within a second")
	}
	for _, p := range procs {
		close(p.release)
	}
}
