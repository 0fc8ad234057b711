package engine_test

import (
	"context"
	"errors"
	"fmt"
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

// A parent starts three children, each waiting for a signal, and gets
// their results: it suspends while they run (waiting, no worker), each
// child's end wakes it, and its records hold each child's run ID and
// result; the run view lists the children and each child names its parent.
func TestChildWorkflowsReturnTheirResultsToTheParent(t *testing.T) {
	t.Parallel()
	child := engine.Define("child-echo", func(ctx *engine.Context, in int) (int, error) {
		n, err := engine.AwaitSignal[int](ctx, "go", 0)
		if err != nil {
			return 0, err
		}
		return in*10 + n, nil
	}, nil)
	var parentCalls atomic.Int64
	parent := engine.Define("child-parent", func(ctx *engine.Context, _ int) ([]int, error) {
		parentCalls.Add(1)
		var kids []*engine.ChildRun[int]
		for i := range 3 {
			c, err := engine.StartChild(ctx, child, i, nil)
			if err != nil {
				return nil, err
			}
			kids = append(kids, c)
		}
		var out []int
		for _, c := range kids {
			v, err := c.Get(ctx)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	}, nil)
	b := setup(t, nil, parent, child)
	ctx := testCtx(t)
	res, err := parent.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)

	// The parent waits for its first child; the children wait for "go".
	require.Eventually(t, func() bool {
		run, err := b.engine.GetRun(ctx, res.RunID)
		return err == nil && run.Status == engine.StatusWaiting && len(run.Children) == 3
	}, 10*time.Second, 10*time.Millisecond)
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, []int{0}, run.AwaitChildren)
	for i, c := range run.Children {
		require.Equal(t, i, c.Seq)
		require.Equal(t, fmt.Sprintf("%s:%d", res.RunID, i), c.WorkflowID)
		require.Equal(t, engine.ParentCloseCancel, c.ParentClosePolicy)
		require.Equal(t, "child-echo", c.WorkflowName)
		require.Equal(t, engine.KindChild, run.Steps[i].Kind)
		require.Equal(t, engine.StepStarted, run.Steps[i].Status)
		require.Equal(t, c.RunID, *run.Steps[i].RequestID)
		kid, err := b.engine.GetRun(ctx, c.RunID)
		require.NoError(t, err)
		require.Equal(t, res.RunID, *kid.ParentRunID)
		require.Equal(t, i, *kid.ParentSeq)
	}
	// Signal the children last to first: the parent wakes once its first
	// child ends and finds the other two ended.
	for i := 2; i >= 0; i-- {
		require.NoError(t, b.engine.Signal(ctx, run.Children[i].RunID.String(), "go", i+1, nil))
	}
	out, err := parent.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, []int{1, 12, 23}, out)
	run, err = b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	for i := range 3 {
		require.Equal(t, engine.StepCompleted, run.Steps[i].Status)
		require.JSONEq(t, fmt.Sprint(i*10+i+1), string(run.Steps[i].Output))
		require.Equal(t, engine.StatusCompleted, run.Children[i].Status)
	}
	require.LessOrEqual(t, parentCalls.Load(), int64(3), "the parent is woken by its first child, not polled")
}

