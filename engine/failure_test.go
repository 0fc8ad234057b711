package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
)

// waitStatus polls until the run reaches status.
func waitStatus(t *testing.T, e *engine.Engine, runID uuid.UUID, status engine.RunStatus, within time.Duration) *engine.Run {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		run, err := e.GetRun(context.Background(), runID)
		require.NoError(t, err)
		if run.Status == status {
			return run
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s is %s after %s, want %s (error %+v)", runID, run.Status, within, status, run.Error)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func openDeadJob(t *testing.T, e *engine.Engine, runID uuid.UUID) *engine.DeadJob {
	t.Helper()
	jobs, _, err := e.ListDeadJobs(context.Background(), engine.ListDeadJobsParams{OpenOnly: true, RunID: runID})
	require.NoError(t, err)
	require.Len(t, jobs, 1, "open dead jobs of run %s", runID)
	require.Equal(t, runID, jobs[0].RunID)
	return jobs[0]
}

// attemptLog records when each attempt of a step started.
type attemptLog struct {
	mu    sync.Mutex
	times []time.Time
}

func (l *attemptLog) add() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.times = append(l.times, time.Now())
	return len(l.times)
}

func (l *attemptLog) gaps() []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []time.Duration
	for i := 1; i < len(l.times); i++ {
		out = append(out, l.times[i].Sub(l.times[i-1]))
	}
	return out
}

func TestTransientFailuresRetryWithBackoff(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		policy engine.RetryPolicy
	}{
		// Backoffs under MaxInlineBackoff wait in place.
		{"inline", engine.RetryPolicy{InitialInterval: 150 * time.Millisecond, BackoffCoefficient: 2}},
		// Longer ones end the delivery; the sweep wakes the run when due.
		{"suspended", engine.RetryPolicy{InitialInterval: 1200 * time.Millisecond, BackoffCoefficient: 1.5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var log attemptLog
			wf := engine.Define("flaky", func(ctx *engine.Context, in order) (string, error) {
				return engine.Step(ctx, "call", func(context.Context) (string, error) {
					if log.add() <= 2 {
						return "", errors.New("503 service unavailable")
					}
					return "ok", nil
				}, &engine.StepOpts{RetryPolicy: &tc.policy})
			}, nil)
			b := setup(t, nil, wf)
			ctx := testCtx(t)
			res, err := wf.Start(ctx, b.engine, order{ID: "f"}, nil)
			require.NoError(t, err)
			out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
			require.NoError(t, err)
			require.Equal(t, "ok", out)

			run, err := b.engine.GetRun(ctx, res.RunID)
			require.NoError(t, err)
			require.Equal(t, 3, run.Steps[0].Attempts)
			gaps := log.gaps()
			require.Len(t, gaps, 2)
			full := tc.policy
			full.MaximumInterval = time.Minute
			for i, g := range gaps {
				require.GreaterOrEqual(t, g, full.Interval(i+1), "gap %d", i+1)
			}
		})
	}
}

