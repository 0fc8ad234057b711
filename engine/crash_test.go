package engine_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/internal/crashtest"
)

// Crash tests run workers as child processes (crashtest.StartWorker
// re-executes this test binary) and SIGKILL them: a real crash, not a
// cancelled context. These variables steer the children's workflows.
const (
	envBlockStep3      = "PGDURABLE_TEST_BLOCK_STEP3"
	envPauseFirst      = "PGDURABLE_TEST_PAUSE_BEFORE_S1"   // workflow code idles 2 s before s1
	envBlockInTx       = "PGDURABLE_TEST_BLOCK_IN_TX"       // crash-tx: hang inside the tx step, before commit
	envBlockAfter      = "PGDURABLE_TEST_BLOCK_AFTER_TX"    // crash-tx: hang in the step after the tx step
	envSlowS1          = "PGDURABLE_TEST_SLOW_S1"           // crash-three: s1 takes 300 ms after counting its call
	envBlockKids       = "PGDURABLE_TEST_BLOCK_KIDS"        // crash-kid: hang inside the tx step, before commit
	envBlockChain      = "PGDURABLE_TEST_BLOCK_IN_CHAIN"    // crash-tx-chain: hang in the second of three chained tx steps
	envBlockChainAfter = "PGDURABLE_TEST_BLOCK_AFTER_CHAIN" // crash-tx-chain: hang in the step after the chain
)

func TestMain(m *testing.M) {
	crashtest.RunWorkerIfChild(crashWorkflows)
	// Every engine a test starts is stopped by then: no goroutine may
	// remain. The runnable examples' shared database goes last.
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { dropExampleDatabase() }))
}

type crashIn struct {
	Poison bool `json:"poison"`
}