// A child that fails, one that is cancelled and one that dies come back to
// the parent as *ChildError with the child's status and error, the same
// on replay. A dead child first parks its parent (an operator may replay
// it); discarding the child's dead job and replaying the parent's hands
// the parent the child's death.
func TestChildFailuresComeBackAsChildError(t *testing.T) {
	t.Parallel()
	child := engine.Define("child-fails", func(ctx *engine.Context, mode string) (int, error) {
		switch mode {
		case "fail":
			_, err := engine.Step(ctx, "boom", func(context.Context) (int, error) {
				return 0, engine.Permanent(errors.New("card declined"))
			}, nil)
			return 0, err
		case "dead":
			_, err := engine.Step(ctx, "panic", func(context.Context) (int, error) { panic("kaput") }, nil)
			return 0, err
		}
		_, err := engine.AwaitSignal[int](ctx, "never", 0)
		return 0, err
	}, nil)
	type outcome struct {
		Status  []string `json:"status"`
		Cancel  bool     `json:"cancel"`
		StepErr bool     `json:"step_err"`
	}
	var eng *engine.Engine // the closure's: set once the engine exists
	parent := engine.Define("child-failures", func(ctx *engine.Context, _ int) (outcome, error) {
		var o outcome
		for _, mode := range []string{"fail", "dead", "wait"} {
			c, err := engine.StartChild(ctx, child, mode, nil)
			if err != nil {
				return o, err
			}
			if mode == "wait" {
				// Cancel it from inside a step: the engine is in the closure.
				if _, err := engine.Step(ctx, "cancel-child", func(sctx context.Context) (int, error) {
					return 0, eng.Cancel(sctx, c.RunID())
				}, nil); err != nil {
					return o, err
				}
			}
			_, err = c.Get(ctx)
			var ce *engine.ChildError
			if !errors.As(err, &ce) {
				return o, fmt.Errorf("want a ChildError, got %v", err)
			}
			o.Status = append(o.Status, string(ce.Status))
			if mode == "wait" {
				o.Cancel = errors.Is(err, engine.ErrCancelled)
			}
			if mode == "fail" {
				var se *engine.StepError
				o.StepErr = errors.As(err, &se) && se.Step == "boom"
			}
		}
		// A later step ends this delivery and the next replays the records.
		if err := engine.Sleep(ctx, 2*time.Second); err != nil {
			return o, err
		}
		return o, nil
	}, nil)
	b := setup(t, nil, parent, child)
	eng = b.engine
	ctx := testCtx(t)
	res, err := parent.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	waitStatus(t, b.engine, res.RunID, engine.StatusDead, 10*time.Second)
	job := openDeadJob(t, b.engine, res.RunID)
	require.Equal(t, engine.ReasonChildDead, job.Reason)
	_, err = b.engine.DiscardDeadJob(ctx, *job.ChildDeadJobID, nil)
	require.NoError(t, err)
	_, err = b.engine.ReplayDeadJob(ctx, job.ID, nil)
	require.NoError(t, err)
	out, err := parent.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, outcome{Status: []string{"failed", "dead", "cancelled"}, Cancel: true, StepErr: true}, out)
}

// Cancelling a parent cancels its running children; they compensate,
// then the parent does (its child is undone before its own earlier step),
// and the parent ends cancelled.
func TestCancellingAParentCancelsAndCompensatesItsChildren(t *testing.T) {
	t.Parallel()
	child := engine.Define("child-saga", func(ctx *engine.Context, in int) (int, error) {
		if _, err := engine.TxStep(ctx, "reserve", func(sctx context.Context, tx pgx.Tx) (int, error) {
			_, err := tx.Exec(sctx, `INSERT INTO child_log (what) VALUES ($1)`, fmt.Sprint("reserve ", in))
			return 0, err
		}, nil); err != nil {
			return 0, err
		}
		if err := ctx.Compensate(engine.Undo{Name: "release", Tx: func(uctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(uctx, `INSERT INTO child_log (what) VALUES ($1)`, fmt.Sprint("release ", in))
			return err
		}}); err != nil {
			return 0, err
		}
		_, err := engine.AwaitSignal[int](ctx, "never", 0)
		return 0, err
	}, nil)
	parent := engine.Define("child-saga-parent", func(ctx *engine.Context, _ int) (int, error) {
		if _, err := engine.TxStep(ctx, "book", func(sctx context.Context, tx pgx.Tx) (int, error) {
			_, err := tx.Exec(sctx, `INSERT INTO child_log (what) VALUES ('book')`)
			return 0, err
		}, nil); err != nil {
			return 0, err
		}
		if err := ctx.Compensate(engine.Undo{Name: "unbook", Tx: func(uctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(uctx, `INSERT INTO child_log (what) VALUES ('unbook')`)
			return err
		}}); err != nil {
			return 0, err
		}
		var kids []*engine.ChildRun[int]
		for i := range 3 {
			c, err := engine.StartChild(ctx, child, i, nil)
			if err != nil {
				return 0, err
			}
			kids = append(kids, c)
		}
		sum := 0
		for _, c := range kids {
			v, err := c.Get(ctx)
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	}, nil)
	b := setup(t, nil, parent, child)
	ctx := testCtx(t)
	_, err := b.db.Pool.Exec(ctx, `CREATE TABLE child_log (id bigserial PRIMARY KEY, what text NOT NULL)`)
	require.NoError(t, err)
	res, err := parent.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		run, err := b.engine.GetRun(ctx, res.RunID)
		if err != nil || run.Status != engine.StatusWaiting || len(run.Children) != 3 {
			return false
		}
		for _, c := range run.Children {
			if c.Status != engine.StatusWaiting {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, b.engine.Cancel(ctx, res.RunID))
	_, err = parent.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.ErrorIs(t, err, engine.ErrCancelled)

	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, run.Status)
	for _, c := range run.Children {
		require.Equal(t, engine.StatusCancelled, c.Status, "child %d", c.Seq)
		require.Equal(t, engine.StepCancelled, run.Steps[c.Seq].Status, "the parent recorded how its child ended")
	}
	rows, err := b.db.Pool.Query(ctx, `SELECT what FROM child_log ORDER BY id`)
	require.NoError(t, err)
	log, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, log, 8)
	require.Equal(t, "book", log[0])
	require.ElementsMatch(t, []string{"reserve 0", "reserve 1", "reserve 2"}, log[1:4])
	require.ElementsMatch(t, []string{"release 0", "release 1", "release 2"}, log[4:7])
	require.Equal(t, "unbook", log[7], "the parent's undo runs after its children's")
}

