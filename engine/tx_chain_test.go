package engine_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
)

// reserve is a tx step that inserts note, calling hook (if any) after.
func reserve(ctx *engine.Context, name, note string, hook func(n int64) error, calls *atomic.Int64) error {
	_, err := engine.TxStep(ctx, name, func(sctx context.Context, tx pgx.Tx) (int, error) {
		n := calls.Add(1)
		if _, err := tx.Exec(sctx, `INSERT INTO reservations VALUES ($1, $2)`, ctx.RunID(), note); err != nil {
			return 0, err
		}
		if hook != nil {
			return 0, hook(n)
		}
		return 0, nil
	}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: 10 * time.Millisecond}})
	return err
}

// Consecutive tx steps share one transaction: a step that fails rolls
// back alone (the steps before it commit with their records, and are not
// run again), and a step of another kind after them sees their rows.
func TestChainedTxStepsFailAloneAndAreVisibleAfter(t *testing.T) {
	t.Parallel()
	var a, b, c atomic.Int64
	var pool atomic.Pointer[pgxpool.Pool]
	wf := engine.Define("tx-chain", func(ctx *engine.Context, in int) (int, error) {
		if err := reserve(ctx, "a", "a", nil, &a); err != nil {
			return 0, err
		}
		if err := reserve(ctx, "b", "b", func(n int64) error {
			if n == 1 {
				return errors.New("deadlock detected") // after its insert: rolled back to its savepoint
			}
			return nil
		}, &b); err != nil {
			return 0, err
		}
		if err := reserve(ctx, "c", "c", nil, &c); err != nil {
			return 0, err
		}
		return engine.Step(ctx, "count", func(sctx context.Context) (int, error) {
			var n int
			err := pool.Load().QueryRow(sctx, `SELECT count(*) FROM reservations WHERE run_id = $1`, ctx.RunID()).Scan(&n)
			return n, err
		}, nil)
	}, nil)
	bn := setup(t, nil, wf)
	pool.Store(bn.db.Pool)
	createReservations(t, bn)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, bn.engine, 1, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, bn.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 3, out, "the plain step after the chain sees its rows")
	require.ElementsMatch(t, []string{"a", "b", "c"}, reservations(t, bn, res.RunID))
	require.EqualValues(t, 1, a.Load(), "a committed before b's retry: not run again")
	require.EqualValues(t, 2, b.Load())
	require.EqualValues(t, 1, c.Load())
	run, err := bn.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, 2, run.Steps[1].Attempts)
}

// A connection cut under a chained step takes the steps before it down
// too (they never committed): the run goes back to its queue, the next
// delivery runs them again and the step alone, and each row is written
// once.
func TestChainedTxStepsSurviveTheirConnectionKilled(t *testing.T) {
	t.Parallel()
	var a, b atomic.Int64
	inTx := make(chan struct{})
	release := make(chan struct{})
	wf := engine.Define("tx-chain-killed", func(ctx *engine.Context, in int) (int, error) {
		if err := reserve(ctx, "a", "a", nil, &a); err != nil {
			return 0, err
		}
		if err := reserve(ctx, "b", "chain-killed", func(n int64) error {
			if n == 1 {
				close(inTx)
				<-release // its backend is terminated meanwhile
			}
			return nil
		}, &b); err != nil {
			return 0, err
		}
		return 1, nil
	}, nil)
	bn := setup(t, nil, wf)
	createReservations(t, bn)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, bn.engine, 1, nil)
	require.NoError(t, err)
	<-inTx
	var killed int
	require.NoError(t, bn.db.Pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND state LIKE 'idle in transaction%' AND query LIKE '%reservations%'`).Scan(&killed))
	require.Equal(t, 1, killed)
	close(release)
	_, err = wf.Wait(ctx, bn.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"a", "chain-killed"}, reservations(t, bn, res.RunID))
	require.EqualValues(t, 2, a.Load(), "a rolled back with the chain and ran again")
	require.EqualValues(t, 2, b.Load())
	run, err := bn.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, 2, run.Deliveries, "handed back at once, not after the lease")
}

// A chained step whose first statement does not prepare (its Parse would
// abort the shared transaction before its savepoint) commits the steps
// before it first, then fails alone.
func TestChainedTxStepWithABadStatementFailsAlone(t *testing.T) {
	t.Parallel()
	var a atomic.Int64
	wf := engine.Define("tx-chain-bad-sql", func(ctx *engine.Context, in int) (int, error) {
		if err := reserve(ctx, "a", "a", nil, &a); err != nil {
			return 0, err
		}
		return engine.TxStep(ctx, "bad", func(sctx context.Context, tx pgx.Tx) (int, error) {
			if _, err := tx.Exec(sctx, `INSERT INTO no_such_table VALUES ($1)`, 1); err != nil {
				return 0, engine.Permanent(err)
			}
			return 1, nil
		}, nil)
	}, nil)
	bn := setup(t, nil, wf)
	createReservations(t, bn)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, bn.engine, 1, nil)
	require.NoError(t, err)
	run := waitStatus(t, bn.engine, res.RunID, engine.StatusFailed, 10*time.Second)
	require.Contains(t, run.Error.Message, "no_such_table")
	require.Equal(t, []string{"a"}, reservations(t, bn, res.RunID))
	require.EqualValues(t, 1, a.Load())
	require.Equal(t, "completed", string(run.Steps[0].Status))
}
