package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// The claims find their runs by primary key however many runs are open
// and whatever the statistics say: analyzed when open runs were rare,
// PostgreSQL read a backlog's every open run through the open-status
// index for each claim batch (62 ms for 40 runs behind 10,000 open ones).
func TestClaimsUseThePrimaryKeyWithABacklog(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `INSERT INTO pgdurable.workflow_runs (run_id, workflow_name, workflow_id, status, input, flow_queue)
		SELECT gen_random_uuid(), 'wf', 'w' || g, 'completed', '{}', 'q' FROM generate_series(1, 3000) g`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `ANALYZE pgdurable.workflow_runs`)
	require.NoError(t, err)
	// A backlog the statistics do not know of: every run open and ready.
	_, err = db.Pool.Exec(ctx, `UPDATE pgdurable.workflow_runs SET status = 'pending', ready_at = now()`)
	require.NoError(t, err)

	ids, tokens, leases := make([]uuid.UUID, 40), make([]uuid.UUID, 40), make([]int64, 40)
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT array_agg(run_id) FROM (SELECT run_id FROM pgdurable.workflow_runs LIMIT 40) x`).Scan(&ids))
	for i := range tokens {
		tokens[i], leases[i] = uuid.New(), 30000
	}
	for name, stmt := range store.ClaimStatements {
		args := pgx.StrictNamedArgs{"run_id": ids, "token": tokens, "lease_ms": leases, "now": time.Now(), "flow_queue": "q"}
		values := make([]any, len(stmt.Names))
		for i, n := range stmt.Names {
			values[i] = args[n]
		}
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, "SET LOCAL plan_cache_mode = "+mode)
			require.NoError(t, err)
			rows, err := tx.Query(ctx, "EXPLAIN "+stmt.SQL, values...)
			require.NoError(t, err)
			lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			require.NoError(t, tx.Rollback(ctx))
			plan := strings.Join(lines, "\n")
			require.Contains(t, plan, "workflow_runs_pkey", "%s (%s):\n%s", name, mode, plan)
			require.NotContains(t, plan, "workflow_runs_open_status_idx", "%s (%s):\n%s", name, mode, plan)
		}
	}
}
