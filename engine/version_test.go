package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// versioned is version v of the workflow "pinned": one step that says
// which version ran it, a wait for signal go, then the answer.
func versioned(v int) *engine.Workflow[string, string] {
	return engine.Define("pinned", func(ctx *engine.Context, in string) (string, error) {
		first, err := engine.Step(ctx, "first", func(context.Context) (string, error) { return fmt.Sprintf("v%d", v), nil }, nil)
		if err != nil {
			return "", err
		}
		if v >= 2 {
			// v2's code has a step v1's runs never recorded: were a v1 run
			// given to v2's code, it would be parked as nondeterminism.
			if _, err := engine.Step(ctx, "v2_only", func(context.Context) (bool, error) { return true, nil }, nil); err != nil {
				return "", err
			}
		}
		if _, err := engine.AwaitSignal[string](ctx, "go", time.Hour); err != nil {
			return "", err
		}
		return fmt.Sprintf("%s then v%d", first, v), nil
	}, &engine.WorkflowOpts{Version: v})
}

// A process may register several versions of a workflow: each run stays
// on the version it started with, a start by name takes the latest, and
// a process works only the versions it registers, handing the others to
// one that does.
func TestRunsStayOnTheirVersion(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := testCtx(t)
	v1, v2 := versioned(1), versioned(2)

	both := newEngine(t, db, nil, true, v1, v2)
	require.ErrorContains(t, both.Register(versioned(2)), `workflow "pinned" version 2 registered twice`)
	old, err := v1.Start(ctx, both, "old", nil)
	require.NoError(t, err)
	byName, err := both.StartJSON(ctx, "pinned", []byte(`"by-name"`), nil)
	require.NoError(t, err)
	for _, id := range []uuid.UUID{old.RunID, byName.RunID} {
		enginetest.RequireRunStatus(ctx, t, both, id, engine.StatusWaiting, 0)
		require.NoError(t, both.Signal(ctx, id.String(), "go", "", nil))
	}
	require.JSONEq(t, `"v1 then v1"`, string(enginetest.RequireRunCompleted(ctx, t, both, old.RunID, 0).Output))
	require.JSONEq(t, `"v2 then v2"`, string(enginetest.RequireRunCompleted(ctx, t, both, byName.RunID, 0).Output), "a start by name takes the latest")
	require.NoError(t, both.Stop(ctx))

	// A process of v2 only beside one of v1 only: each works its own.
	onlyV2 := newEngine(t, db, nil, true, v2)
	onlyV1 := newEngine(t, db, nil, true, v1)
	var ones, twos []uuid.UUID
	for i := range 5 {
		r, err := v1.Start(ctx, onlyV2, fmt.Sprint("one-", i), nil) // started from the v2 process
		require.NoError(t, err)
		ones = append(ones, r.RunID)
		r, err = v2.Start(ctx, onlyV1, fmt.Sprint("two-", i), nil) // and the other way round
		require.NoError(t, err)
		twos = append(twos, r.RunID)
	}
	for _, id := range append(append([]uuid.UUID{}, ones...), twos...) {
		enginetest.RequireRunStatus(ctx, t, onlyV1, id, engine.StatusWaiting, 0)
		require.NoError(t, onlyV1.Signal(ctx, id.String(), "go", "", nil))
	}
	for _, id := range ones {
		require.JSONEq(t, `"v1 then v1"`, string(enginetest.RequireRunCompleted(ctx, t, onlyV1, id, 0).Output))
	}
	for _, id := range twos {
		require.JSONEq(t, `"v2 then v2"`, string(enginetest.RequireRunCompleted(ctx, t, onlyV1, id, 0).Output))
	}
	dead, _, err := onlyV1.ListDeadJobs(ctx, engine.ListDeadJobsParams{})
	require.NoError(t, err)
	require.Empty(t, dead, "no run was given the other version's code")
}

