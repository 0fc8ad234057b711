package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/activities"
	"github.com/pgdurable/pgdurable/compensation"
	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/internal/crashtest"
)

// Ten steps started with Go run at once (each sleeps 200 ms; together they
// take well under 2 s), All returns their results in call order, and each
// is recorded at its position.
func TestGoRunsStepsInParallelAndAllKeepsCallOrder(t *testing.T) {
	t.Parallel()
	wf := engine.Define("fan-ten", func(ctx *engine.Context, _ int) ([]int, error) {
		fs := make([]*engine.Future[int], 10)
		for i := range fs {
			fs[i] = engine.Go(ctx, fmt.Sprint("p", i), func(context.Context) (int, error) {
				time.Sleep(time.Duration(10-i) * 20 * time.Millisecond) // later calls finish first
				return i * i, nil
			}, nil)
		}
		return engine.All(ctx, fs)
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	start := time.Now()
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, []int{0, 1, 4, 9, 16, 25, 36, 49, 64, 81}, out)
	require.Less(t, time.Since(start), 2*time.Second, "the steps ran in parallel")
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Len(t, run.Steps, 10)
	for i, s := range run.Steps {
		require.Equal(t, i, s.Seq)
		require.Equal(t, fmt.Sprint("p", i), s.Name)
		require.JSONEq(t, fmt.Sprint(i*i), string(s.Output))
	}
}

// MaxParallelSteps bounds the steps running at once; sequential steps mix
// with parallel ones, and a replay (a later delivery, after a sleep that
// ends the first) runs none of the recorded ones again.
func TestParallelStepsAreBoundedAndReplayed(t *testing.T) {
	t.Parallel()
	var running, peak, calls atomic.Int64
	wf := engine.Define("fan-bounded", func(ctx *engine.Context, _ int) (int, error) {
		first, err := engine.Step(ctx, "first", func(context.Context) (int, error) { calls.Add(1); return 1, nil }, nil)
		if err != nil {
			return 0, err
		}
		fs := make([]*engine.Future[int], 40)
		for i := range fs {
			fs[i] = engine.Go(ctx, "work", func(context.Context) (int, error) {
				calls.Add(1)
				n := running.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				time.Sleep(10 * time.Millisecond)
				running.Add(-1)
				return 1, nil
			}, nil)
		}
		vals, err := engine.All(ctx, fs)
		if err != nil {
			return 0, err
		}
		if err := engine.Sleep(ctx, 2*time.Second); err != nil { // ends this delivery: the next replays
			return 0, err
		}
		total := first
		for _, v := range vals {
			total += v
		}
		return total, nil
	}, &engine.WorkflowOpts{MaxParallelSteps: 4})
	b := setup(t, &engine.Config{SweepInterval: 50 * time.Millisecond}, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 41, out)
	require.LessOrEqual(t, peak.Load(), int64(4))
	require.Equal(t, int64(4), peak.Load(), "the bound was used")
	require.EqualValues(t, 41, calls.Load(), "the replay ran no recorded step again")
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, 2, run.Deliveries)
}

// A parallel step's failure is recorded and returned by Get (a permanent
// one at once, a transient one once its retries end), the same on replay;
// a panic parks the run.
func TestParallelStepFailuresAreReturnedAndPanicsPark(t *testing.T) {
	t.Parallel()
	var flaky atomic.Int64
	wf := engine.Define("fan-fail", func(ctx *engine.Context, _ int) (string, error) {
		bad := engine.Go(ctx, "bad", func(context.Context) (int, error) { return 0, engine.Permanent(errors.New("declined")) }, nil)
		retried := engine.Go(ctx, "retried", func(context.Context) (int, error) {
			flaky.Add(1)
			return 0, errors.New("503")
		}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: time.Millisecond, MaximumAttempts: 3}})
		_, err1 := bad.Get(ctx)
		_, err2 := retried.Get(ctx)
		var se *engine.StepError
		if !errors.As(err1, &se) || se.Class != engine.ClassPermanent || !errors.Is(err2, engine.ErrRetriesExhausted) {
			return "", fmt.Errorf("unexpected: %v / %v", err1, err2)
		}
		return "handled", nil
	}, nil)
	panics := engine.Define("fan-panic", func(ctx *engine.Context, _ int) (int, error) {
		f := engine.Go(ctx, "boom", func(context.Context) (int, error) { panic("bad code") }, nil)
		return f.Get(ctx)
	}, nil)
	b := setup(t, nil, wf, panics)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "handled", out)
	require.EqualValues(t, 3, flaky.Load())

	pres, err := panics.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	waitStatus(t, b.engine, pres.RunID, engine.StatusDead, 10*time.Second)
	dead, _, err := b.engine.ListDeadJobs(ctx, engine.ListDeadJobsParams{})
	require.NoError(t, err)
	require.NotEmpty(t, dead)
	require.Equal(t, engine.ReasonPanic, dead[0].Reason)
}

