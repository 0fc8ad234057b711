package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
)

// A loop of 1,000 iterations, each a run of one step that continues as new
// with the next count: every run holds only its own step (its replay loads
// one record), 1,000 runs are continued, each naming the next, the
// workflow ID resolves to the last, and Wait on the first run follows the
// chain to the last run's result.
func TestContinueAsNewLoopKeepsEachRunsHistoryToItsOwnSteps(t *testing.T) {
	t.Parallel()
	const iterations = 1000
	loop := engine.Define("can-loop", func(ctx *engine.Context, n int) (int, error) {
		next, err := engine.Step(ctx, "tick", func(context.Context) (int, error) { return n + 1, nil }, nil)
		if err != nil {
			return 0, err
		}
		if next < iterations {
			return 0, engine.ContinueAsNew(ctx, next)
		}
		return next, nil
	}, nil)
	b := setup(t, nil, loop)
	// 1,000 runs one after another: on a Citus cluster beside the
	// package's other tests they took over the usual 60 s.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := loop.Start(ctx, b.engine, 0, &engine.StartOpts{WorkflowID: "the-loop"})
	require.NoError(t, err)
	out, err := loop.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, iterations, out)

	var runs, continued, completed, maxSteps, minSteps int
	require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`
		SELECT count(*), count(*) FILTER (WHERE status = 'continued'), count(*) FILTER (WHERE status = 'completed'),
		       max(steps), min(steps)
		FROM (SELECT r.status, (SELECT count(*) FROM pgdurable.workflow_steps s WHERE s.run_id = r.run_id) AS steps
		      FROM pgdurable.workflow_runs r WHERE workflow_id = 'the-loop') x`)).Scan(&runs, &continued, &completed, &maxSteps, &minSteps))
	require.Equal(t, iterations, runs)
	require.Equal(t, iterations-1, continued)
	require.Equal(t, 1, completed)
	require.Equal(t, 1, maxSteps, "each run records only its own step")
	require.Equal(t, 1, minSteps)

	latest, err := b.engine.FindRun(ctx, "the-loop")
	require.NoError(t, err)
	run, err := b.engine.GetRun(ctx, latest)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, run.Status)
	require.JSONEq(t, "999", string(run.Input))
	first, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusContinued, first.Status)
	require.NotNil(t, first.ContinuedRunID)
	second, err := b.engine.GetRun(ctx, *first.ContinuedRunID)
	require.NoError(t, err)
	require.JSONEq(t, "1", string(second.Input))
	require.Equal(t, "the-loop", second.WorkflowID)
}

// Signals a run had not consumed when it continued as new reach the new
// run, and a signal sent by workflow ID reaches the latest run; a start
// with the workflow ID finds the latest run, not a new one.
func TestContinueAsNewCarriesSignalsAndTheWorkflowID(t *testing.T) {
	t.Parallel()
	wf := engine.Define("can-signals", func(ctx *engine.Context, round int) ([]string, error) {
		got, err := engine.AwaitSignal[string](ctx, "msg", 0)
		if err != nil {
			return nil, err
		}
		if round == 0 {
			return nil, engine.ContinueAsNew(ctx, 1)
		}
		second, err := engine.AwaitSignal[string](ctx, "msg", 0)
		if err != nil {
			return nil, err
		}
		return []string{got, second}, nil
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, &engine.StartOpts{WorkflowID: "chat"})
	require.NoError(t, err)
	// Three signals at once: the first run takes one, the other two move on.
	for _, m := range []string{"a", "b", "c"} {
		require.NoError(t, b.engine.Signal(ctx, "chat", "msg", m, nil))
	}
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, []string{"b", "c"}, out)
	again, err := wf.Start(ctx, b.engine, 1, &engine.StartOpts{WorkflowID: "chat"})
	require.NoError(t, err)
	require.True(t, again.Existing, "the workflow ID names the latest run of the chain")
	require.NotEqual(t, res.RunID, again.RunID)
	retried, err := wf.Start(ctx, b.engine, 0, &engine.StartOpts{WorkflowID: "chat"})
	require.NoError(t, err, "the chain's first start, retried, is the same start")
	require.True(t, retried.Existing)
	require.Equal(t, again.RunID, retried.RunID)
	_, err = wf.Start(ctx, b.engine, 7, &engine.StartOpts{WorkflowID: "chat"})
	require.ErrorIs(t, err, engine.ErrWorkflowIDConflict)
}

