package engine_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

var double = engine.Define("double", func(ctx *engine.Context, n int) (int, error) {
	return engine.Step(ctx, "double", func(context.Context) (int, error) { return 2 * n, nil }, nil)
}, nil)

// StartMany starts every run in one call, more than a process's workers
// and held runs together, and each completes with its own input.
func TestStartManyStartsEveryRun(t *testing.T) {
	t.Parallel()
	b := setup(t, &engine.Config{MaxWorkers: 4}, double)
	ctx := testCtx(t)
	starts := make([]engine.StartParams[int], 300)
	for i := range starts {
		starts[i] = engine.StartParams[int]{Input: i, Opts: &engine.StartOpts{WorkflowID: fmt.Sprintf("many-%d", i)}}
	}
	res, err := double.StartMany(ctx, b.engine, starts)
	require.NoError(t, err)
	require.Len(t, res, len(starts))
	for i, r := range res {
		require.Equal(t, fmt.Sprintf("many-%d", i), r.WorkflowID, "results in the order of the starts")
		require.False(t, r.Existing)
	}
	for i, r := range res {
		out, err := double.Wait(ctx, b.engine, r.RunID, 10*time.Millisecond)
		require.NoError(t, err)
		require.Equal(t, 2*i, out)
	}

	again, err := double.StartMany(ctx, b.engine, starts[:2])
	require.NoError(t, err)
	require.True(t, again[0].Existing, "the same ID and input is the same run, as with Start")
	require.Equal(t, res[1].RunID, again[1].RunID)
}

// All start or none does: a conflicting workflow ID or an input that does
// not validate fails the call, names the start, and leaves no run; a
// repeated ID and input within one call is one run.
func TestStartManyIsAllOrNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, double, awaitTwo)
	ctx := testCtx(t)
	_, err := double.Start(ctx, b.engine, 1, &engine.StartOpts{WorkflowID: "taken"})
	require.NoError(t, err)

	_, err = double.StartMany(ctx, b.engine, []engine.StartParams[int]{
		{Input: 5, Opts: &engine.StartOpts{WorkflowID: "fresh"}},
		{Input: 2, Opts: &engine.StartOpts{WorkflowID: "taken"}},
	})
	require.ErrorIs(t, err, engine.ErrWorkflowIDConflict)
	require.ErrorContains(t, err, "start 1")
	_, err = double.StartMany(ctx, b.engine, []engine.StartParams[int]{
		{Input: 5, Opts: &engine.StartOpts{WorkflowID: "fresh"}},
		{Input: 6, Opts: &engine.StartOpts{WorkflowID: " padded"}},
	})
	require.ErrorIs(t, err, engine.ErrInvalidInput)
	require.ErrorContains(t, err, "start 1")
	require.Zero(t, countWorkflowID(t, b.db, "fresh"), "nothing started")

	res, err := double.StartMany(ctx, b.engine, []engine.StartParams[int]{
		{Input: 7, Opts: &engine.StartOpts{WorkflowID: "twice"}},
		{Input: 7, Opts: &engine.StartOpts{WorkflowID: "twice"}},
	})
	require.NoError(t, err)
	require.Equal(t, res[0].RunID, res[1].RunID)
	require.True(t, res[1].Existing)

	_, err = double.StartMany(ctx, b.engine, make([]engine.StartParams[int], engine.MaxStartMany+1))
	require.ErrorIs(t, err, engine.ErrInvalidArgument)
	res, err = double.StartMany(ctx, b.engine, nil)
	require.NoError(t, err)
	require.Empty(t, res)
}

// StartManyTx starts the runs only if the caller's transaction commits.
func TestStartManyTxFollowsTheCallersTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, double)
	ctx := testCtx(t)
	starts := []engine.StartParams[int]{{Input: 1, Opts: &engine.StartOpts{WorkflowID: "tx-1"}}, {Input: 2, Opts: &engine.StartOpts{WorkflowID: "tx-2"}}}

	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = double.StartManyTx(ctx, b.engine, tx, starts)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.Zero(t, countWorkflowID(t, b.db, "tx-1"))

	var res []*engine.StartResult
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		res, err = double.StartManyTx(ctx, b.engine, tx, starts)
		return err
	}))
	for i, r := range res {
		out, err := double.Wait(ctx, b.engine, r.RunID, 10*time.Millisecond)
		require.NoError(t, err)
		require.Equal(t, 2*(i+1), out)
	}
}

func countWorkflowID(t *testing.T, db *enginetest.DB, id string) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), db.SQL(`SELECT count(*) FROM pgdurable.workflow_runs WHERE workflow_id = $1`), id).Scan(&n))
	return n
}

func ExampleWorkflow_StartMany() {
	type Invoice struct {
		ID     string `json:"id"`
		Amount int    `json:"amount"`
	}
	remind := engine.Define("remind", func(ctx *engine.Context, inv Invoice) (bool, error) {
		return engine.Step(ctx, "email", func(context.Context) (bool, error) { return true, nil }, nil)
	}, nil)
	var e *engine.Engine // from engine.New, with remind registered
	due := []Invoice{{ID: "inv_1", Amount: 4999}, {ID: "inv_2", Amount: 1200}}
	starts := make([]engine.StartParams[Invoice], len(due))
	for i, inv := range due {
		// The invoice ID as the workflow ID: a second batch with the same
		// invoices finds these runs instead of starting new ones.
		starts[i] = engine.StartParams[Invoice]{Input: inv, Opts: &engine.StartOpts{WorkflowID: "remind-" + inv.ID}}
	}
	if e == nil {
		return // a sketch: no engine here
	}
	res, err := remind.StartMany(context.Background(), e, starts) // one transaction: all start or none
	if err != nil {
		return
	}
	fmt.Println(len(res), "runs started")
}