// A continue-as-new starts the chain's next run on the latest version
// registered, so a long-lived chain moves to new code at that point.
func TestContinueAsNewTakesTheLatestVersion(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := testCtx(t)
	chain := func(v int) *engine.Workflow[int, string] {
		return engine.Define("chain", func(ctx *engine.Context, n int) (string, error) {
			if n > 0 {
				return "", engine.ContinueAsNew(ctx, n-1)
			}
			return fmt.Sprintf("ended on v%d", v), nil
		}, &engine.WorkflowOpts{Version: v})
	}
	v1, v2 := chain(1), chain(2)
	e := newEngine(t, db, nil, true, v1, v2)
	first, err := v1.Start(ctx, e, 1, &engine.StartOpts{WorkflowID: "chain-1"})
	require.NoError(t, err)
	run, err := e.GetRun(ctx, first.RunID)
	require.NoError(t, err)
	require.Equal(t, 1, run.WorkflowVersion)
	deadline := time.Now().Add(30 * time.Second)
	for {
		run, err = e.GetRun(ctx, first.RunID)
		require.NoError(t, err)
		if run.ContinuedRunID != nil {
			break
		}
		require.True(t, time.Now().Before(deadline), "the run never continued")
		time.Sleep(10 * time.Millisecond)
	}
	next := enginetest.RequireRunCompleted(ctx, t, e, *run.ContinuedRunID, 0)
	require.Equal(t, 2, next.WorkflowVersion)
	require.JSONEq(t, `"ended on v2"`, string(next.Output))
}

// With no process registering a run's version, the run waits: not
// parked, not run on other code; it finishes once a process that
// registers its version starts.
func TestARunWaitsForAProcessOfItsVersion(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := testCtx(t)
	v1, v2 := versioned(1), versioned(2)
	onlyV2 := newEngine(t, db, nil, true, v2)
	r, err := v1.Start(ctx, onlyV2, "orphan", nil)
	require.NoError(t, err)
	time.Sleep(3 * time.Second) // a few hand-backs by the v2 process
	run, err := onlyV2.GetRun(ctx, r.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, run.Status)
	require.Empty(t, run.Steps, "no other version's code ran it")
	dead, _, err := onlyV2.ListDeadJobs(ctx, engine.ListDeadJobsParams{RunID: r.RunID})
	require.NoError(t, err)
	require.Empty(t, dead)

	onlyV1 := newEngine(t, db, nil, true, v1)
	enginetest.RequireRunStatus(ctx, t, onlyV1, r.RunID, engine.StatusWaiting, 0)
	require.NoError(t, onlyV1.Signal(ctx, r.RunID.String(), "go", "", nil))
	require.JSONEq(t, `"v1 then v1"`, string(enginetest.RequireRunCompleted(ctx, t, onlyV1, r.RunID, 0).Output))
}

// The runs still on a version are listed by it, which is how a version is
// drained: through ListRuns, GET /v1/runs?workflow_version= and the CLI
// (their own tests), and cancelled by it in bulk.
func TestListRunsByVersion(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := testCtx(t)
	v1, v2 := versioned(1), versioned(2)
	e := newEngine(t, db, nil, true, v1, v2)
	old, err := v1.Start(ctx, e, "old", nil)
	require.NoError(t, err)
	cur, err := v2.Start(ctx, e, "new", nil)
	require.NoError(t, err)
	for _, id := range []uuid.UUID{old.RunID, cur.RunID} {
		enginetest.RequireRunStatus(ctx, t, e, id, engine.StatusWaiting, 0)
	}
	ids := func(p engine.ListRunsParams) []uuid.UUID { return listedRunIDs(ctx, t, e, p) }
	require.Equal(t, []uuid.UUID{old.RunID}, ids(engine.ListRunsParams{Workflow: "pinned", Status: engine.StatusWaiting, Version: 1}))
	require.Equal(t, []uuid.UUID{cur.RunID}, ids(engine.ListRunsParams{Workflow: "pinned", Version: 2}))
	require.Len(t, ids(engine.ListRunsParams{Workflow: "pinned"}), 2)
	require.Equal(t, []uuid.UUID{old.RunID}, ids(engine.ListRunsParams{Workflow: "pinned", Version: 1, Status: engine.StatusOpenRuns}))
	_, _, err = e.ListRuns(ctx, engine.ListRunsParams{Version: -1})
	require.ErrorIs(t, err, engine.ErrInvalidArgument)

	res, err := e.CancelRuns(ctx, engine.CancelRunsParams{Filter: engine.ListRunsParams{Workflow: "pinned", Version: 1}})
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Matched)
	enginetest.RequireRunStatus(ctx, t, e, old.RunID, engine.StatusCancelled, 0)
	enginetest.RequireRunStatus(ctx, t, e, cur.RunID, engine.StatusWaiting, 0)
	require.Empty(t, ids(engine.ListRunsParams{Workflow: "pinned", Version: 1, Status: engine.StatusOpenRuns}), "a cancelled run is not open")
	res, err = e.CancelRuns(ctx, engine.CancelRunsParams{Filter: engine.ListRunsParams{Workflow: "pinned", Status: engine.StatusOpenRuns}, DryRun: true})
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Matched, "open, for a bulk cancel: every status it acts on")
}