// crashWorkflows are shared by the test and its child workers. Each step
// bumps an invocation counter in the step_calls table on entry, on a
// context that cancellation cannot stop: the counter records that the
// function started, which is what "never runs twice" is about.
func crashWorkflows(pool *pgxpool.Pool) []engine.Registration {
	three := engine.Define("crash-three", func(ctx *engine.Context, in crashIn) (int, error) {
		if os.Getenv(envPauseFirst) == "1" {
			time.Sleep(2 * time.Second) // deterministic workflow code that takes a while
		}
		total := 0
		for _, name := range []string{"s1", "s2", "s3"} {
			n, err := engine.Step(ctx, name, func(sctx context.Context) (int, error) {
				if name == "s3" && os.Getenv(envBlockStep3) == "1" {
					select {} // hold the worker here until the test kills it
				}
				if in.Poison && name == "s1" {
					time.Sleep(300 * time.Millisecond)
					os.Exit(3) // the poison run takes its worker down on every delivery
				}
				err := bumpCalls(context.WithoutCancel(sctx), pool, ctx.RunID(), name)
				if name == "s1" && os.Getenv(envSlowS1) == "1" {
					time.Sleep(300 * time.Millisecond)
				}
				return 1, err
			}, nil)
			if err != nil {
				return 0, err
			}
			total += n
		}
		return total, nil
	}, nil)
	// flaky fails its first two attempts; in a child with envBlockStep3 its
	// third attempt hangs until the test kills the worker.
	flaky := engine.Define("crash-flaky", func(ctx *engine.Context, in crashIn) (int, error) {
		return engine.Step(ctx, "flaky", func(sctx context.Context) (int, error) {
			if err := bumpCalls(context.WithoutCancel(sctx), pool, ctx.RunID(), "flaky"); err != nil {
				return 0, err
			}
			var n int
			if err := pool.QueryRow(sctx, `SELECT n FROM step_calls WHERE run_id = $1 AND step = 'flaky'`, ctx.RunID()).Scan(&n); err != nil {
				return 0, err
			}
			switch {
			case n <= 2:
				return 0, fmt.Errorf("attempt %d: 503", n)
			case n == 3 && os.Getenv(envBlockStep3) == "1":
				select {}
			}
			return n, nil
		}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: 50 * time.Millisecond, MaximumAttempts: 4}})
	}, nil)
	// lost fails its first attempt; in a child with envBlockStep3 its
	// second (and last) attempt hangs until the test kills the worker.
	lost := engine.Define("crash-lost", func(ctx *engine.Context, in crashIn) (int, error) {
		return engine.Step(ctx, "lost", func(sctx context.Context) (int, error) {
			if err := bumpCalls(context.WithoutCancel(sctx), pool, ctx.RunID(), "lost"); err != nil {
				return 0, err
			}
			if calls := callsOf(sctx, pool, ctx.RunID(), "lost"); calls == 1 {
				return 0, errors.New("503")
			} else if calls == 2 && os.Getenv(envBlockStep3) == "1" {
				select {}
			}
			return 1, nil
		}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: 50 * time.Millisecond, MaximumAttempts: 2}})
	}, nil)
	// tx writes a business row in a tx step, then runs one more step.
	tx := engine.Define("crash-tx", func(ctx *engine.Context, in crashIn) (int, error) {
		n, err := engine.TxStep(ctx, "reserve", func(sctx context.Context, tx pgx.Tx) (int, error) {
			if _, err := tx.Exec(sctx, `INSERT INTO reservations (run_id) VALUES ($1)`, ctx.RunID()); err != nil {
				return 0, err
			}
			if err := bumpCalls(context.WithoutCancel(sctx), pool, ctx.RunID(), "reserve"); err != nil {
				return 0, err
			}
			if os.Getenv(envBlockInTx) == "1" {
				select {} // killed with the insert uncommitted
			}
			return 1, nil
		}, nil)
		if err != nil {
			return 0, err
		}
		return engine.Step(ctx, "after", func(sctx context.Context) (int, error) {
			if os.Getenv(envBlockAfter) == "1" {
				select {} // killed after the tx step committed
			}
			return n + 1, bumpCalls(context.WithoutCancel(sctx), pool, ctx.RunID(), "after")
		}, nil)
	}, nil)
	// batch runs five plain steps and, in the middle, a tx step: started
	// by the hundred in a child, its records go out in group commits.
	batch := engine.Define("crash-batch", func(ctx *engine.Context, in crashIn) (int, error) {
		total := 0
		for i := range 6 {
			name := fmt.Sprint("b", i)
			var n int
			var err error
			if i == 3 {
				n, err = engine.TxStep(ctx, name, func(sctx context.Context, tx pgx.Tx) (int, error) {
					_, err := tx.Exec(sctx, `INSERT INTO reservations (run_id) VALUES ($1)`, ctx.RunID())
					return 1, err
				}, nil)
			} else {
				n, err = engine.Step(ctx, name, func(sctx context.Context) (int, error) {
					return 1, bumpCalls(context.WithoutCancel(sctx), pool, ctx.RunID(), name)
				}, nil)
			}
			if err != nil {
				return 0, err
			}
			total += n
		}
		return total, nil
	}, nil)
	// fanout runs 100 tx steps in parallel, 10 at a time, each writing its
	// business row (reservations, note = its index) in its transaction and
	// counting its calls outside it, then returns their results in order.
	fanout := engine.Define("crash-fanout", func(ctx *engine.Context, in crashIn) ([]int, error) {
		fs := make([]*engine.Future[int], 100)
		for i := range fs {
			name := fmt.Sprint("f", i)
			fs[i] = engine.GoTx(ctx, name, func(sctx context.Context, tx pgx.Tx) (int, error) {
				if err := bumpCalls(context.WithoutCancel(sctx), pool, ctx.RunID(), name); err != nil {
					return 0, err
				}
				if _, err := tx.Exec(sctx, `INSERT INTO reservations (run_id, note) VALUES ($1, $2)`, ctx.RunID(), name); err != nil {
					return 0, err
				}
				time.Sleep(20 * time.Millisecond)
				return i, nil
			}, nil)
		}
		return engine.All(ctx, fs)
	}, &engine.WorkflowOpts{MaxParallelSteps: 10})
	// kid writes its business row in a tx step (hanging before the commit
	// under envBlockKids); parent starts three kids and returns their
	// results in order.
	kid := engine.Define("crash-kid", func(ctx *engine.Context, i int) (int, error) {
		return engine.TxStep(ctx, "kid-work", func(sctx context.Context, tx pgx.Tx) (int, error) {
			if _, err := tx.Exec(sctx, `INSERT INTO reservations (run_id, note) VALUES ($1, $2)`, ctx.RunID(), fmt.Sprint("kid ", i)); err != nil {
				return 0, err
			}
			if os.Getenv(envBlockKids) == "1" {
				<-make(chan struct{}) // hold the transaction open until the test kills the worker
			}
			return i * i, nil
		}, nil)
	}, nil)
	parent := engine.Define("crash-parent", func(ctx *engine.Context, _ crashIn) ([]int, error) {
		var kids []*engine.ChildRun[int]
		for i := range 3 {
			c, err := engine.StartChild(ctx, kid, i, nil)
			if err != nil {
				return nil, err
			}
			kids = append(kids, c)
		}
		out := make([]int, len(kids))
		for i, c := range kids {
			v, err := c.Get(ctx)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	}, nil)
	// lostPar is lost's activity run as a parallel step; lostS2C a
	// parallel step allowed one attempt within a 4 s budget, which hangs
	// in a child with envBlockStep3.
	lostPar := engine.Define("crash-lost-par", func(ctx *engine.Context, in crashIn) (int, error) {
		return engine.GoActivity(ctx, "lost", func(sctx context.Context, _ *engine.ActivityAttempt) (int, error) {
			if err := bumpCalls(context.WithoutCancel(sctx), pool, ctx.RunID(), "lost"); err != nil {
				return 0, err
			}
			if calls := callsOf(sctx, pool, ctx.RunID(), "lost"); calls == 1 {
				return 0, errors.New("503")
			} else if calls == 2 && os.Getenv(envBlockStep3) == "1" {
				select {}
			}
			return 1, nil
		}, &engine.ActivityOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: 50 * time.Millisecond, MaximumAttempts: 2}}).Get(ctx)
	}, nil)
	lostS2C := engine.Define("crash-s2c-par", func(ctx *engine.Context, in crashIn) (int, error) {
		return engine.Go(ctx, "s2c", func(sctx context.Context) (int, error) {
			if err := bumpCalls(context.WithoutCancel(sctx), pool, ctx.RunID(), "s2c"); err != nil {
				return 0, err
			}
			if os.Getenv(envBlockStep3) == "1" {
				select {}
			}
			return 1, nil
		}, &engine.StepOpts{ScheduleToCloseTimeout: 4 * time.Second, RetryPolicy: &engine.RetryPolicy{MaximumAttempts: 1}}).Get(ctx)
	}, nil)
	// chain runs three tx steps that share one transaction, then a plain
	// step.
	chain := engine.Define("crash-tx-chain", func(ctx *engine.Context, in crashIn) (int, error) {
		for _, name := range []string{"r1", "r2", "r3"} {
			if _, err := engine.TxStep(ctx, name, func(sctx context.Context, tx pgx.Tx) (int, error) {
				if _, err := tx.Exec(sctx, `INSERT INTO reservations (run_id, note) VALUES ($1, $2)`, ctx.RunID(), name); err != nil {
					return 0, err
				}
				if err := bumpCalls(context.WithoutCancel(sctx), pool, ctx.RunID(), name); err != nil {
					return 0, err
				}
				if name == "r2" && os.Getenv(envBlockChain) == "1" {
					select {} // killed with r1 and r2 uncommitted
				}
				return 1, nil
			}, nil); err != nil {
				return 0, err
			}
		}
		return engine.Step(ctx, "after", func(sctx context.Context) (int, error) {
			if os.Getenv(envBlockChainAfter) == "1" {
				select {} // killed after the chain committed
			}
			return 3, bumpCalls(context.WithoutCancel(sctx), pool, ctx.RunID(), "after")
		}, nil)
	}, nil)
	return append(append([]engine.Registration{three, flaky, lost, tx, batch, fanout, kid, parent, lostPar, lostS2C, chain}, deadlineCrashWorkflows(pool)...),
		append(append(patchCrashWorkflows(pool), checkoutVersions()...), queuedCrashWorkflows(pool)...)...)
}

