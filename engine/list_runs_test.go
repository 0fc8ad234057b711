package engine_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
)

// ListRuns keeps the runs whose workflow ID starts with WorkflowIDPrefix,
// byte for byte, across pages and with the other filters; a prefix no
// workflow ID could start with is refused as an invalid argument.
func TestListRunsByWorkflowIDPrefix(t *testing.T) {
	t.Parallel()
	wf := engine.Define("noop", func(ctx *engine.Context, in int) (int, error) { return in, nil }, nil)
	other := engine.Define("other", func(ctx *engine.Context, in int) (int, error) { return in, nil }, nil)
	b := setup(t, nil, wf, other)
	ctx := testCtx(t)
	ids := map[string]uuid.UUID{}
	for _, id := range []string{"batch-a 1", "batch-a 2", "batch-a 3", "batch-ab", "Batch-a 4", "batch-b 1", "x batch-a 5", "batch-%_"} {
		res, err := wf.Start(ctx, b.engine, 1, &engine.StartOpts{WorkflowID: id})
		require.NoError(t, err)
		ids[id] = res.RunID
	}
	res, err := other.Start(ctx, b.engine, 1, &engine.StartOpts{WorkflowID: "batch-a 6"})
	require.NoError(t, err)
	ids["other batch-a 6"] = res.RunID

	list := func(p engine.ListRunsParams) []string {
		t.Helper()
		var got []string
		for {
			runs, next, err := b.engine.ListRuns(ctx, p)
			require.NoError(t, err)
			for _, r := range runs {
				got = append(got, r.WorkflowName+" "+r.WorkflowID)
			}
			if next == "" {
				return got
			}
			p.Cursor = next
		}
	}
	require.Equal(t, []string{"other batch-a 6", "noop batch-a 3", "noop batch-a 2", "noop batch-a 1"},
		list(engine.ListRunsParams{WorkflowIDPrefix: "batch-a ", Limit: 1}), "newest first, one page at a time; the trailing space counts")
	require.Equal(t, []string{"noop batch-ab", "noop batch-a 3", "noop batch-a 2", "noop batch-a 1"},
		list(engine.ListRunsParams{WorkflowIDPrefix: "batch-a", Workflow: "noop", Limit: 3}), "with a workflow filter")
	require.Equal(t, []string{"noop batch-%_"}, list(engine.ListRunsParams{WorkflowIDPrefix: "batch-%"}), "LIKE's wildcards are plain characters")
	require.Empty(t, list(engine.ListRunsParams{WorkflowIDPrefix: "batch-a", Status: engine.StatusDead}))
	require.Len(t, list(engine.ListRunsParams{WorkflowIDPrefix: "batch-a 1"}), 1, "a whole workflow ID is its own prefix")
	require.Len(t, list(engine.ListRunsParams{}), len(ids), "no prefix: every run")

	for prefix, msg := range map[string]string{
		strings.Repeat("b", 401): "over 400 bytes",
		"batch-\xff":             "not valid UTF-8",
		"batch-\x00":             "NUL",
	} {
		_, _, err := b.engine.ListRuns(ctx, engine.ListRunsParams{WorkflowIDPrefix: prefix})
		require.ErrorIs(t, err, engine.ErrInvalidArgument, "%q", prefix)
		require.ErrorContains(t, err, msg)
	}
	runs, _, err := b.engine.ListRuns(ctx, engine.ListRunsParams{WorkflowIDPrefix: strings.Repeat("b", 400)})
	require.NoError(t, err, "400 bytes is the limit, as for a workflow ID")
	require.Empty(t, runs)
}