// With AutoUpgrade on the latest version, runs of older versions move to
// it at their next delivery and replay their steps through its code (the
// change behind Patched): waiting runs finish on the new code, which
// took the old branch where they had passed the patch. The move is
// recorded: a process that registers only the old version hands the
// moved run back instead of running it. A run never moves down.
func TestAutoUpgradeMovesRunsToTheLatestVersion(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := testCtx(t)
	define := func(v int, auto bool) *engine.Workflow[string, string] {
		return engine.Define("upgraded", func(ctx *engine.Context, in string) (string, error) {
			if err := step(ctx, "validate"); err != nil {
				return "", err
			}
			branch := "old"
			if v >= 2 && engine.Patched(ctx, "fraud-check") {
				if err := step(ctx, "fraud_check"); err != nil {
					return "", err
				}
				branch = "new"
			}
			for _, name := range []string{"approve", "ship"} {
				if _, err := engine.AwaitSignal[string](ctx, name, time.Hour); err != nil {
					return "", err
				}
			}
			return fmt.Sprintf("%s branch, finished by v%d", branch, v), nil
		}, &engine.WorkflowOpts{Version: v, AutoUpgrade: auto})
	}
	signal := func(e *engine.Engine, id uuid.UUID, names ...string) {
		for _, name := range names {
			require.NoError(t, e.Signal(ctx, id.String(), name, "ok", nil))
		}
	}
	v1 := define(1, false)
	old := newEngine(t, db, nil, true, v1)
	var waiting []uuid.UUID
	for i := range 3 {
		r, err := v1.Start(ctx, old, fmt.Sprint(i), nil)
		require.NoError(t, err)
		enginetest.RequireRunStatus(ctx, t, old, r.RunID, engine.StatusWaiting, 0)
		waiting = append(waiting, r.RunID)
	}
	require.NoError(t, old.Stop(ctx))

	v2 := define(2, true)
	cur := newEngine(t, db, nil, true, v1, v2) // v1 registered too: AutoUpgrade on the latest still moves its runs
	for _, id := range waiting[:2] {
		signal(cur, id, "approve", "ship")
		run := enginetest.RequireRunCompleted(ctx, t, cur, id, 0)
		require.Equal(t, 2, run.WorkflowVersion)
		require.JSONEq(t, `"old branch, finished by v2"`, string(run.Output))
		enginetest.RequireSteps(ctx, t, cur, id, []string{"validate", "approve", "ship"})
	}
	fresh, err := cur.StartJSON(ctx, "upgraded", []byte(`"x"`), nil)
	require.NoError(t, err)
	enginetest.RequireRunStatus(ctx, t, cur, fresh.RunID, engine.StatusWaiting, 0)
	enginetest.RequireSteps(ctx, t, cur, fresh.RunID, []string{"validate", "fraud_check", "approve"})

	// The third run moves at its next delivery and waits again; a
	// v1-only process then hands it back, as it does a v2 run (a run
	// never moves down).
	signal(cur, waiting[2], "approve")
	eventually(t, 30*time.Second, "the run's move to v2 and its next wait", func() bool {
		run, err := cur.GetRun(ctx, waiting[2])
		require.NoError(t, err)
		return run.WorkflowVersion == 2 && run.Status == engine.StatusWaiting && run.AwaitSignal == "ship"
	})
	require.NoError(t, cur.Stop(ctx))
	onlyV1 := newEngine(t, db, nil, true, v1)
	signal(onlyV1, waiting[2], "ship")
	r2, err := v2.Start(ctx, onlyV1, "newer", nil)
	require.NoError(t, err)
	for _, id := range []uuid.UUID{waiting[2], r2.RunID} {
		eventually(t, 30*time.Second, "the v1-only process to hand the v2 run back", func() bool {
			run, err := onlyV1.GetRun(ctx, id)
			require.NoError(t, err)
			return run.WaitingSince != nil && run.WaitingFor == "a process that registers upgraded v2"
		})
	}
	require.NoError(t, onlyV1.Stop(ctx))
	again := newEngine(t, db, nil, true, v2)
	run := enginetest.RequireRunCompleted(ctx, t, again, waiting[2], 0)
	require.JSONEq(t, `"old branch, finished by v2"`, string(run.Output))
	requireNoDeadJobs(ctx, t, again)
}