func createCallsTable(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(context.Background(),
		`CREATE TABLE step_calls (run_id uuid, step text, n int NOT NULL, pids int[] NOT NULL DEFAULT '{}', PRIMARY KEY (run_id, step));
		 CREATE TABLE reservations (run_id uuid NOT NULL, note text, created_at timestamptz NOT NULL DEFAULT now())`)
	require.NoError(t, err)
}

func bumpCalls(ctx context.Context, pool *pgxpool.Pool, runID uuid.UUID, step string) error {
	// pids: which processes made the calls, for a failure's message.
	_, err := pool.Exec(ctx, `INSERT INTO step_calls VALUES ($1, $2, 1, ARRAY[$3::int])
		ON CONFLICT (run_id, step) DO UPDATE SET n = step_calls.n + 1, pids = step_calls.pids || $3::int`, runID, step, os.Getpid())
	return err
}

func callsOf(ctx context.Context, pool *pgxpool.Pool, runID uuid.UUID, step string) int {
	var n int
	_ = pool.QueryRow(ctx, `SELECT coalesce(max(n), 0) FROM step_calls WHERE run_id = $1 AND step = $2`, runID, step).Scan(&n)
	return n
}

// callers is which processes called runID's step, in call order.
func callers(t *testing.T, pool *pgxpool.Pool, runID uuid.UUID, step string) []int32 {
	t.Helper()
	var pids []int32
	err := pool.QueryRow(context.Background(), `SELECT coalesce((SELECT pids FROM step_calls WHERE run_id = $1 AND step = $2), '{}')`, runID, step).Scan(&pids)
	require.NoError(t, err)
	return pids
}

func calls(t *testing.T, pool *pgxpool.Pool, runID uuid.UUID, step string) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), `SELECT coalesce(max(n), 0) FROM step_calls WHERE run_id = $1 AND step = $2`, runID, step).Scan(&n)
	require.NoError(t, err)
	return n
}

func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !within(d, cond) {
		t.Fatalf("timed out after %s waiting for %s", d, what)
	}
}