func TestRetriesExhaustedParksRunAndReplayFinishesIt(t *testing.T) {
	t.Parallel()
	var fixed atomic.Bool
	var aCalls, bCalls, cCalls atomic.Int64
	wf := engine.Define("fragile", func(ctx *engine.Context, in order) (string, error) {
		a, err := engine.Step(ctx, "a", func(context.Context) (string, error) { aCalls.Add(1); return "A", nil }, nil)
		if err != nil {
			return "", err
		}
		b, err := engine.Step(ctx, "b", func(context.Context) (string, error) {
			bCalls.Add(1)
			if !fixed.Load() {
				return "", errors.New("connection refused")
			}
			return "B", nil
		}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: 10 * time.Millisecond, MaximumAttempts: 3}})
		if err != nil {
			return "", err
		}
		c, err := engine.Step(ctx, "c", func(context.Context) (string, error) { cCalls.Add(1); return "C", nil }, nil)
		return a + b + c, err
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)

	res, err := wf.Start(ctx, b.engine, order{ID: "r", Amount: 1}, &engine.StartOpts{WorkflowID: "fragile-1"})
	require.NoError(t, err)
	run := waitStatus(t, b.engine, res.RunID, engine.StatusDead, 20*time.Second)
	require.Equal(t, "retries_exhausted", string(openDeadJob(t, b.engine, res.RunID).Reason))
	require.EqualValues(t, 3, bCalls.Load(), "MaximumAttempts counts every attempt")
	require.Equal(t, "parked", string(run.Steps[1].Status))

	dj := openDeadJob(t, b.engine, res.RunID)
	require.Equal(t, "b", dj.StepName)
	require.Equal(t, 1, *dj.Seq)
	require.Equal(t, 3, dj.Attempts)
	require.Equal(t, engine.ClassTransient, dj.ErrorClass)
	require.Contains(t, dj.ErrorMessage, "connection refused")
	require.Equal(t, "fragile-1", dj.WorkflowID)
	require.JSONEq(t, `{"id": "r", "amount": 1}`, string(dj.Input))
	require.Equal(t, 1, dj.WorkflowVersion)
	require.False(t, dj.FirstFailedAt.After(dj.LastFailedAt))

	// The "code fix" ships; two operators replay at once: one enqueue.
	fixed.Store(true)
	jobsBefore := riverJobs(t, b, res.RunID)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			_, err := b.engine.ReplayDeadJob(ctx, dj.ID, &engine.ResolveOpts{By: "alice", Note: "upstream fixed"})
			require.NoError(t, err)
		})
	}
	wg.Wait()
	require.Equal(t, jobsBefore+1, riverJobs(t, b, res.RunID))

	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "ABC", out)
	require.EqualValues(t, 1, aCalls.Load(), "a completed before the park and is not run again")
	require.EqualValues(t, 4, bCalls.Load())
	require.EqualValues(t, 1, cCalls.Load())

	resolved, err := b.engine.GetDeadJob(ctx, dj.ID)
	require.NoError(t, err)
	require.Equal(t, "replayed", resolved.Resolution)
	require.Equal(t, "alice", resolved.ResolvedBy)
	require.Equal(t, "upstream fixed", resolved.Note)
	require.NotNil(t, resolved.ResolvedAt)
	_, err = b.engine.DiscardDeadJob(ctx, dj.ID, nil)
	require.ErrorIs(t, err, engine.ErrDeadJobResolved)
	_, err = b.engine.ReplayDeadJob(ctx, uuid.New(), nil)
	require.ErrorIs(t, err, engine.ErrNotFound)
}

// riverJobs counts delivery tickets ever inserted for a run (test-only read
// of River's table).
func riverJobs(t *testing.T, b *bundle, runID uuid.UUID) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		"SELECT count(*) FROM pgdurable.river_job WHERE args->>'run_id' = $1", runID.String()).Scan(&n))
	return n
}

func TestPanicParksRunWhileOthersComplete(t *testing.T) {
	t.Parallel()
	type in struct {
		Poison bool `json:"poison"`
		N      int  `json:"n"`
	}
	wf := engine.Define("maybe-panic", func(ctx *engine.Context, in in) (int, error) {
		return engine.Step(ctx, "work", func(context.Context) (int, error) {
			if in.Poison {
				var m map[string]int
				//lint:ignore SA5000 the test needs a runtime panic
				m["boom"] = 1 // nil map write: a runtime panic
			}
			return in.N, nil
		}, nil)
	}, nil)
	wfPanicInWorkflow := engine.Define("workflow-panic", func(ctx *engine.Context, in int) (int, error) {
		panic("bug in workflow code")
	}, nil)
	b := setup(t, nil, wf, wfPanicInWorkflow)
	ctx := testCtx(t)

	poison, err := wf.Start(ctx, b.engine, in{Poison: true}, nil)
	require.NoError(t, err)
	wfPoison, err := wfPanicInWorkflow.Start(ctx, b.engine, 1, nil)
	require.NoError(t, err)
	var healthy []uuid.UUID
	for i := range 50 {
		res, err := wf.Start(ctx, b.engine, in{N: i}, nil)
		require.NoError(t, err)
		healthy = append(healthy, res.RunID)
	}
	for i, id := range healthy {
		out, err := wf.Wait(ctx, b.engine, id, 10*time.Millisecond)
		require.NoError(t, err)
		require.Equal(t, i, out)
	}
	run := waitStatus(t, b.engine, poison.RunID, engine.StatusDead, 10*time.Second)
	require.Equal(t, engine.ClassPanic, run.Error.Class)
	dj := openDeadJob(t, b.engine, poison.RunID)
	require.Equal(t, "panic", string(dj.Reason))
	require.Equal(t, "work", dj.StepName)
	require.Equal(t, 1, dj.Attempts, "a panic is permanent: no retry")
	require.Contains(t, dj.ErrorMessage, "nil map")
	require.Contains(t, dj.Stack, "failure_test.go", "the stack points at the panicking line")

	waitStatus(t, b.engine, wfPoison.RunID, engine.StatusDead, 10*time.Second)
	dj = openDeadJob(t, b.engine, wfPoison.RunID)
	require.Equal(t, "panic", string(dj.Reason))
	require.Contains(t, dj.ErrorMessage, "bug in workflow code")
	require.NotEmpty(t, dj.Stack)
}