// ListRuns keeps the runs created, or finished, in a time range: the
// creation range goes by run ID (UUID v7), the finish range by
// completed_at.
func TestListRunsByCreatedAndFinishedTime(t *testing.T) {
	t.Parallel()
	b := setup(t, &engine.Config{Retention: -1}) // the engine's first prune would delete the runs of ten days ago
	ctx := testCtx(t)
	insertOldRuns(t, b.db.Pool, "ten-days-", "completed", 3, 0, 10*24*time.Hour)
	insertOldRuns(t, b.db.Pool, "two-days-", "failed", 2, 0, 2*24*time.Hour)
	_, err := b.db.Pool.Exec(ctx, b.db.SQL(`INSERT INTO pgdurable.workflow_runs (run_id, workflow_name, workflow_id, status, input)
		VALUES ('`)+uuid.Must(uuid.NewV7()).String()+`', 'history', 'now-1', 'pending', '1')`)
	require.NoError(t, err)
	now := time.Now()
	count := func(p engine.ListRunsParams) int {
		runs, _, err := b.engine.ListRuns(ctx, p)
		require.NoError(t, err)
		return len(runs)
	}
	require.Equal(t, 6, count(engine.ListRunsParams{}))
	require.Equal(t, 3, count(engine.ListRunsParams{CreatedBefore: now.Add(-5 * 24 * time.Hour)}))
	require.Equal(t, 3, count(engine.ListRunsParams{CreatedAfter: now.Add(-5 * 24 * time.Hour)}))
	require.Equal(t, 2, count(engine.ListRunsParams{CreatedAfter: now.Add(-5 * 24 * time.Hour), CreatedBefore: now.Add(-time.Hour)}))
	require.Equal(t, 2, count(engine.ListRunsParams{FinishedAfter: now.Add(-5 * 24 * time.Hour)}))
	require.Equal(t, 5, count(engine.ListRunsParams{FinishedBefore: now}), "a run not finished is left out")
}

// ListRuns with TopLevel leaves out the runs other runs started (their
// children), with every other filter; CancelRuns takes it too.
func TestListRunsTopLevel(t *testing.T) {
	t.Parallel()
	child := engine.Define("kid", func(ctx *engine.Context, in int) (int, error) {
		return engine.AwaitSignal[int](ctx, "go", 0)
	}, nil)
	parent := engine.Define("parent", func(ctx *engine.Context, in int) (int, error) {
		return engine.ChildWorkflow(ctx, child, in, &engine.ChildOpts{WorkflowID: "kid-of-parent"})
	}, nil)
	b := setup(t, nil, parent, child)
	ctx := testCtx(t)
	res, err := parent.Start(ctx, b.engine, 1, &engine.StartOpts{WorkflowID: "parent-1"})
	require.NoError(t, err)
	_, err = child.Start(ctx, b.engine, 2, &engine.StartOpts{WorkflowID: "kid-alone", Tags: map[string]string{"team": "a"}})
	require.NoError(t, err)
	deadline := time.Now().Add(30 * time.Second)
	for {
		run, err := b.engine.GetRun(ctx, res.RunID)
		require.NoError(t, err)
		var waiting int
		require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT count(*) FROM pgdurable.workflow_runs WHERE workflow_name = 'kid' AND status = 'waiting'`)).Scan(&waiting))
		if len(run.Children) == 1 && waiting == 2 {
			break // both kids wait for their signal: the status filter below sees them
		}
		require.True(t, time.Now().Before(deadline), "the parent never started its child, or the kids never waited")
		time.Sleep(20 * time.Millisecond)
	}
	ids := func(p engine.ListRunsParams) []string {
		t.Helper()
		runs, _, err := b.engine.ListRuns(ctx, p)
		require.NoError(t, err)
		var out []string
		for _, r := range runs {
			out = append(out, r.WorkflowID)
		}
		return out
	}
	require.ElementsMatch(t, []string{"parent-1", "kid-alone", "kid-of-parent"}, ids(engine.ListRunsParams{}))
	require.ElementsMatch(t, []string{"parent-1", "kid-alone"}, ids(engine.ListRunsParams{TopLevel: true}))
	require.Equal(t, []string{"kid-alone"}, ids(engine.ListRunsParams{TopLevel: true, Workflow: "kid"}))
	require.Equal(t, []string{"kid-alone"}, ids(engine.ListRunsParams{TopLevel: true, WorkflowIDPrefix: "kid"}))
	require.Equal(t, []string{"kid-alone"}, ids(engine.ListRunsParams{TopLevel: true, Tags: map[string]string{"team": "a"}, Status: engine.StatusWaiting}))
	require.Empty(t, ids(engine.ListRunsParams{TopLevel: true, Tags: map[string]string{"team": "b"}}))
	res2, err := b.engine.CancelRuns(ctx, engine.CancelRunsParams{Filter: engine.ListRunsParams{Workflow: "kid", TopLevel: true}, DryRun: true})
	require.NoError(t, err)
	require.Equal(t, 1, res2.Matched, "the child is left to its parent")
}