// The worker of a parent and its three children is SIGKILLed while the
// children are inside their tx steps (the parent waiting for them): a new
// engine finishes the children, each child was started once and wrote
// its row once, and the parent completes with all three results in order.
func TestKillWhileChildrenRunParentCompletesWithAllResults(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	createCallsTable(t, db.Pool)
	ctx := testCtx(t)
	worker := crashtest.StartWorker(t, db, 2*time.Second, crashtest.EnvWorkerStarts+"=crash-parent:1", envBlockKids+"=1")
	eventually(t, 60*time.Second, "three children inside their tx steps", func() bool {
		var running, waiting int
		require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT count(*) FILTER (WHERE parent_run_id IS NOT NULL AND status = 'running'),
			count(*) FILTER (WHERE parent_run_id IS NULL AND status = 'waiting') FROM pgdurable.workflow_runs`)).Scan(&running, &waiting))
		var inTx int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'idle in transaction'`).Scan(&inTx))
		return running == 3 && waiting == 1 && inTx >= 3
	})
	crashtest.Kill(t, worker)

	newEngine(t, db, &engine.Config{LeaseDuration: 2 * time.Second, SweepInterval: 100 * time.Millisecond}, true, crashWorkflows(db.Pool)...)
	var parentID uuid.UUID
	require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT run_id FROM pgdurable.workflow_runs WHERE parent_run_id IS NULL`)).Scan(&parentID))
	eventually(t, 60*time.Second, "the parent to complete", func() bool {
		var status string
		require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT status FROM pgdurable.workflow_runs WHERE run_id = $1`), parentID).Scan(&status))
		return status == "completed"
	})
	var output []int
	require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT output FROM pgdurable.workflow_runs WHERE run_id = $1`), parentID).Scan(&output))
	require.Equal(t, []int{0, 1, 4}, output)
	var children, rows, distinct int
	require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT count(*) FROM pgdurable.workflow_runs WHERE parent_run_id = $1`), parentID).Scan(&children))
	require.Equal(t, 3, children, "each child started once")
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT note) FROM reservations`).Scan(&rows, &distinct))
	require.Equal(t, 3, rows, "each child's tx step committed once")
	require.Equal(t, 3, distinct)
}

// Parent-close policies: when the parent completes, its cancel child is
// cancelled, its abandon child keeps running, and the parent stays open
// (waiting) until its wait child ends, then completes with the output its
// function returned.
func TestParentClosePolicies(t *testing.T) {
	t.Parallel()
	child := engine.Define("close-kid", func(ctx *engine.Context, _ string) (string, error) {
		return engine.AwaitSignal[string](ctx, "finish", 0)
	}, nil)
	parent := engine.Define("close-parent", func(ctx *engine.Context, _ int) (string, error) {
		for _, p := range []engine.ParentClosePolicy{engine.ParentCloseCancel, engine.ParentCloseAbandon, engine.ParentCloseWait} {
			if _, err := engine.StartChild(ctx, child, string(p), &engine.ChildOpts{WorkflowID: "kid-" + string(p), ParentClosePolicy: p}); err != nil {
				return "", err
			}
		}
		return "parent done", nil
	}, nil)
	b := setup(t, nil, parent, child)
	ctx := testCtx(t)
	res, err := parent.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	status := func(id string) engine.RunStatus {
		runID, err := b.engine.FindRun(ctx, id)
		require.NoError(t, err)
		run, err := b.engine.GetRun(ctx, runID)
		require.NoError(t, err)
		return run.Status
	}
	require.Eventually(t, func() bool {
		return status(res.RunID.String()) == engine.StatusWaiting && status("kid-cancel") == engine.StatusCancelled &&
			status("kid-abandon") == engine.StatusWaiting
	}, 10*time.Second, 10*time.Millisecond, "the parent waits for its wait child; its cancel child is cancelled; its abandon child waits")
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, []int{2}, run.AwaitChildren)

	require.NoError(t, b.engine.Signal(ctx, "kid-wait", "finish", "ok", nil))
	out, err := parent.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "parent done", out)
	require.Equal(t, engine.StatusCompleted, status("kid-wait"))
	require.Equal(t, engine.StatusWaiting, status("kid-abandon"), "an abandoned child outlives its parent")
	run, err = b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StepCompleted, run.Steps[2].Status, "the wait child's outcome is recorded")
}

// A child workflow ID held by another run fails StartChild with
// ErrWorkflowIDConflict, recorded (no child run, a replay fails alike);
// bad ChildOpts are refused unrecorded.
func TestStartChildRefusesATakenWorkflowIDAndBadOpts(t *testing.T) {
	t.Parallel()
	child := engine.Define("taken-kid", func(ctx *engine.Context, _ int) (int, error) { return 1, nil }, nil)
	parent := engine.Define("taken-parent", func(ctx *engine.Context, _ int) (string, error) {
		_, err := engine.StartChild(ctx, child, 0, &engine.ChildOpts{ParentClosePolicy: "sometimes"})
		if !errors.Is(err, engine.ErrInvalidArgument) {
			return "", fmt.Errorf("bad policy: %v", err)
		}
		_, err = engine.StartChild(ctx, child, 0, &engine.ChildOpts{WorkflowID: "taken"})
		if !errors.Is(err, engine.ErrWorkflowIDConflict) {
			return "", fmt.Errorf("taken ID: %v", err)
		}
		if err := engine.Sleep(ctx, 1500*time.Millisecond); err != nil { // the next delivery replays the refusal
			return "", err
		}
		return "refused", nil
	}, nil)
	b := setup(t, nil, parent, child)
	ctx := testCtx(t)
	_, err := child.Start(ctx, b.engine, 5, &engine.StartOpts{WorkflowID: "taken"})
	require.NoError(t, err)
	res, err := parent.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	out, err := parent.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "refused", out)
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Empty(t, run.Children)
	require.Equal(t, engine.KindChild, run.Steps[0].Kind)
	require.Equal(t, engine.StepFailed, run.Steps[0].Status)
	require.GreaterOrEqual(t, run.Deliveries, 2)
}

// A child's Get while a parallel step of the parent still runs: the
// delivery waits in place, looks at the child meanwhile, and returns its
// result once it ended (found by a fresh-user pass: it hung).
func TestChildGetWhileAParallelStepRuns(t *testing.T) {
	t.Parallel()
	child := engine.Define("gwf-kid", func(ctx *engine.Context, _ int) (string, error) {
		return engine.AwaitSignal[string](ctx, "go", 0)
	}, nil)
	wf := engine.Define("gwf-parent", func(ctx *engine.Context, _ int) (string, error) {
		f := engine.Go(ctx, "slow", func(context.Context) (string, error) {
			time.Sleep(time.Second)
			return "f", nil
		}, nil)
		c, err := engine.StartChild(ctx, child, 0, nil)
		if err != nil {
			return "", err
		}
		v, err := c.Get(ctx)
		if err != nil {
			return "", err
		}
		w, err := f.Get(ctx)
		return v + "+" + w, err
	}, nil)
	b := setup(t, nil, wf, child)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return b.engine.Signal(ctx, res.RunID.String()+":1", "go", "kid", nil) == nil
	}, 5*time.Second, 20*time.Millisecond)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := wf.Wait(wctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "kid+f", out)
}
