package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// A ticket whose run is not visible yet waits for it rather than
// completing: on a cluster the run's row and its River ticket commit on
// different nodes, and the ticket can be seen first. Here the run's row is
// moved away before any worker sees the ticket and put back a second
// later; the run must still complete.
func TestTicketWaitsForARunNotVisibleYet(t *testing.T) {
	t.Parallel()
	wf := engine.Define("late-run", func(ctx *engine.Context, in int) (int, error) {
		return engine.Step(ctx, "double", func(context.Context) (int, error) { return in * 2, nil }, nil)
	}, nil)
	db := enginetest.NewDB(t)
	ctx := testCtx(t)
	client := newEngine(t, db, nil, false, wf) // not started: the start goes through River
	res, err := wf.Start(ctx, client, 21, nil)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, db.SQL(`CREATE TABLE hidden_run AS SELECT * FROM pgdurable.workflow_runs WHERE run_id = $1`), res.RunID)
	require.NoError(t, err)
	tag, err := db.Pool.Exec(ctx, `DELETE FROM `+db.RunTable("workflow_runs", res.RunID)+` WHERE run_id = $1`, res.RunID)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
	var tickets int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgdurable.river_job WHERE args->>'run_id' = $1`, res.RunID.String()).Scan(&tickets))
	require.Equal(t, 1, tickets, "the start enqueued a River ticket")

	worker := newEngine(t, db, nil, true, wf)
	// Until the first delivery has found no run: the ticket is snoozed.
	require.Eventually(t, func() bool {
		var state string
		_ = db.Pool.QueryRow(ctx, `SELECT state FROM pgdurable.river_job WHERE args->>'run_id' = $1`, res.RunID.String()).Scan(&state)
		return state == "scheduled"
	}, 10*time.Second, 10*time.Millisecond, "the ticket that found no run waits for it")
	time.Sleep(time.Second)
	_, err = db.Pool.Exec(ctx, `INSERT INTO `+db.RunTable("workflow_runs", res.RunID)+` SELECT * FROM hidden_run`)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, worker, res.RunID, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 42, out)
}