func TestPoisonInputParksAfterOneDelivery(t *testing.T) {
	t.Parallel()
	type v1 struct {
		Amount int `json:"amount"`
	}
	type v2 struct {
		Amount string `json:"amount"` // a deploy changed the input type
	}
	old := engine.Define("charge", func(ctx *engine.Context, in v1) (int, error) { return in.Amount, nil }, nil)
	next := engine.Define("charge", func(ctx *engine.Context, in v2) (string, error) { return in.Amount, nil }, nil)
	b := setup(t, nil, next)
	ctx := testCtx(t)
	client := newEngine(t, b.db, nil, false, old)

	res, err := old.Start(ctx, client, v1{Amount: 5}, nil)
	require.NoError(t, err)
	run := waitStatus(t, b.engine, res.RunID, engine.StatusDead, 10*time.Second)
	require.Equal(t, engine.ClassPoisonInput, run.Error.Class)
	dj := openDeadJob(t, b.engine, res.RunID)
	require.Equal(t, "poison_input", string(dj.Reason))
	require.Contains(t, dj.ErrorMessage, "amount")
	time.Sleep(500 * time.Millisecond) // long enough for any retry loop to show
	run, err = b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, 1, run.Deliveries)
}

func TestRenamedStepParksAsNonDeterministic(t *testing.T) {
	t.Parallel()
	retry := &engine.RetryPolicy{InitialInterval: 1500 * time.Millisecond}
	v1 := engine.Define("renamed", func(ctx *engine.Context, in int) (int, error) {
		if _, err := engine.Step(ctx, "reserve", func(context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return 0, err
		}
		return engine.Step(ctx, "charge", func(context.Context) (int, error) { return 0, errors.New("timeout") }, &engine.StepOpts{RetryPolicy: retry})
	}, nil)
	v2 := engine.Define("renamed", func(ctx *engine.Context, in int) (int, error) {
		if _, err := engine.Step(ctx, "reserve_inventory", func(context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return 0, err
		}
		return engine.Step(ctx, "charge", func(context.Context) (int, error) { return 2, nil }, nil)
	}, nil)
	b := setup(t, nil, v1)
	ctx := testCtx(t)
	res, err := v1.Start(ctx, b.engine, 1, nil)
	require.NoError(t, err)
	// v1 records "reserve", fails "charge" once and waits 1.5 s for the retry.
	waitStatus(t, b.engine, res.RunID, engine.StatusWaiting, 10*time.Second)
	require.NoError(t, b.engine.StopAndCancel(ctx))

	// The deploy renames the step under the waiting run.
	e2 := newEngine(t, b.db, nil, true, v2)
	waitStatus(t, e2, res.RunID, engine.StatusDead, 10*time.Second)
	dj := openDeadJob(t, e2, res.RunID)
	require.Equal(t, "nondeterminism", string(dj.Reason))
	require.Equal(t, 0, *dj.Seq)
	require.Contains(t, dj.ErrorMessage, `"reserve"`)
	require.Contains(t, dj.ErrorMessage, `"reserve_inventory"`)
}

func TestUnserializableStepOutputFailsOnceAndIsCatchable(t *testing.T) {
	t.Parallel()
	var charges, nested atomic.Int64
	wf := engine.Define("unserializable", func(ctx *engine.Context, in int) (string, error) {
		_, err := engine.Step(ctx, "charge", func(context.Context) (float64, error) {
			charges.Add(1) // the side effect happened; it must not be repeated
			return math.NaN(), nil
		}, nil)
		var se *engine.StepError
		if !errors.As(err, &se) || se.Class != engine.ClassUnserializable {
			return "", fmt.Errorf("want an unserializable StepError, got %v", err)
		}
		_, err = engine.Step(ctx, "nul", func(context.Context) (string, error) { return "a\x00b", nil }, nil)
		if !errors.As(err, &se) || se.Class != engine.ClassUnserializable {
			return "", fmt.Errorf("want an unserializable StepError for NUL, got %v", err)
		}
		_, err = engine.Step(ctx, "outer", func(context.Context) (int, error) {
			_, err := engine.Step(ctx, "inner", func(context.Context) (int, error) { nested.Add(1); return 1, nil }, nil)
			return 0, engine.Permanent(err)
		}, nil)
		if err == nil || !strings.Contains(err.Error(), "cannot nest") {
			return "", fmt.Errorf("want a nesting error, got %v", err)
		}
		return "fallback", nil
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 1, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "fallback", out)
	require.EqualValues(t, 1, charges.Load())
	require.Zero(t, nested.Load())
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, "failed", string(run.Steps[0].Status))
	require.Equal(t, engine.ClassUnserializable, run.Steps[0].Error.Class)
	require.Equal(t, 1, run.Deliveries)

	_, err = b.engine.StartJSON(ctx, "unserializable", []byte(`"x\u0000"`), nil)
	require.ErrorIs(t, err, engine.ErrInvalidInput)
}

func TestDiscardDeadJobClosesItAndKeepsRunDead(t *testing.T) {
	t.Parallel()
	wf := engine.Define("always-fails", func(ctx *engine.Context, in int) (int, error) {
		return engine.Step(ctx, "x", func(context.Context) (int, error) { return 0, errors.New("nope") },
			&engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: time.Millisecond, MaximumAttempts: 1}})
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 1, nil)
	require.NoError(t, err)
	waitStatus(t, b.engine, res.RunID, engine.StatusDead, 10*time.Second)
	dj := openDeadJob(t, b.engine, res.RunID)
	got, err := b.engine.DiscardDeadJob(ctx, dj.ID, &engine.ResolveOpts{By: "bob", Note: "duplicate order"})
	require.NoError(t, err)
	require.Equal(t, "discarded", got.Resolution)
	again, err := b.engine.DiscardDeadJob(ctx, dj.ID, nil)
	require.NoError(t, err, "discarding twice is idempotent")
	require.Equal(t, "bob", again.ResolvedBy)
	_, err = b.engine.ReplayDeadJob(ctx, dj.ID, nil)
	require.ErrorIs(t, err, engine.ErrDeadJobResolved)
	open, _, err := b.engine.ListDeadJobs(ctx, engine.ListDeadJobsParams{OpenOnly: true})
	require.NoError(t, err)
	require.Empty(t, open)
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusDead, run.Status)
}