// A future the workflow never waits for is cancelled when the workflow
// function returns, and waited for: nothing of it is written after the run
// ended.
func TestUnawaitedParallelStepIsCancelledWhenTheWorkflowReturns(t *testing.T) {
	t.Parallel()
	started, stopped := make(chan struct{}), make(chan error, 1)
	wf := engine.Define("fan-forgotten", func(ctx *engine.Context, _ int) (string, error) {
		engine.Go(ctx, "forgotten", func(sctx context.Context) (int, error) {
			close(started)
			<-sctx.Done()
			stopped <- context.Cause(sctx)
			return 0, sctx.Err()
		}, nil)
		return engine.Step(ctx, "after", func(context.Context) (string, error) { <-started; return "done", nil }, nil)
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "done", out)
	require.Error(t, <-stopped)
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Len(t, run.Steps, 1, "only the awaited step is recorded")
	require.Equal(t, "after", run.Steps[0].Name)
}

// 100 parallel tx steps, the worker SIGKILLed mid-fan-out: every step's
// row is written exactly once, the steps recorded before the kill never run
// again, and the result is in call order.
func TestKillMidFanOutRunsEachParallelStepOnce(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	createCallsTable(t, db.Pool)
	ctx := testCtx(t)
	child := crashtest.StartWorker(t, db, 2*time.Second, crashtest.EnvWorkerStarts+"=crash-fanout:1")
	eventually(t, 60*time.Second, "30 parallel steps recorded", func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT count(*) FROM pgdurable.workflow_steps WHERE status = 'completed'`)).Scan(&n))
		return n >= 30
	})
	crashtest.Kill(t, child)
	recorded := map[string]int{}
	rows, err := db.Pool.Query(ctx, db.SQL(`SELECT s.name, coalesce(c.n, 0) FROM pgdurable.workflow_steps s
		LEFT JOIN step_calls c ON c.run_id = s.run_id AND c.step = s.name WHERE s.status = 'completed'`))
	require.NoError(t, err)
	for rows.Next() {
		var name string
		var n int
		require.NoError(t, rows.Scan(&name, &n))
		recorded[name] = n
	}
	require.NoError(t, rows.Err())
	require.Less(t, len(recorded), 100, "killed mid-fan-out")
	t.Logf("killed with %d of 100 parallel steps recorded", len(recorded))

	newEngine(t, db, &engine.Config{LeaseDuration: 2 * time.Second, SweepInterval: 100 * time.Millisecond}, true, crashWorkflows(db.Pool)...)
	var runID string
	require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT run_id::text FROM pgdurable.workflow_runs`)).Scan(&runID))
	eventually(t, 60*time.Second, "the run to complete", func() bool {
		var status string
		require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT status FROM pgdurable.workflow_runs`)).Scan(&status))
		return status == "completed"
	})
	for name, before := range recorded {
		require.Equal(t, before, calls(t, db.Pool, uuid.MustParse(runID), name), "%s was recorded before the kill: it never ran again", name)
	}
	var rowsPerStep, distinct int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT note) FROM reservations`).Scan(&rowsPerStep, &distinct))
	require.Equal(t, 100, rowsPerStep, "each parallel tx step's row once")
	require.Equal(t, 100, distinct)
	var output []int
	require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT output FROM pgdurable.workflow_runs`)).Scan(&output))
	for i, v := range output {
		require.Equal(t, i, v)
	}
	require.Len(t, output, 100)
}

// A run cancelled after a delivery left a parallel step unrecorded (a hole)
// below recorded ones ends cancelled with its undo run once: the cancelled
// replay keeps the hole's position, so the later steps replay at theirs and
// the undo takes the position after the last of them. Before, the hole's
// position was given back, everything after it shifted, and the run was
// parked as nondeterministic (found by an attack pass).
func TestCancelledRunWithAnUnrecordedParallelStepCompensates(t *testing.T) {
	t.Parallel()
	for _, withUndo := range []bool{true, false} {
		t.Run(fmt.Sprint("undo=", withUndo), func(t *testing.T) {
			t.Parallel()
			var undos atomic.Int64
			wf := engine.Define(fmt.Sprint("hole-cancel-", withUndo), func(ctx *engine.Context, _ int) (int, error) {
				if _, err := engine.Step(ctx, "s0", func(context.Context) (int, error) { return 1, nil }, nil); err != nil {
					return 0, err
				}
				if withUndo {
					if err := ctx.Compensate(engine.Undo{Name: "u0", Fn: func(context.Context, *engine.ActivityAttempt) error {
						undos.Add(1)
						return nil
					}}); err != nil {
						return 0, err
					}
				}
				a := engine.Go(ctx, "a", func(sctx context.Context) (int, error) { <-sctx.Done(); return 0, sctx.Err() }, nil)
				b := engine.Go(ctx, "b", func(context.Context) (int, error) { return 2, nil }, nil)
				if _, err := b.Get(ctx); err != nil {
					return 0, err
				}
				if err := engine.Sleep(ctx, time.Hour); err != nil { // waits in place while a runs
					return 0, err
				}
				return a.Get(ctx)
			}, nil)
			db := enginetest.NewDB(t)
			first := newEngine(t, db, nil, true, wf)
			ctx := testCtx(t)
			res, err := wf.Start(ctx, first, 0, nil)
			require.NoError(t, err)
			var seqs []int
			eventually(t, 10*time.Second, "the sleep's start to be written", func() bool {
				run, err := first.GetRun(ctx, res.RunID)
				require.NoError(t, err)
				seqs = seqs[:0]
				for _, s := range run.Steps {
					seqs = append(seqs, s.Seq)
				}
				return len(seqs) == 3
			})
			// The delivery ends with a unrecorded (a stop cancels it): a
			// hole at 1.
			stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			require.NoError(t, first.StopAndCancel(stopCtx))
			require.Equal(t, []int{0, 2, 3}, seqs, "a hole at a's position")
			require.NoError(t, first.Cancel(ctx, res.RunID))
			b := &bundle{db: db, engine: newEngine(t, db, nil, true, wf)}
			_, err = wf.Wait(ctx, b.engine, res.RunID, 20*time.Millisecond)
			require.ErrorIs(t, err, engine.ErrCancelled)
			run, err := b.engine.GetRun(ctx, res.RunID)
			require.NoError(t, err)
			require.Equal(t, engine.StatusCancelled, run.Status)
			if withUndo {
				require.EqualValues(t, 1, undos.Load())
				last := run.Steps[len(run.Steps)-1]
				require.Equal(t, "u0", last.Name)
				require.Equal(t, 4, last.Seq, "the undo follows the last recorded step")
			}
		})
	}
}

// Undos of parallel steps (compensation.Go) are registered as the steps
// complete and run newest first by completion, not by call: six steps
// finishing in reverse call order are undone in call order. A step that
// never completed registers none. One undo's retry ends the delivery
// mid-compensation; the next delivery replays the undos in the same order
// from the records and the run ends compensated.
func TestParallelUndosRunNewestFirstByCompletion(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var undone []int
	var tries atomic.Int64
	wf := engine.Define("fan-saga", func(ctx *engine.Context, _ int) (int, error) {
		saga := compensation.New(ctx)
		fs := make([]*engine.Future[int], 6)
		// The last called completes first: each step returns a while after
		// the one called after it has (a fixed sleep each had swapped two
		// neighbours when their goroutines started late on a loaded machine).
		returned := make([]chan struct{}, len(fs)+1)
		for i := range returned {
			returned[i] = make(chan struct{})
		}
		close(returned[len(fs)])
		for i := range fs {
			fs[i] = compensation.Go(saga, fmt.Sprint("book", i), func(context.Context) (int, error) {
				<-returned[i+1]
				time.Sleep(100 * time.Millisecond)
				close(returned[i])
				return i, nil
			}, compensation.Undo[int]{Name: fmt.Sprint("unbook", i), Fn: func(_ context.Context, _ activities.Call, r int) error {
				if r == 2 && tries.Add(1) == 1 {
					return errors.New("503") // retried after 1.5 s: the delivery ends and the next replays
				}
				mu.Lock()
				undone = append(undone, r)
				mu.Unlock()
				return nil
			}, RetryPolicy: &engine.RetryPolicy{InitialInterval: 1500 * time.Millisecond, BackoffCoefficient: 1}}, nil)
		}
		stuck := compensation.Go(saga, "stuck", func(sctx context.Context) (int, error) {
			<-sctx.Done()
			return 0, sctx.Err()
		}, compensation.Undo[int]{Name: "unstuck", Fn: func(context.Context, activities.Call, int) error {
			mu.Lock()
			undone = append(undone, -1)
			mu.Unlock()
			return nil
		}}, nil)
		_ = stuck
		if _, err := engine.All(ctx, fs); err != nil {
			return 0, err
		}
		_, err := engine.Step(ctx, "pay", func(context.Context) (int, error) { return 0, engine.Permanent(errors.New("declined")) }, nil)
		return 0, err
	}, nil)
	b := setup(t, &engine.Config{SweepInterval: 50 * time.Millisecond}, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	_, err = wf.Wait(ctx, b.engine, res.RunID, 20*time.Millisecond)
	var runErr *engine.RunError
	require.ErrorAs(t, err, &runErr)
	require.Equal(t, engine.StatusCompensated, runErr.Status)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int{0, 1, 2, 3, 4, 5}, undone, "newest first by completion; the stuck step registered nothing")
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.GreaterOrEqual(t, run.Deliveries, 2, "the undo's retry ended a delivery mid-compensation")
}

// Parallel activities get a request ID stored before their first attempt
// and the same on every retry; an activity that exhausts its retries parks
// the run (its attempts may have taken effect) unless ReturnExhausted
// hands the failure to Get.
func TestGoActivityKeepsItsRequestIDAcrossRetries(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	seen := map[string][]uuid.UUID{}
	quick := &engine.RetryPolicy{InitialInterval: 10 * time.Millisecond, MaximumAttempts: 3}
	wf := engine.Define("go-activities", func(ctx *engine.Context, exhaust bool) ([]string, error) {
		fs := make([]*engine.Future[string], 4)
		for i := range fs {
			name := fmt.Sprint("call", i)
			fs[i] = engine.GoActivity(ctx, name, func(_ context.Context, a *engine.ActivityAttempt) (string, error) {
				mu.Lock()
				seen[name] = append(seen[name], a.RequestID)
				mu.Unlock()
				if i == 3 {
					return "", errors.New("503")
				}
				if a.Attempt < 2 {
					return "", errors.New("flaky")
				}
				return name, nil
			}, &engine.ActivityOpts{RetryPolicy: quick, ReturnExhausted: !exhaust})
		}
		out, err := engine.All(ctx, fs[:3])
		if err != nil {
			return nil, err
		}
		if _, err := fs[3].Get(ctx); err == nil || !errors.Is(err, engine.ErrRetriesExhausted) {
			return nil, fmt.Errorf("want the exhausted failure, got %v", err)
		}
		return out, nil
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, false, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, []string{"call0", "call1", "call2"}, out)
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	for i := range 4 {
		ids := seen[fmt.Sprint("call", i)]
		require.GreaterOrEqual(t, len(ids), 2)
		for _, id := range ids {
			require.Equal(t, ids[0], id, "one request ID for every attempt")
		}
		require.Equal(t, engine.KindActivity, run.Steps[i].Kind)
		require.Equal(t, ids[0], *run.Steps[i].RequestID)
	}

	res, err = wf.Start(ctx, b.engine, true, nil)
	require.NoError(t, err)
	_, err = wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	var runErr *engine.RunError
	require.ErrorAs(t, err, &runErr)
	require.Equal(t, engine.StatusDead, runErr.Status)
	jobs, _, err := b.engine.ListDeadJobs(ctx, engine.ListDeadJobsParams{})
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	require.Equal(t, engine.ReasonRetriesExhausted, jobs[0].Reason)
	require.Equal(t, "call3", jobs[0].StepName)
}

// A parallel activity that panics parks the run at once with reason panic,
// as a sequential one does; it is not retried as a transient failure
// (found by a fresh-user pass).
func TestGoActivityPanicParksTheRun(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	wf := engine.Define("go-activity-panic", func(ctx *engine.Context, _ int) (int, error) {
		return engine.GoActivity(ctx, "kaboom", func(context.Context, *engine.ActivityAttempt) (int, error) {
			calls.Add(1)
			panic("kaboom")
		}, nil).
			Get(ctx)
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	_, err = wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	var runErr *engine.RunError
	require.ErrorAs(t, err, &runErr)
	require.Equal(t, engine.StatusDead, runErr.Status)
	jobs, _, err := b.engine.ListDeadJobs(ctx, engine.ListDeadJobsParams{RunID: res.RunID})
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	require.Equal(t, engine.ReasonPanic, jobs[0].Reason)
	require.Equal(t, int64(1), calls.Load())
}