// A replay onto a version is checked before anything happens, in a dry
// run too: a version no live process registers, one below a version that
// moves runs up (AutoUpgrade), a discard with a version, a note with no
// room for the move's record.
func TestReplayOntoAVersionIsChecked(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := testCtx(t)
	parked := engine.Define("parked", func(ctx *engine.Context, _ string) (string, error) {
		return engine.Step(ctx, "fail", func(context.Context) (string, error) { return "", errors.New("503") },
			&engine.StepOpts{RetryPolicy: &engine.RetryPolicy{MaximumAttempts: 1}})
	}, nil)
	e := newEngine(t, db, nil, true, parked)
	r, err := parked.Start(ctx, e, "x", nil)
	require.NoError(t, err)
	enginetest.RequireRunStatus(ctx, t, e, r.RunID, engine.StatusDead, 0)
	job := enginetest.RequireDeadJob(ctx, t, e, r.RunID, nil)

	_, err = e.ReplayDeadJob(ctx, job.ID, &engine.ResolveOpts{Version: 3})
	require.ErrorIs(t, err, engine.ErrInvalidArgument)
	require.ErrorContains(t, err, `no live engine process on queue "pgdurable" registers workflow "parked" version 3 (they register [1])`)
	_, err = e.ReplayDeadJob(ctx, job.ID, &engine.ResolveOpts{Version: 1, Note: strings.Repeat("n", 3990)})
	require.ErrorIs(t, err, engine.ErrInvalidArgument, "no room left for the move's record")
	for _, c := range []struct {
		replay bool
		opts   engine.ResolveOpts
		want   string
	}{
		{true, engine.ResolveOpts{Version: -1}, "a version is 1 to"},
		{true, engine.ResolveOpts{Version: 1 << 31}, "a version is 1 to"},
		{false, engine.ResolveOpts{Version: 2}, "a discard does not run the job again"},
		{true, engine.ResolveOpts{Version: 3}, `no live engine process on queue "pgdurable" registers workflow "parked" version 3`},
	} {
		act := e.DiscardDeadJobs
		if c.replay {
			act = e.ReplayDeadJobs
		}
		_, err := act(ctx, engine.ResolveDeadJobsParams{Filter: engine.ListDeadJobsParams{Workflow: "parked"}, DryRun: true}, &c.opts)
		require.ErrorIs(t, err, engine.ErrInvalidArgument, "%+v", c)
		require.ErrorContains(t, err, c.want)
	}

	// A process that registers v2 and moves runs up to v3: a replay onto
	// v2 would not stay there.
	later := func(v int) *engine.Workflow[string, string] {
		return engine.Define("parked", func(ctx *engine.Context, _ string) (string, error) { return "later", nil },
			&engine.WorkflowOpts{Version: v, AutoUpgrade: v == 3})
	}
	newEngine(t, db, nil, true, later(2), later(3))
	_, err = e.ReplayDeadJob(ctx, job.ID, &engine.ResolveOpts{Version: 2})
	require.ErrorIs(t, err, engine.ErrInvalidArgument)
	require.ErrorContains(t, err, `moves the runs of workflow "parked" up to version 3 (WorkflowOpts.AutoUpgrade): a replay onto version 2 would not stay there`)
	_, err = e.ReplayDeadJobs(ctx, engine.ResolveDeadJobsParams{Filter: engine.ListDeadJobsParams{Workflow: "parked"}, DryRun: true},
		&engine.ResolveOpts{Version: 2})
	require.ErrorIs(t, err, engine.ErrInvalidArgument, "a dry run refuses it too")
	dead, err := e.GetDeadJob(ctx, job.ID)
	require.NoError(t, err)
	require.Nil(t, dead.ResolvedAt, "nothing was resolved")
}
