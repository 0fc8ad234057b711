package citus_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/internal/citus/citustest"
	"github.com/pgdurable/pgdurable/storage/migrations"
)

// A tx step that writes a coordinator table commits its writes and its
// record (on a worker node) in two phases: Citus would otherwise commit
// the worker node's part first and the coordinator's after it, and a
// crash or a failed commit between the two would keep the record without
// the writes. Each such step shows as a PREPARE TRANSACTION on the worker
// node of its run; steps that write the worker node alone commit in one.
func TestTxStepsWritingTheCoordinatorCommitInTwoPhases(t *testing.T) {
	t.Parallel()
	c := citustest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := coordinatorPool(ctx, t, c)
	_, err := migrations.Migrate(ctx, pool, migrations.Up, &migrations.Opts{Routes: 2})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE TABLE reservations (run text PRIMARY KEY)`)
	require.NoError(t, err)

	reserve := engine.Define("two-phase-reserve", func(ctx *engine.Context, in int) (int, error) {
		return engine.TxStep(ctx, "reserve", func(sctx context.Context, tx pgx.Tx) (int, error) {
			_, err := tx.Exec(sctx, `INSERT INTO reservations (run) VALUES ($1)`, ctx.RunID().String())
			return in, err
		}, nil)
	}, nil)
	plain := engine.Define("two-phase-plain", func(ctx *engine.Context, in int) (int, error) {
		for i := range 3 {
			if _, err := engine.Step(ctx, fmt.Sprint("s", i), func(context.Context) (int, error) { return i, nil }, nil); err != nil {
				return 0, err
			}
		}
		return in, nil
	}, nil)
	e, err := engine.New(pool, &engine.Config{MaxWorkers: 20})
	require.NoError(t, err)
	require.NoError(t, e.Register(reserve, plain))
	require.NoError(t, e.Start(ctx))
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		require.NoError(t, e.Stop(sctx))
	}()

	// preparedBy runs n runs of wf one after another and returns the
	// PREPARE TRANSACTIONs they took on the worker nodes.
	const n = 40
	preparedBy := func(wf *engine.Workflow[int, int]) int64 {
		require.NoError(t, c.ResetStatements(ctx))
		for i := range n {
			res, err := wf.Start(ctx, e, i, nil)
			require.NoError(t, err)
			_, err = wf.Wait(ctx, e, res.RunID, 10*time.Millisecond)
			require.NoError(t, err)
		}
		work, err := c.Work(ctx)
		require.NoError(t, err)
		var prepared int64
		for _, w := range work[1:] {
			prepared += w.Prepared
		}
		return prepared
	}
	plainPrepared := preparedBy(plain)
	t.Logf("%d runs of 3 plain steps: %d two-phase commits on the worker nodes", n, plainPrepared)
	require.Less(t, plainPrepared, int64(n), "plain steps' records commit in one phase")

	txPrepared := preparedBy(reserve)
	t.Logf("%d runs of one tx step writing a coordinator table: %d two-phase commits on the worker nodes", n, txPrepared)
	require.GreaterOrEqual(t, txPrepared, int64(n), "each tx step's transaction commits in two phases")
	var rows int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM reservations`).Scan(&rows))
	require.Equal(t, n, rows)
}
