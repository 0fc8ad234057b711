package engine_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/internal/crashtest"
)

// A worker that started 300 runs itself (direct dispatch: no River ticket)
// is SIGKILLed while one of its record batches is being committed. Another
// engine finishes every run that exists: a step whose record had landed
// never runs again, a step whose record had not is redone, each run has
// each record once, and each tx step's row exists exactly once.
func TestKillDuringGroupCommitLosesNothingAndDuplicatesNothing(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	createCallsTable(t, db.Pool)
	ctx := testCtx(t)
	child := crashtest.StartWorker(t, db, 2*time.Second, crashtest.EnvWorkerStarts+"=crash-batch:300")
	eventually(t, 60*time.Second, "a record batch in flight after 50 runs completed", func() bool {
		var done, inFlight int
		require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT
			(SELECT count(*) FROM pgdurable.workflow_runs WHERE status = 'completed'),
			(SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state = 'active'
			   AND query LIKE '%pgdurable: workflow_steps records%' AND pid <> pg_backend_pid())`)).Scan(&done, &inFlight))
		return done >= 50 && inFlight > 0
	})
	crashtest.Kill(t, child)

	// What had landed when the worker died.
	type key struct {
		run  uuid.UUID
		step string
	}
	landed := map[key]int{}
	rows, err := db.Pool.Query(ctx, db.SQL(`SELECT s.run_id, s.name, coalesce(c.n, 0) FROM pgdurable.workflow_steps s
		LEFT JOIN step_calls c ON c.run_id = s.run_id AND c.step = s.name
		WHERE s.status = 'completed' AND s.kind = 'step'`))
	require.NoError(t, err)
	for rows.Next() {
		var k key
		var n int
		require.NoError(t, rows.Scan(&k.run, &k.step, &n))
		landed[k] = n
	}
	require.NoError(t, rows.Err())
	var total, unfinished int
	require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT count(*), count(*) FILTER (WHERE status <> 'completed') FROM pgdurable.workflow_runs`)).
		Scan(&total, &unfinished))
	t.Logf("killed with %d runs started, %d unfinished, %d plain-step records landed", total, unfinished, len(landed))
	require.Positive(t, unfinished, "the kill came mid-work")

	wfs := crashWorkflows(db.Pool)
	newEngine(t, db, &engine.Config{LeaseDuration: 2 * time.Second, SweepInterval: 100 * time.Millisecond}, true, wfs...)
	eventually(t, 60*time.Second, "every run to complete", func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT count(*) FROM pgdurable.workflow_runs WHERE status <> 'completed'`)).Scan(&n))
		return n == 0
	})

	for k, before := range landed {
		require.Equal(t, before, calls(t, db.Pool, k.run, k.step), "step %s of run %s was recorded, so it never runs again", k.step, k.run)
	}
	var badRecords, badRows, badOutputs int
	require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT
		(SELECT count(*) FROM (SELECT run_id FROM pgdurable.workflow_steps GROUP BY run_id HAVING count(*) <> 6) x),
		(SELECT count(*) FROM pgdurable.workflow_runs WHERE output <> '6'::jsonb)`)).Scan(&badRecords, &badOutputs))
	// Read apart and compared here: on a Citus cluster the runs are on a
	// worker node and reservations on the coordinator, which one
	// statement cannot join.
	rows, err = db.Pool.Query(ctx, db.SQL(`SELECT run_id::text FROM pgdurable.workflow_runs`))
	require.NoError(t, err)
	runIDs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	rows, err = db.Pool.Query(ctx, `SELECT run_id::text, count(*) FROM reservations GROUP BY run_id`)
	require.NoError(t, err)
	reserved := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		require.NoError(t, rows.Scan(&id, &n))
		reserved[id] = n
	}
	require.NoError(t, rows.Err())
	for _, id := range runIDs {
		if reserved[id] != 1 {
			badRows++
		}
	}
	require.Zero(t, badRecords, "runs without exactly 6 records")
	require.Zero(t, badRows, "runs whose tx step's row is missing or doubled")
	require.Zero(t, badOutputs, "runs with a wrong output")
}