// ReplayDeadJob and DiscardDeadJob given the ID of a run with no open
// dead job name the run's status, as Cancel and Terminate do: ErrRunClosed
// for a finished run (a completed one, a dead one whose dead job was
// discarded), ErrRunNotFinished for one still running. An ID that is
// neither a dead job's nor a run's stays ErrNotFound. Before, every one
// of these was "dead job not found".
func TestResolvingADeadJobByARunWithoutOneNamesTheRunsStatus(t *testing.T) {
	t.Parallel()
	done := echoWorkflow("resolve-done")
	waits := engine.Define("resolve-waits", func(ctx *engine.Context, _ int) (int, error) {
		return engine.AwaitSignal[int](ctx, "never", 0)
	}, nil)
	fails := engine.Define("resolve-fails", func(ctx *engine.Context, _ int) (int, error) {
		return engine.Step(ctx, "x", func(context.Context) (int, error) { return 0, errors.New("nope") },
			&engine.StepOpts{RetryPolicy: &engine.RetryPolicy{MaximumAttempts: 1}})
	}, nil)
	b := setup(t, nil, done, waits, fails)
	ctx := testCtx(t)
	completed, err := done.Start(ctx, b.engine, 1, nil)
	require.NoError(t, err)
	waitStatus(t, b.engine, completed.RunID, engine.StatusCompleted, 10*time.Second)
	waiting, err := waits.Start(ctx, b.engine, 1, nil)
	require.NoError(t, err)
	waitStatus(t, b.engine, waiting.RunID, engine.StatusWaiting, 10*time.Second)
	dead, err := fails.Start(ctx, b.engine, 1, nil)
	require.NoError(t, err)
	waitStatus(t, b.engine, dead.RunID, engine.StatusDead, 10*time.Second)
	_, err = b.engine.DiscardDeadJob(ctx, openDeadJob(t, b.engine, dead.RunID).ID, nil)
	require.NoError(t, err)

	for _, c := range []struct {
		runID  uuid.UUID
		want   error
		status engine.RunStatus
	}{
		{completed.RunID, engine.ErrRunClosed, engine.StatusCompleted},
		{dead.RunID, engine.ErrRunClosed, engine.StatusDead},
		{waiting.RunID, engine.ErrRunNotFinished, engine.StatusWaiting},
	} {
		_, err := b.engine.ReplayDeadJob(ctx, c.runID, nil)
		require.ErrorIs(t, err, c.want, c.status)
		require.NotErrorIs(t, err, engine.ErrNotFound, c.status)
		require.ErrorContains(t, err, fmt.Sprintf("run %s is %s and has no open dead job to replay", c.runID, c.status))
		_, err = b.engine.DiscardDeadJob(ctx, c.runID, nil)
		require.ErrorIs(t, err, c.want, c.status)
		require.ErrorContains(t, err, fmt.Sprintf("run %s is %s and has no open dead job to discard", c.runID, c.status))
	}
	_, err = b.engine.ReplayDeadJob(ctx, uuid.New(), nil)
	require.ErrorIs(t, err, engine.ErrNotFound, "a truly unknown ID")
	_, err = b.engine.DiscardDeadJob(ctx, uuid.New(), nil)
	require.ErrorIs(t, err, engine.ErrNotFound)
}

