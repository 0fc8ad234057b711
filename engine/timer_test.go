package engine_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

var clockStart = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// countRuns counts runs of db by status.
func countRuns(t *testing.T, db *enginetest.DB, status engine.RunStatus) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), db.SQL(`SELECT count(*) FROM pgdurable.workflow_runs WHERE status = $1`), status).Scan(&n))
	return n
}

func allStacks() string {
	buf := make([]byte, 8<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

// goroutines counts the process's goroutines, leaving out pgx's
// per-connection background readers: pgconn starts one while a query runs
// and it stays parked in a socket read on an idle pooled connection until
// data arrives (seen lingering past 30 s under load). They are bounded by
// the pool size, not by the runs, which is what the count is about.
func goroutines() int {
	n := 0
	for _, g := range strings.Split(allStacks(), "\n\n") {
		if !strings.Contains(g, "bgreader.(*BGReader).bgRead") {
			n++
		}
	}
	return n
}

// idleGoroutines waits for a started engine to settle — River's producer
// loops and its leader's maintenance services up, the count unchanged for
// 2 s — and returns its goroutine count (see goroutines).
func idleGoroutines(t *testing.T) int {
	t.Helper()
	eventually(t, 30*time.Second, "River's producer and maintenance services to start", func() bool {
		s := allStacks()
		return strings.Contains(s, "producer).fetchPollLoop") && strings.Contains(s, "maintenance.(*JobCleaner).Start")
	})
	last, same := -1, 0
	for same < 8 {
		time.Sleep(250 * time.Millisecond)
		if n := goroutines(); n == last {
			same++
		} else {
			last, same = n, 0
		}
	}
	return last
}

// 1,000 runs sleep an hour of a fake clock. While they sleep nothing holds
// them: no River job is running and the engine's goroutines are back to
// its idle count. A new engine (the first stopped) wakes them all once the
// clock moves past their wake time, and every step ran exactly once.
//
// Not parallel: it counts the process's goroutines.
func TestThousandSleepingRunsHoldNothingAndWakeAfterRestart(t *testing.T) {
	const n = 1000
	db := enginetest.NewDB(t)
	clock := enginetest.NewClock(clockStart)
	var mu sync.Mutex
	ran := map[string]int{}
	count := func(run uuid.UUID, step string) {
		mu.Lock()
		defer mu.Unlock()
		ran[run.String()+"/"+step]++
	}
	wf := engine.Define("sleeper", func(ctx *engine.Context, in int) (int, error) {
		if _, err := engine.Step(ctx, "before", func(context.Context) (int, error) { count(ctx.RunID(), "before"); return in, nil }, nil); err != nil {
			return 0, err
		}
		if err := engine.Sleep(ctx, time.Hour); err != nil {
			return 0, err
		}
		return engine.Step(ctx, "after", func(context.Context) (int, error) { count(ctx.RunID(), "after"); return in * 2, nil }, nil)
	}, nil)
	cfg := &engine.Config{Clock: clock, Logger: quiet}
	first := newEngine(t, db, cfg, true, wf)
	ctx := testCtx(t)
	idle := idleGoroutines(t)

	ids := make([]uuid.UUID, n)
	for i := range n {
		res, err := wf.Start(ctx, first, i, nil)
		require.NoError(t, err)
		ids[i] = res.RunID
	}
	eventually(t, 60*time.Second, "all runs to sleep", func() bool { return countRuns(t, db, engine.StatusWaiting) == n })
	// River marks a ticket completed in batches, just after its delivery ends.
	eventually(t, 10*time.Second, "no River job running", func() bool {
		var running int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgdurable.river_job WHERE state = 'running'`).Scan(&running))
		return running == 0
	})
	// A goroutine held per sleeping run would never go; the generous wait
	// is for pgx's and River's short-lived ones on a loaded machine.
	if !within(30*time.Second, func() bool { return goroutines() <= idle }) {
		t.Fatalf("goroutines: %d idle, %d with %d runs asleep after 30s:\n%s", idle, goroutines(), n, allStacks())
	}
	t.Logf("goroutines: %d idle, %d with %d runs asleep", idle, goroutines(), n)
	time.Sleep(time.Second) // several sweeps: nothing is due yet
	require.Equal(t, n, countRuns(t, db, engine.StatusWaiting))

	require.NoError(t, first.Stop(ctx))
	second := newEngine(t, db, cfg, true, wf)
	clock.Advance(time.Hour)
	eventually(t, 60*time.Second, "all runs to complete", func() bool { return countRuns(t, db, engine.StatusCompleted) == n })
	for i, id := range ids {
		out, err := wf.Result(ctx, second, id)
		require.NoError(t, err)
		require.Equal(t, i*2, out)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, ran, 2*n)
	for k, v := range ran {
		require.Equal(t, 1, v, k)
	}
}

// A run wakes at its time, not before: one second short of it the run still
// sleeps.
func TestSleepWakesAtItsTimeNotBefore(t *testing.T) {
	t.Parallel()
	clock := enginetest.NewClock(clockStart)
	wf := engine.Define("sleep-until", func(ctx *engine.Context, _ int) (time.Time, error) {
		if err := engine.SleepUntil(ctx, clockStart.Add(30*time.Minute)); err != nil {
			return time.Time{}, err
		}
		return engine.Now(ctx)
	}, nil)
	b := setup(t, &engine.Config{Clock: clock}, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	dueAfter(t, b.engine, clock, res.RunID, 30*time.Minute)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, clockStart.Add(30*time.Minute), out.UTC())
}

// dueAfter waits for runID to wait, moves clock to one second before d
// has passed, checks over several sweeps that the run still waits, then
// moves the last second.
func dueAfter(t *testing.T, e *engine.Engine, clock *enginetest.Clock, runID uuid.UUID, d time.Duration) {
	t.Helper()
	waitStatus(t, e, runID, engine.StatusWaiting, 10*time.Second)
	clock.Advance(d - time.Second)
	time.Sleep(time.Second) // sweeps run: not due yet
	run, err := e.GetRun(context.Background(), runID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusWaiting, run.Status, "woken before its time")
	clock.Advance(time.Second)
}

// Short sleeps wait in place; a wake time in the past returns at once; both
// are recorded, so the run's steps stay aligned on replay.
func TestShortAndPastSleepsAreRecorded(t *testing.T) {
	t.Parallel()
	wf := engine.Define("short-sleeps", func(ctx *engine.Context, _ int) (int, error) {
		if err := engine.Sleep(ctx, 50*time.Millisecond); err != nil {
			return 0, err
		}
		if err := engine.SleepUntil(ctx, time.Now().Add(-time.Hour)); err != nil {
			return 0, err
		}
		return engine.Step(ctx, "done", func(context.Context) (int, error) { return 1, nil }, nil)
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	start := time.Now()
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 1, out)
	require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Len(t, run.Steps, 3)
	require.Equal(t, []string{"sleep", "sleep", "step"}, []string{string(run.Steps[0].Kind), string(run.Steps[1].Kind), string(run.Steps[2].Kind)})
}

// Now and NewUUID are recorded: the delivery after a long sleep replays
// them and sees the values the first delivery saw.
func TestNowAndNewUUIDReplayTheSameValues(t *testing.T) {
	t.Parallel()
	clock := enginetest.NewClock(clockStart)
	type seen struct {
		Now  time.Time `json:"now"`
		UUID uuid.UUID `json:"uuid"`
	}
	var mu sync.Mutex
	var deliveries []seen
	wf := engine.Define("deterministic", func(ctx *engine.Context, _ int) (seen, error) {
		now, err := engine.Now(ctx)
		if err != nil {
			return seen{}, err
		}
		id, err := engine.NewUUID(ctx)
		if err != nil {
			return seen{}, err
		}
		mu.Lock()
		deliveries = append(deliveries, seen{now, id})
		mu.Unlock()
		if err := engine.Sleep(ctx, time.Hour); err != nil {
			return seen{}, err
		}
		return seen{now, id}, nil
	}, nil)
	b := setup(t, &engine.Config{Clock: clock}, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	waitStatus(t, b.engine, res.RunID, engine.StatusWaiting, 10*time.Second)
	clock.Advance(2 * time.Hour)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 20*time.Millisecond)
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, deliveries, 2)
	require.Equal(t, deliveries[0].UUID, deliveries[1].UUID)
	require.True(t, deliveries[0].Now.Equal(deliveries[1].Now))
	require.True(t, out.Now.Equal(clockStart))
	require.Equal(t, deliveries[0].UUID, out.UUID)
}

// A sleeping run that is cancelled wakes at once and runs its undos.
func TestCancelWakesASleepingRun(t *testing.T) {
	t.Parallel()
	var undone sync.WaitGroup
	undone.Add(1)
	wf := engine.Define("cancel-sleep", func(ctx *engine.Context, _ int) (int, error) {
		if _, err := engine.Step(ctx, "reserve", func(context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return 0, err
		}
		if err := ctx.Compensate(engine.Undo{Name: "release", Fn: func(context.Context, *engine.ActivityAttempt) error {
			undone.Done()
			return nil
		}}); err != nil {
			return 0, err
		}
		if err := engine.Sleep(ctx, 24*time.Hour); err != nil {
			return 0, err
		}
		return 1, nil
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	waitStatus(t, b.engine, res.RunID, engine.StatusWaiting, 10*time.Second)
	require.NoError(t, b.engine.Cancel(ctx, res.RunID))
	waitStatus(t, b.engine, res.RunID, engine.StatusCancelled, 10*time.Second)
	undone.Wait()
}

func ExampleSleep() {
	_ = engine.Define("reminder", func(ctx *engine.Context, email string) (string, error) {
		// The run waits a day with no goroutine, connection or worker held.
		if err := engine.Sleep(ctx, 24*time.Hour); err != nil {
			return "", err
		}
		return engine.Step(ctx, "send", func(context.Context) (string, error) {
			return fmt.Sprintf("reminded %s", email), nil
		}, nil)
	}, nil)
}

// A wake time PostgreSQL cannot store is refused at the call, clearly,
// instead of failing every delivery's write until the run crash-loops
// (found by an attack pass).
func TestSleepUntilBeyondYear9999IsRefused(t *testing.T) {
	t.Parallel()
	wf := engine.Define("far-future", func(ctx *engine.Context, _ int) (string, error) {
		err := engine.SleepUntil(ctx, time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC))
		if errors.Is(err, engine.ErrInvalidArgument) {
			return err.Error(), nil
		}
		return "", err
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 20*time.Millisecond)
	require.NoError(t, err)
	require.Contains(t, out, "after 9999-12-31")
}
