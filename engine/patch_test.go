package engine_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// deployApproval is one deploy of a workflow named "approval": each version of
// its code a test deploys by starting an engine that registers it.
func deployApproval(body func(ctx *engine.Context) error) *engine.Workflow[string, string] {
	return engine.Define("approval", func(ctx *engine.Context, in string) (string, error) {
		if _, err := engine.Step(ctx, "validate", func(context.Context) (string, error) { return in, nil }, nil); err != nil {
			return "", err
		}
		if err := body(ctx); err != nil {
			return "", err
		}
		return engine.Step(ctx, "ship", func(context.Context) (string, error) { return "shipped " + in, nil }, nil)
	}, nil)
}

func step(ctx *engine.Context, name string) error {
	_, err := engine.Step(ctx, name, func(context.Context) (bool, error) { return true, nil }, nil)
	return err
}

func awaitApproval(ctx *engine.Context) error {
	_, err := engine.AwaitSignal[string](ctx, "approve", time.Hour)
	return err
}

// The deploy of the issue: runs wait on an approval signal; the workflow
// gains a fraud check before the wait and a gift wrap after it; the
// signal arrives. Every waiting run replays the old code up to the wait
// (it passed the fraud check's point before the deploy) and takes the
// gift wrap (it had not reached that point); a run started after the
// deploy takes both. Nothing is parked. Then the old code is deleted
// (DeprecatePatch), and runs with the marker and runs without finish.
func TestPatchedKeepsInFlightRunsOnTheirCode(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := testCtx(t)
	v1 := deployApproval(awaitApproval)
	old := newEngine(t, db, nil, true, v1)
	var waiting []uuid.UUID
	for i := range 5 {
		id := fmt.Sprintf("order-%d", i)
		r, err := v1.Start(ctx, old, id, &engine.StartOpts{WorkflowID: id})
		require.NoError(t, err)
		enginetest.RequireRunStatus(ctx, t, old, r.RunID, engine.StatusWaiting, 0)
		waiting = append(waiting, r.RunID)
	}
	require.NoError(t, old.Stop(ctx))

	// Without a patch, the same change parks a waiting run: the guard
	// this test exists for.
	unpatched := newEngine(t, db, nil, true, deployApproval(func(ctx *engine.Context) error {
		if err := step(ctx, "fraud_check"); err != nil {
			return err
		}
		return awaitApproval(ctx)
	}))
	require.NoError(t, unpatched.Signal(ctx, waiting[0].String(), "approve", "ann", nil))
	parked := waiting[0]
	enginetest.RequireRunStatus(ctx, t, unpatched, parked, engine.StatusDead, 0)
	enginetest.RequireDeadJob(ctx, t, unpatched, parked, &enginetest.RequireDeadJobOpts{Reason: engine.ReasonNonDeterminism})
	require.NoError(t, unpatched.Stop(ctx))

	v2 := deployApproval(func(ctx *engine.Context) error {
		if engine.Patched(ctx, "fraud-check") {
			if err := step(ctx, "fraud_check"); err != nil {
				return err
			}
		}
		if err := awaitApproval(ctx); err != nil {
			return err
		}
		if engine.Patched(ctx, "gift-wrap") {
			return step(ctx, "gift_wrap")
		}
		return nil
	})
	deployed := newEngine(t, db, nil, true, v2)
	for _, runID := range waiting[1:] {
		require.NoError(t, deployed.Signal(ctx, runID.String(), "approve", "ann", nil))
		enginetest.RequireRunCompleted(ctx, t, deployed, runID, 0)
		steps := enginetest.RequireSteps(ctx, t, deployed, runID, []string{"validate", "approve", "gift_wrap", "ship"})
		require.Equal(t, []string{"gift-wrap"}, steps[2].Patches, "the change is recorded on the step after Patched")
		require.Nil(t, steps[1].Patches)
	}
	fresh, err := v2.Start(ctx, deployed, "order-new", &engine.StartOpts{WorkflowID: "order-new"})
	require.NoError(t, err)
	enginetest.RequireRunStatus(ctx, t, deployed, fresh.RunID, engine.StatusWaiting, 0)
	steps := enginetest.RequireSteps(ctx, t, deployed, fresh.RunID, []string{"validate", "fraud_check", "approve"})
	require.Equal(t, []string{"fraud-check"}, steps[1].Patches, "no marker row: the change rides on the next step's record")
	// Its history replays through the patched code, the change read back
	// from the record; a waiting run's history through the same code
	// takes the old branch.
	for _, id := range []uuid.UUID{fresh.RunID, waiting[1]} {
		run, err := deployed.GetRun(ctx, id)
		require.NoError(t, err)
		h, err := engine.NewHistory(run)
		require.NoError(t, err)
		enginetest.Replay(t, v2, h)
	}
	dead, _, err := deployed.ListDeadJobs(ctx, engine.ListDeadJobsParams{})
	require.NoError(t, err)
	require.Len(t, dead, 1, "only the unpatched deploy's run")

	// The old code is gone: the fraud check always runs.
	other, err := v2.Start(ctx, deployed, "order-new-2", &engine.StartOpts{WorkflowID: "order-new-2"})
	require.NoError(t, err)
	enginetest.RequireRunStatus(ctx, t, deployed, other.RunID, engine.StatusWaiting, 0)
	require.NoError(t, deployed.Stop(ctx))
	v3 := deployApproval(func(ctx *engine.Context) error {
		engine.DeprecatePatch(ctx, "fraud-check")
		if err := step(ctx, "fraud_check"); err != nil {
			return err
		}
		if err := awaitApproval(ctx); err != nil {
			return err
		}
		engine.DeprecatePatch(ctx, "gift-wrap")
		return step(ctx, "gift_wrap")
	})
	cleaned := newEngine(t, db, nil, true, v3)
	// Both recorded the fraud check's marker, and reach the gift wrap only
	// now, where it runs with no marker to record.
	for _, r := range []*engine.StartResult{fresh, other} {
		require.NoError(t, cleaned.Signal(ctx, r.RunID.String(), "approve", "bo", nil))
		enginetest.RequireRunCompleted(ctx, t, cleaned, r.RunID, 0)
		enginetest.RequireSteps(ctx, t, cleaned, r.RunID, []string{"validate", "fraud_check", "approve", "gift_wrap", "ship"})
	}
	newest, err := v3.Start(ctx, cleaned, "order-newest", nil)
	require.NoError(t, err)
	enginetest.RequireRunStatus(ctx, t, cleaned, newest.RunID, engine.StatusWaiting, 0)
	require.NoError(t, cleaned.Signal(ctx, newest.RunID.String(), "approve", "cy", nil))
	enginetest.RequireRunCompleted(ctx, t, cleaned, newest.RunID, 0)
	enginetest.RequireSteps(ctx, t, cleaned, newest.RunID, []string{"validate", "fraud_check", "approve", "gift_wrap", "ship"})
}