// A run's ID given for its own open dead job is not found (the IDs differ),
// and the error names the dead job to use instead: a new user replayed by
// the run ID over HTTP and got a bare 404.
func TestResolvingADeadJobByItsRunsIDNamesTheDeadJob(t *testing.T) {
	t.Parallel()
	fails := engine.Define("resolve-by-run", func(ctx *engine.Context, _ int) (int, error) {
		return engine.Step(ctx, "x", func(context.Context) (int, error) { return 0, errors.New("nope") },
			&engine.StepOpts{RetryPolicy: &engine.RetryPolicy{MaximumAttempts: 1}})
	}, nil)
	b := setup(t, nil, fails)
	ctx := testCtx(t)
	dead, err := fails.Start(ctx, b.engine, 1, nil)
	require.NoError(t, err)
	waitStatus(t, b.engine, dead.RunID, engine.StatusDead, 10*time.Second)
	job := openDeadJob(t, b.engine, dead.RunID)
	_, err = b.engine.ReplayDeadJob(ctx, dead.RunID, nil)
	require.ErrorIs(t, err, engine.ErrNotFound)
	require.ErrorContains(t, err, fmt.Sprintf("that is a run's ID, and its open dead job is %s", job.ID))
	_, err = b.engine.DiscardDeadJob(ctx, dead.RunID, nil)
	require.ErrorContains(t, err, job.ID.String())
	_, err = b.engine.ReplayDeadJob(ctx, job.ID, nil)
	require.NoError(t, err, "the named ID works")
}