// A cancellation requested before a run continues wins: the run
// compensates and ends cancelled, and no new run starts.
func TestCancelBeatsContinueAsNew(t *testing.T) {
	t.Parallel()
	wf := engine.Define("can-cancel", func(ctx *engine.Context, n int) (int, error) {
		if _, err := engine.AwaitSignal[int](ctx, "next", 0); err != nil {
			return 0, err
		}
		return 0, engine.ContinueAsNew(ctx, n+1)
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, &engine.StartOpts{WorkflowID: "can-cancel-1"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		run, err := b.engine.GetRun(ctx, res.RunID)
		require.NoError(t, err)
		return run.Status == engine.StatusWaiting
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, b.engine.Cancel(ctx, res.RunID))
	_, err = wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.ErrorIs(t, err, engine.ErrCancelled)
	var n int
	require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT count(*) FROM pgdurable.workflow_runs`)).Scan(&n))
	require.Equal(t, 1, n)
}

// ContinueAsNew with an input that does not decode as the workflow's input
// is refused where it is called.
func TestContinueAsNewRefusesAnInputOfTheWrongType(t *testing.T) {
	t.Parallel()
	type in struct {
		N int `json:"n"`
	}
	wf := engine.Define("can-type", func(ctx *engine.Context, _ in) (string, error) {
		err := engine.ContinueAsNew(ctx, "not an object")
		if !errors.Is(err, engine.ErrInvalidInput) {
			return "", fmt.Errorf("want ErrInvalidInput, got %v", err)
		}
		return "refused", nil
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, in{}, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "refused", out)
}

// A child that continues as new shows in its parent's run view once, at
// its latest run, with its chain's first run (the run ID the parent's
// record and ChildRun.RunID hold); a child that never continued has no
// FirstRunID. Before, every run of the chain was listed at the child's
// position: a child looping 1,000 times filled the list.
func TestParentListsAContinuedChildOnceAtItsLatestRun(t *testing.T) {
	t.Parallel()
	const loops = 5
	kid := engine.Define("chain-kid", func(ctx *engine.Context, n int) (int, error) {
		if n < loops {
			return 0, engine.ContinueAsNew(ctx, n+1)
		}
		return n, nil
	}, nil)
	var firstRun atomic.Value
	parent := engine.Define("chain-parent", func(ctx *engine.Context, _ int) (int, error) {
		looped, err := engine.StartChild(ctx, kid, 0, nil)
		if err != nil {
			return 0, err
		}
		firstRun.Store(looped.RunID())
		n, err := looped.Get(ctx)
		if err != nil {
			return 0, err
		}
		once, err := engine.ChildWorkflow(ctx, kid, loops, nil) // no continue-as-new
		return n + once, err
	}, nil)
	b := setup(t, nil, parent, kid)
	ctx := testCtx(t)
	res, err := parent.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	waitStatus(t, b.engine, res.RunID, engine.StatusCompleted, 30*time.Second)

	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Len(t, run.Children, 2, "one entry per child, not one per run of a chain: %+v", run.Children)
	chain, single := run.Children[0], run.Children[1]
	first := firstRun.Load().(uuid.UUID)
	require.Equal(t, 0, chain.Seq)
	require.NotEqual(t, first, chain.RunID, "the chain is shown at its latest run")
	require.Equal(t, engine.StatusCompleted, chain.Status)
	require.NotNil(t, chain.FirstRunID)
	require.Equal(t, first, *chain.FirstRunID, "with a link to the chain's first run")
	latest, err := b.engine.GetRun(ctx, chain.RunID)
	require.NoError(t, err)
	require.Nil(t, latest.ContinuedRunID, "the listed run is the chain's last")
	require.Equal(t, first, *latest.FirstRunID)
	require.Equal(t, 1, single.Seq)
	require.Nil(t, single.FirstRunID, "a child that did not continue has no chain")
	require.Equal(t, engine.StatusCompleted, single.Status)
}