// A marker is written before a parallel step starts, whose record is
// written apart from the workflow's: a crash can never leave the
// parallel step's record at a later position with the marker's empty,
// where a replay would read the run as one that took the old code.
func TestPatchedMarkerIsWrittenBeforeAParallelStep(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := testCtx(t)
	wf := engine.Define("patch-then-go", func(ctx *engine.Context, _ string) (int, error) {
		if err := step(ctx, "before"); err != nil {
			return 0, err
		}
		if !engine.Patched(ctx, "parallel") {
			return 0, nil
		}
		runID := ctx.RunID()
		return engine.Go(ctx, "count_markers", func(sctx context.Context) (int, error) {
			var n int
			err := db.Pool.QueryRow(sctx, db.SQL(`SELECT count(*) FROM pgdurable.workflow_steps WHERE run_id = $1 AND kind = 'patch'`), runID).Scan(&n)
			return n, err
		}, nil).Get(ctx)
	}, nil)
	e := newEngine(t, db, nil, true, wf)
	r, err := wf.Start(ctx, e, "", nil)
	require.NoError(t, err)
	run := enginetest.RequireRunCompleted(ctx, t, e, r.RunID, 0)
	require.JSONEq(t, `1`, string(run.Output))
	// The marker row replays: Patched takes its position, and the
	// parallel step is found at the next one.
	full, err := e.GetRun(ctx, r.RunID)
	require.NoError(t, err)
	h, err := engine.NewHistory(full)
	require.NoError(t, err)
	enginetest.Replay(t, wf, h)
}