// within polls cond every 20ms and reports whether it held within d.
func within(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

func TestKilledWorkerRunFinishesOnAnotherWorker(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	createCallsTable(t, db.Pool)
	wfs := crashWorkflows(db.Pool)
	client := newEngine(t, db, nil, false, wfs...)
	ctx := testCtx(t)
	res, err := client.StartJSON(ctx, "crash-three", []byte(`{}`), nil)
	require.NoError(t, err)

	child := crashtest.StartWorker(t, db, 0, envBlockStep3+"=1") // default lease: 10 s
	eventually(t, 30*time.Second, "step 2 to be recorded", func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT count(*) FROM pgdurable.workflow_steps WHERE run_id = $1 AND seq = 1 AND status = 'completed'`), res.RunID).Scan(&n))
		return n == 1
	})
	crashtest.Kill(t, child)
	killedAt := time.Now()

	// Another worker, with default settings, takes the run over once the
	// dead worker's lease expires.
	worker := newEngine(t, db, nil, true, wfs...)
	run := waitStatus(t, worker, res.RunID, engine.StatusCompleted, 30*time.Second)
	took := time.Since(killedAt)
	t.Logf("run completed %s after the kill", took.Round(time.Millisecond))
	require.Less(t, took, 15*time.Second)
	require.Equal(t, 1, calls(t, db.Pool, res.RunID, "s1"))
	require.Equal(t, 1, calls(t, db.Pool, res.RunID, "s2"))
	require.Equal(t, 1, calls(t, db.Pool, res.RunID, "s3"))
	require.Equal(t, 2, run.Deliveries)
	require.JSONEq(t, `3`, string(run.Output))
}

func TestCrashLoopingRunIsParkedAndHealthyRunsComplete(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	createCallsTable(t, db.Pool)
	wfs := crashWorkflows(db.Pool)
	client := newEngine(t, db, nil, false, wfs...)
	ctx := testCtx(t)

	poison, err := client.StartJSON(ctx, "crash-three", []byte(`{"poison": true}`), nil)
	require.NoError(t, err)
	var healthy []uuid.UUID
	for range 100 {
		res, err := client.StartJSON(ctx, "crash-three", []byte(`{}`), nil)
		require.NoError(t, err)
		healthy = append(healthy, res.RunID)
	}

	// A supervisor restarts the worker each time the poison run kills it.
	var crashes atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			child := crashtest.StartWorker(t, db, time.Second)
			exited := make(chan struct{})
			go func() { _, _ = child.Process.Wait(); close(exited) }()
			select {
			case <-exited:
				crashes.Add(1)
			case <-stop:
				_ = child.Process.Kill()
				<-exited
				return
			}
		}
	})
	defer func() { close(stop); wg.Wait() }()

	run := waitStatus(t, client, poison.RunID, engine.StatusDead, 90*time.Second)
	require.Equal(t, engine.ClassCrashLoop, run.Error.Class)
	dj := openDeadJob(t, client, poison.RunID)
	require.Equal(t, "crash_loop", string(dj.Reason))
	require.Equal(t, 11, run.Deliveries, "10 crashed deliveries, then the 11th parks it")
	require.Equal(t, 11, dj.Deliveries, "the dead job carries the real deliveries")
	require.Equal(t, 10, dj.Attempts, "and the deliveries that died")
	for _, id := range healthy {
		waitStatus(t, client, id, engine.StatusCompleted, 30*time.Second)
	}
	crashesAtPark := crashes.Load()
	require.EqualValues(t, 10, crashesAtPark)
	time.Sleep(2 * time.Second)
	require.Equal(t, crashesAtPark, crashes.Load(), "no crashes once the poison run is parked")
}

// echoWorkflow is a one-step workflow that returns its input.
func echoWorkflow(name string) *engine.Workflow[int, int] {
	return engine.Define(name, func(ctx *engine.Context, in int) (int, error) {
		return engine.Step(ctx, "s", func(context.Context) (int, error) { return in, nil }, nil)
	}, nil)
}

// stallCounts reads a run's crash-loop counters.
func stallCounts(t *testing.T, db *enginetest.DB, runID uuid.UUID) (stalled, long int) {
	t.Helper()
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		db.SQL(`SELECT stalled_deliveries, long_stalled_deliveries FROM pgdurable.workflow_runs WHERE run_id = $1`), runID).Scan(&stalled, &long))
	return stalled, long
}

// A run whose delivery is the second in a row to die without progress is
// held back for a jittered delay before the next, instead of being
// redelivered with the other runs of the crashed worker; a run in its first
// crash is redelivered at once. The engine's clock is frozen, so the held
// run stays waiting until the test moves the clock past the bound.
func TestRepeatedCrashHoldsTheRunBackWithJitter(t *testing.T) {
	t.Parallel()
	wf := echoWorkflow("held")
	db := enginetest.NewDB(t)
	client := newEngine(t, db, nil, false, wf)
	ctx := testCtx(t)
	crashed := func(in, deliveries int) uuid.UUID {
		res, err := wf.Start(ctx, client, in, nil)
		require.NoError(t, err)
		// Its worker claimed it deliveries times in a row and died each time.
		_, err = db.Pool.Exec(ctx, `UPDATE `+db.RunTable("workflow_runs", res.RunID)+` SET status = 'running', owner_token = $3,
			lease_expires_at = now() - interval '1 second', deliveries = $2, stalled_deliveries = $2 WHERE run_id = $1`,
			res.RunID, deliveries, uuid.New())
		require.NoError(t, err)
		return res.RunID
	}
	first := crashed(1, 1)
	third := crashed(3, 3)
	_, err := db.Pool.Exec(ctx, `DELETE FROM pgdurable.river_job`) // the dead worker's tickets
	require.NoError(t, err)

	clock := enginetest.NewClock(time.Now())
	const lease = 2 * time.Second
	worker := newEngine(t, db, &engine.Config{Clock: clock, LeaseDuration: lease, SweepInterval: 20 * time.Millisecond}, true, wf)

	run := waitStatus(t, worker, first, engine.StatusCompleted, 10*time.Second)
	require.Equal(t, 2, run.Deliveries)

	held := waitStatus(t, worker, third, engine.StatusWaiting, 10*time.Second)
	require.NotNil(t, held.WakeAt)
	// stalled 3: up to lease × 2^(3-2).
	require.False(t, held.WakeAt.Before(clock.Now().Truncate(time.Microsecond)), "wake_at %s before the clock %s", held.WakeAt, clock.Now())
	require.False(t, held.WakeAt.After(clock.Now().Add(2*lease)), "wake_at %s beyond the bound", held.WakeAt)
	time.Sleep(200 * time.Millisecond)
	run, err = worker.GetRun(ctx, third)
	require.NoError(t, err)
	require.Equal(t, engine.StatusWaiting, run.Status, "not redelivered before its wake time")
	require.Equal(t, 3, run.Deliveries)

	clock.Advance(2 * lease)
	run = waitStatus(t, worker, third, engine.StatusCompleted, 10*time.Second)
	require.Equal(t, 4, run.Deliveries)
}

// Crash-loop attribution: a run is parked after MaxDeliveries deliveries in
// a row that died young (within their first lease, as a poison run kills
// its worker), or after 5 × MaxDeliveries that died at any age; a run whose
// stalled deliveries mostly lived long (a long step on a worker another
// run kept killing) is delivered again.
func TestCrashLoopParksOnYoungDeathsOrFiveTimesAsManyInAll(t *testing.T) {
	t.Parallel()
	wf := echoWorkflow("attributed")
	db := enginetest.NewDB(t)
	client := newEngine(t, db, nil, false, wf)
	ctx := testCtx(t)
	cases := []struct {
		stalled, long int
		parked        bool
	}{
		{stalled: 10, long: 0, parked: true},  // 10 young deaths
		{stalled: 9, long: 0, parked: false},  // 9 young deaths
		{stalled: 10, long: 1, parked: false}, // 9 young, 1 long
		{stalled: 49, long: 45, parked: false},
		{stalled: 50, long: 45, parked: true}, // 5 × MaxDeliveries in all
	}
	ids := make([]uuid.UUID, len(cases))
	for i, c := range cases {
		res, err := wf.Start(ctx, client, i, nil)
		require.NoError(t, err)
		ids[i] = res.RunID
		_, err = db.Pool.Exec(ctx, `UPDATE `+db.RunTable("workflow_runs", res.RunID)+` SET deliveries = $2, stalled_deliveries = $2, long_stalled_deliveries = $3 WHERE run_id = $1`,
			res.RunID, c.stalled, c.long)
		require.NoError(t, err)
	}
	worker := newEngine(t, db, nil, true, wf)
	for i, c := range cases {
		want := engine.StatusCompleted
		if c.parked {
			want = engine.StatusDead
		}
		run := waitStatus(t, worker, ids[i], want, 10*time.Second)
		if c.parked {
			require.Equal(t, engine.ClassCrashLoop, run.Error.Class, "%+v", c)
			require.Contains(t, run.Error.Message, fmt.Sprintf("%d consecutive deliveries", c.stalled))
		}
	}
}

// A delivery that lives a whole lease is counted as long-lived by its next
// heartbeat; the step's record, progress, resets the count.
func TestHeartbeatCountsALongLivedDelivery(t *testing.T) {
	t.Parallel()
	inStep := make(chan struct{})
	release := make(chan struct{})
	wf := engine.Define("long-step", func(ctx *engine.Context, _ int) (int, error) {
		if _, err := engine.Step(ctx, "long", func(context.Context) (int, error) {
			close(inStep)
			<-release
			return 1, nil
		}, nil); err != nil {
			return 0, err
		}
		return engine.Step(ctx, "after", func(context.Context) (int, error) { return 2, nil }, nil)
	}, nil)
	// 2 s: a loaded machine does not reach the mark before the first check.
	b := setup(t, &engine.Config{LeaseDuration: 2 * time.Second}, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	<-inStep
	counts := func() (stalled, long int) { return stallCounts(t, b.db, res.RunID) }
	stalled, long := counts()
	require.Equal(t, 1, stalled)
	require.Equal(t, 0, long, "young")
	eventually(t, 10*time.Second, "the delivery counted as long-lived", func() bool { _, long := counts(); return long == 1 })
	time.Sleep(time.Second) // more heartbeats: counted once
	stalled, long = counts()
	require.Equal(t, 1, stalled)
	require.Equal(t, 1, long)
	close(release)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 2, out)
	stalled, long = counts()
	require.Zero(t, stalled)
	require.Zero(t, long)
}

// A delivery handed back by a shutdown is not a crash: the hand-back undoes
// what the delivery added, its long-lived mark included (found by an attack
// pass: marks leaked and let a poison run crash more than MaxDeliveries times).
func TestHandBackUndoesItsLongLivedMark(t *testing.T) {
	t.Parallel()
	inStep := make(chan struct{}, 1)
	wf := engine.Define("handed-back", func(ctx *engine.Context, _ int) (int, error) {
		return engine.Step(ctx, "wait", func(sctx context.Context) (int, error) {
			select {
			case inStep <- struct{}{}:
			default:
			}
			<-sctx.Done()
			return 0, sctx.Err()
		}, nil)
	}, nil)
	db := enginetest.NewDB(t)
	cfg := &engine.Config{LeaseDuration: time.Second}
	ctx := testCtx(t)
	e1 := newEngine(t, db, cfg, true, wf)
	res, err := wf.Start(ctx, e1, 0, nil)
	require.NoError(t, err)
	for range 3 {
		<-inStep
		eventually(t, 10*time.Second, "the delivery counted as long-lived", func() bool { _, long := stallCounts(t, db, res.RunID); return long == 1 })
		require.NoError(t, e1.StopAndCancel(ctx))
		stalled, long := stallCounts(t, db, res.RunID)
		require.Zero(t, stalled, "a hand-back is not a stalled delivery")
		require.Zero(t, long)
		e1 = newEngine(t, db, cfg, true, wf)
	}
	require.NoError(t, e1.StopAndCancel(ctx))
}

func TestOnlyTheLeaseHolderRecordsAndTheLoserStops(t *testing.T) {
	t.Parallel()
	var bCalls, cCalls atomic.Int64
	inB := make(chan struct{})
	releaseA := make(chan struct{})
	wf := engine.Define("raced", func(ctx *engine.Context, in int) (string, error) {
		if _, err := engine.Step(ctx, "a", func(context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return "", err
		}
		b, err := engine.Step(ctx, "b", func(context.Context) (string, error) {
			if bCalls.Add(1) == 1 {
				close(inB)
				<-releaseA // delivery A is stuck (a GC pause, a partition) and ignores its context
				return "from-A", nil
			}
			return "from-B", nil
		}, nil)
		if err != nil {
			return "", err
		}
		return engine.Step(ctx, "c", func(context.Context) (string, error) { cCalls.Add(1); return b, nil }, nil)
	}, nil)
	// A long lease so only the test's expiry hands the run to delivery B.
	b := setup(t, &engine.Config{LeaseDuration: time.Hour, SweepInterval: 50 * time.Millisecond}, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 1, nil)
	require.NoError(t, err)
	<-inB

	// A's lease expires; the sweep gives the run to delivery B, which runs
	// b and c and completes it while A is still inside b.
	_, err = b.db.Pool.Exec(ctx, `UPDATE `+b.db.RunTable("workflow_runs", res.RunID)+` SET lease_expires_at = now() - interval '1 second' WHERE run_id = $1`, res.RunID)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "from-B", out)

	close(releaseA)
	time.Sleep(300 * time.Millisecond) // A returns from b, tries to record it, and must stop
	require.EqualValues(t, 2, bCalls.Load())
	require.EqualValues(t, 1, cCalls.Load(), "the loser never starts a further step")
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, run.Status)
	require.JSONEq(t, `"from-B"`, string(run.Steps[1].Output), "only the lease holder's record lands")
	require.Equal(t, 2, run.Deliveries)
}

// killAtAttempt starts workflow, lets a child worker run its step until
// the nth attempt starts (the child's envBlockStep3 makes it hang there),
// kills the child, and returns a worker engine that takes the run over.
func killAtAttempt(t *testing.T, workflow, step string, nth int) (*enginetest.DB, uuid.UUID, *engine.Engine) {
	t.Helper()
	db := enginetest.NewDB(t)
	createCallsTable(t, db.Pool)
	wfs := crashWorkflows(db.Pool)
	client := newEngine(t, db, nil, false, wfs...)
	res, err := client.StartJSON(testCtx(t), workflow, []byte(`{}`), nil)
	require.NoError(t, err)
	child := crashtest.StartWorker(t, db, time.Second, envBlockStep3+"=1")
	eventually(t, 30*time.Second, fmt.Sprintf("attempt %d to start", nth), func() bool { return calls(t, db.Pool, res.RunID, step) == nth })
	crashtest.Kill(t, child)
	return db, res.RunID, newEngine(t, db, &engine.Config{LeaseDuration: time.Second}, true, wfs...)
}

func TestAttemptsSurviveAWorkerCrash(t *testing.T) {
	t.Parallel()
	db, runID, worker := killAtAttempt(t, "crash-flaky", "flaky", 3)
	run := waitStatus(t, worker, runID, engine.StatusCompleted, 30*time.Second)
	// Two failed attempts were recorded before the crash, and the crashed
	// third counts too (it was announced before it ran): the retry after it
	// is attempt 4 of 4, not 1 or 3.
	require.Equal(t, 4, run.Steps[0].Attempts)
	require.Equal(t, 4, calls(t, db.Pool, runID, "flaky"))
	require.JSONEq(t, `4`, string(run.Output))
	// The step's history holds each failed attempt, the lost one with
	// class worker_lost.
	var got []string
	for _, f := range run.Steps[0].FailedAttempts {
		got = append(got, fmt.Sprintf("%d %s %s", f.Attempt, f.Status, f.Class))
	}
	require.Equal(t, []string{"1 retrying transient", "2 retrying transient", "3 retrying " + string(engine.ClassWorkerLost)}, got)
}

// An attempt that dies with its worker counts toward MaximumAttempts: a
// step allowed 2 attempts whose second is killed is parked after the crash,
// with the lost attempt recorded (class worker_lost), and never runs a
// third time (C12: attempt accounting is exact).
func TestAttemptKilledWithItsWorkerCountsTowardTheLimit(t *testing.T) {
	t.Parallel()
	db, runID, worker := killAtAttempt(t, "crash-lost", "lost", 2)
	run := waitStatus(t, worker, runID, engine.StatusDead, 30*time.Second)
	require.Equal(t, 2, run.Steps[0].Attempts)
	require.Equal(t, engine.ClassWorkerLost, run.Steps[0].Error.Class)
	require.ErrorIs(t, run.Error.Err(), engine.ErrWorkerLost)
	require.ErrorIs(t, run.Error.Err(), engine.ErrRetriesExhausted)
	dj := openDeadJob(t, worker, runID)
	require.Equal(t, engine.ReasonRetriesExhausted, dj.Reason)
	require.Equal(t, 2, dj.Attempts)
	require.Equal(t, 2, calls(t, db.Pool, runID, "lost"), "no third attempt")
	require.Len(t, run.Steps[0].FailedAttempts, 2)
	lostAttempt := run.Steps[0].FailedAttempts[1]
	require.Equal(t, 2, lostAttempt.Attempt)
	require.Equal(t, engine.StepParked, lostAttempt.Status)
	require.Equal(t, engine.ClassWorkerLost, lostAttempt.Class, "the lost attempt is in the step's history")
}

// A parallel step keeps the same accounting: its attempts are announced
// as a sequential step's are, so a GoActivity allowed 2 attempts whose
// second dies with its worker is parked after the crash (worker_lost)
// and never called a third time, and a Go step allowed one attempt with a
// ScheduleToCloseTimeout is not run again after its worker dies. Before
// (found by an attack pass), neither attempt counted: the activity was
// called a third time and the step ran twice, its budget restarted.
func TestParallelAttemptKilledWithItsWorkerCounts(t *testing.T) {
	t.Parallel()
	t.Run("activity", func(t *testing.T) {
		t.Parallel()
		db, runID, worker := killAtAttempt(t, "crash-lost-par", "lost", 2)
		run := waitStatus(t, worker, runID, engine.StatusDead, 30*time.Second)
		require.Equal(t, 2, run.Steps[0].Attempts)
		require.Equal(t, engine.ClassWorkerLost, run.Steps[0].Error.Class)
		require.Equal(t, 2, calls(t, db.Pool, runID, "lost"), "no third attempt")
	})
	t.Run("budgeted step", func(t *testing.T) {
		t.Parallel()
		db, runID, worker := killAtAttempt(t, "crash-s2c-par", "s2c", 1)
		run := waitStatus(t, worker, runID, engine.StatusFailed, 30*time.Second)
		require.Equal(t, engine.ClassWorkerLost, run.Steps[0].Error.Class)
		require.ErrorIs(t, run.Error.Err(), engine.ErrWorkerLost)
		require.Equal(t, 1, calls(t, db.Pool, runID, "s2c"), "its one attempt is not made again")
	})
}

// A process killed around a tx step's transaction — before its commit, or
// after it and before the next step — leaves the step's business row
// exactly once after another worker finishes the run.
// Tx steps that share a transaction are exactly once across a SIGKILL:
// killed in the second, the first (uncommitted with it) runs again; killed
// after the shared commit, none does. Every row is written once.
func TestChainedTxStepsAreExactlyOnceAcrossKills(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, env, killWhen string
		wantCalls           map[string]int
	}{
		{"mid-chain", envBlockChain, `SELECT count(*) FROM step_calls WHERE run_id = $1 AND step = 'r2'`,
			map[string]int{"r1": 2, "r2": 2, "r3": 1, "after": 1}},
		{"after-chain", envBlockChainAfter, `SELECT count(*) FROM pgdurable.workflow_steps WHERE run_id = $1 AND seq = 2 AND status = 'completed'`,
			map[string]int{"r1": 1, "r2": 1, "r3": 1, "after": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := enginetest.NewDB(t)
			createCallsTable(t, db.Pool)
			wfs := crashWorkflows(db.Pool)
			client := newEngine(t, db, nil, false, wfs...)
			ctx := testCtx(t)
			res, err := client.StartJSON(ctx, "crash-tx-chain", []byte(`{}`), nil)
			require.NoError(t, err)
			child := crashtest.StartWorker(t, db, time.Second, tc.env+"=1")
			eventually(t, 30*time.Second, "the kill point", func() bool {
				var n int
				require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(tc.killWhen), res.RunID).Scan(&n))
				return n == 1
			})
			var committed int
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM reservations WHERE run_id = $1`, res.RunID).Scan(&committed))
			crashtest.Kill(t, child)

			worker := newEngine(t, db, &engine.Config{LeaseDuration: time.Second}, true, wfs...)
			run := waitStatus(t, worker, res.RunID, engine.StatusCompleted, 30*time.Second)
			rows, err := db.Pool.Query(ctx, `SELECT note FROM reservations WHERE run_id = $1 ORDER BY note`, res.RunID)
			require.NoError(t, err)
			notes, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			require.Equal(t, []string{"r1", "r2", "r3"}, notes, "each business row exists exactly once")
			if tc.env == envBlockChain {
				require.Zero(t, committed, "nothing of the shared transaction was visible before the kill")
			}
			for step, want := range tc.wantCalls {
				require.Equal(t, want, calls(t, db.Pool, res.RunID, step), step)
			}
			require.JSONEq(t, `3`, string(run.Output))
		})
	}
}