// Runs list by whether they recorded a change's marker, so an operator
// can tell when the old code has no run left.
func TestListRunsByPatch(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := testCtx(t)
	v1 := deployApproval(awaitApproval)
	old := newEngine(t, db, nil, true, v1)
	before, err := v1.Start(ctx, old, "before", nil)
	require.NoError(t, err)
	enginetest.RequireRunStatus(ctx, t, old, before.RunID, engine.StatusWaiting, 0)
	require.NoError(t, old.Stop(ctx))
	v2 := deployApproval(func(ctx *engine.Context) error {
		if engine.Patched(ctx, "fraud-check") {
			if err := step(ctx, "fraud_check"); err != nil {
				return err
			}
		}
		return awaitApproval(ctx)
	})
	e := newEngine(t, db, nil, true, v2)
	after, err := v2.Start(ctx, e, "after", nil)
	require.NoError(t, err)
	enginetest.RequireRunStatus(ctx, t, e, after.RunID, engine.StatusWaiting, 0)

	ids := func(p engine.ListRunsParams) []uuid.UUID { return listedRunIDs(ctx, t, e, p) }
	require.Equal(t, []uuid.UUID{after.RunID}, ids(engine.ListRunsParams{Workflow: "approval", Patched: "fraud-check"}))
	require.Equal(t, []uuid.UUID{before.RunID}, ids(engine.ListRunsParams{Workflow: "approval", Status: engine.StatusWaiting, Unpatched: "fraud-check"}))
	_, _, err = e.ListRuns(ctx, engine.ListRunsParams{Patched: "fraud-check", Unpatched: "fraud-check"})
	require.ErrorIs(t, err, engine.ErrInvalidArgument, "a contradiction matches no run")
	require.Len(t, ids(engine.ListRunsParams{Unpatched: "other-change"}), 2)
	_, _, err = e.ListRuns(ctx, engine.ListRunsParams{Patched: "bad\nid"})
	require.ErrorIs(t, err, engine.ErrInvalidArgument)
}

// An invalid change ID is a programming error with one outcome on every
// delivery: the run is parked as a panic naming the rule (never true on
// one delivery and false on the next).
func TestPatchedRefusesAnInvalidChangeID(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := testCtx(t)
	for i, id := range []string{"", " lead", "a\x00b", string(make([]byte, 201))} {
		wf := engine.Define(fmt.Sprintf("bad-patch-%d", i), func(ctx *engine.Context, _ string) (string, error) {
			if engine.Patched(ctx, id) {
				return "new", step(ctx, "new_code")
			}
			return "old", nil
		}, nil)
		e := newEngine(t, db, nil, true, wf)
		r, err := wf.Start(ctx, e, "", nil)
		require.NoError(t, err)
		enginetest.RequireRunStatus(ctx, t, e, r.RunID, engine.StatusDead, 0)
		job := enginetest.RequireDeadJob(ctx, t, e, r.RunID, &enginetest.RequireDeadJobOpts{Reason: engine.ReasonPanic})
		require.Contains(t, job.ErrorMessage, "pgdurable: Patched: change ID", id)
		enginetest.RequireSteps(ctx, t, e, r.RunID, nil)
	}
}

// The repair of a deploy that forgot its patch: a run parked as
// nondeterminism by the unpatched change is replayed onto v2, whose code
// has the change behind Patched, and completes on the old branch; its dead
// job records the move. A process that registers only v2 runs it.
func TestReplayANondeterminismDeadJobOntoAPatchedVersion(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := testCtx(t)
	define := func(v int, body func(ctx *engine.Context) error) *engine.Workflow[string, string] {
		return engine.Define("approval", func(ctx *engine.Context, in string) (string, error) {
			if err := step(ctx, "validate"); err != nil {
				return "", err
			}
			if err := body(ctx); err != nil {
				return "", err
			}
			return engine.Step(ctx, "ship", func(context.Context) (string, error) { return fmt.Sprintf("shipped by v%d", v), nil }, nil)
		}, &engine.WorkflowOpts{Version: v})
	}
	old := newEngine(t, db, nil, true, define(1, awaitApproval))
	r, err := define(1, awaitApproval).Start(ctx, old, "order", nil)
	require.NoError(t, err)
	enginetest.RequireRunStatus(ctx, t, old, r.RunID, engine.StatusWaiting, 0)
	require.NoError(t, old.Stop(ctx))

	// v1 changed in place, without a patch: the run is parked.
	broken := newEngine(t, db, nil, true, define(1, func(ctx *engine.Context) error {
		if err := step(ctx, "fraud_check"); err != nil {
			return err
		}
		return awaitApproval(ctx)
	}))
	require.NoError(t, broken.Signal(ctx, r.RunID.String(), "approve", "ann", nil))
	enginetest.RequireRunStatus(ctx, t, broken, r.RunID, engine.StatusDead, 0)
	job := enginetest.RequireDeadJob(ctx, t, broken, r.RunID, &enginetest.RequireDeadJobOpts{Reason: engine.ReasonNonDeterminism})
	require.NoError(t, broken.Stop(ctx))

	// The fix ships as v2, the change behind a patch; the parked run is
	// replayed onto it.
	fixed := newEngine(t, db, nil, true, define(2, func(ctx *engine.Context) error {
		if engine.Patched(ctx, "fraud-check") {
			if err := step(ctx, "fraud_check"); err != nil {
				return err
			}
		}
		return awaitApproval(ctx)
	}))
	_, err = fixed.ReplayDeadJob(ctx, job.ID, &engine.ResolveOpts{Version: -1})
	require.ErrorIs(t, err, engine.ErrInvalidArgument)
	_, err = fixed.DiscardDeadJob(ctx, job.ID, &engine.ResolveOpts{Version: 2})
	require.ErrorIs(t, err, engine.ErrInvalidArgument, "a discard runs nothing: no version")
	resolved, err := fixed.ReplayDeadJob(ctx, job.ID, &engine.ResolveOpts{By: "ops", Note: "fraud check patched", Version: 2})
	require.NoError(t, err)
	require.Equal(t, "replayed onto version 2 (was 1). fraud check patched", resolved.Note)
	run := enginetest.RequireRunCompleted(ctx, t, fixed, r.RunID, 0)
	require.Equal(t, 2, run.WorkflowVersion)
	require.JSONEq(t, `"shipped by v2"`, string(run.Output))
	enginetest.RequireSteps(ctx, t, fixed, r.RunID, []string{"validate", "approve", "ship"})

	_, err = fixed.ReplayDeadJobs(ctx, engine.ResolveDeadJobsParams{Filter: engine.ListDeadJobsParams{Reason: engine.ReasonNonDeterminism}},
		&engine.ResolveOpts{Version: 2})
	require.ErrorIs(t, err, engine.ErrInvalidArgument, "a bulk replay onto a version needs its workflow")
}

// Every Patched call before a parallel step gives the same answer on the
// next delivery, the same ID twice included; an undo registered right
// after Patched binds to the same step on every delivery.
func TestPatchedBeforeAParallelStepReplaysAlike(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := testCtx(t)
	var mu sync.Mutex
	answers := map[string][]string{}
	note := func(wf, ans string) {
		mu.Lock()
		defer mu.Unlock()
		answers[wf] = append(answers[wf], ans)
	}
	untilSignal := func(ctx *engine.Context) error {
		if _, err := engine.Go(ctx, "par", func(context.Context) (int, error) { return 1, nil }, nil).Get(ctx); err != nil {
			return err
		}
		_, err := engine.AwaitSignal[string](ctx, "go", time.Hour) // the signal's delivery replays all of it
		return err
	}
	twice := engine.Define("patched-twice", func(ctx *engine.Context, _ string) (string, error) {
		ans := fmt.Sprintf("%v/%v/%v", engine.Patched(ctx, "x"), engine.Patched(ctx, "y"), engine.Patched(ctx, "x"))
		note("twice", ans)
		return ans, untilSignal(ctx)
	}, nil)
	undo := func(name string) engine.Undo {
		return engine.Undo{Name: name, Fn: func(context.Context, *engine.ActivityAttempt) error { return nil }}
	}
	undone := engine.Define("patched-undo", func(ctx *engine.Context, _ string) (string, error) {
		if err := step(ctx, "a"); err != nil {
			return "", err
		}
		if err := ctx.Compensate(undo("undo_a")); err != nil {
			return "", err
		}
		ans := "no change"
		if engine.Patched(ctx, "x") {
			ans = fmt.Sprintf("compensate: %v", ctx.Compensate(undo("undo_x")))
		}
		note("undo", ans)
		return ans, untilSignal(ctx)
	}, nil)
	e := newEngine(t, db, nil, true, twice, undone)
	for _, w := range []*engine.Workflow[string, string]{twice, undone} {
		r, err := w.Start(ctx, e, "", nil)
		require.NoError(t, err)
		enginetest.RequireRunStatus(ctx, t, e, r.RunID, engine.StatusWaiting, 0)
		require.NoError(t, e.Signal(ctx, r.RunID.String(), "go", "", nil))
		enginetest.RequireRunCompleted(ctx, t, e, r.RunID, 0)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"true/true/true", "true/true/true"}, answers["twice"])
	require.Len(t, answers["undo"], 2)
	require.Equal(t, answers["undo"][0], answers["undo"][1])
	require.Contains(t, answers["undo"][0], "step 0 already has an undo")
}

// listedRunIDs is the IDs of the runs e.ListRuns(p) lists, in its order.
func listedRunIDs(ctx context.Context, t *testing.T, e *engine.Engine, p engine.ListRunsParams) []uuid.UUID {
	t.Helper()
	runs, _, err := e.ListRuns(ctx, p)
	require.NoError(t, err)
	var out []uuid.UUID
	for _, r := range runs {
		out = append(out, r.RunID)
	}
	return out
}