func TestTxStepIsExactlyOnceAcrossKills(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, env string
		// killWhen: the state to wait for before the SIGKILL.
		killWhen         string
		wantReserveCalls int
	}{
		{"before-commit", envBlockInTx, `SELECT count(*) FROM step_calls WHERE run_id = $1 AND step = 'reserve'`, 2},
		{"after-commit", envBlockAfter, `SELECT count(*) FROM pgdurable.workflow_steps WHERE run_id = $1 AND seq = 0 AND status = 'completed'`, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := enginetest.NewDB(t)
			createCallsTable(t, db.Pool)
			wfs := crashWorkflows(db.Pool)
			client := newEngine(t, db, nil, false, wfs...)
			ctx := testCtx(t)
			res, err := client.StartJSON(ctx, "crash-tx", []byte(`{}`), nil)
			require.NoError(t, err)

			child := crashtest.StartWorker(t, db, time.Second, tc.env+"=1")
			eventually(t, 30*time.Second, "the kill point", func() bool {
				var n int
				require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(tc.killWhen), res.RunID).Scan(&n))
				return n == 1
			})
			crashtest.Kill(t, child)

			worker := newEngine(t, db, &engine.Config{LeaseDuration: time.Second}, true, wfs...)
			run := waitStatus(t, worker, res.RunID, engine.StatusCompleted, 30*time.Second)
			var rows int
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM reservations WHERE run_id = $1`, res.RunID).Scan(&rows))
			require.Equal(t, 1, rows, "the business row exists exactly once")
			require.Equal(t, tc.wantReserveCalls, calls(t, db.Pool, res.RunID, "reserve"))
			require.Equal(t, 1, calls(t, db.Pool, res.RunID, "after"))
			require.Equal(t, "tx", string(run.Steps[0].Kind))
			require.JSONEq(t, `2`, string(run.Output))
		})
	}
}
