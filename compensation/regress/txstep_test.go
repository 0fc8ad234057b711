package regress_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/compensation"
	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

func proxiedPool(t *testing.T, db *enginetest.DB, p *pgProxy) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.Host = "127.0.0.1"
	cfg.ConnConfig.Port = p.port()
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func bizCount(t *testing.T, db *enginetest.DB, name string) int {
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM biz WHERE name = $1`, name).Scan(&n))
	return n
}

// The COMMIT of the tx step reaches Postgres and commits, but its
// acknowledgement is lost (connection cut: a network blip, a PgBouncer
// restart, pg_terminate_backend right after the commit). The engine treats
// the commit error as a transient step failure and runs fn again.
func TestTxStepLostCommitAckDuplicatesRows(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	createEvents(t, db.Pool)
	p := startProxy(t, db, "dropack", 0)
	pool := proxiedPool(t, db, p)
	wf := engine.Define("txack", func(ctx *engine.Context, _ int) (string, error) {
		if _, err := engine.TxStep(ctx, "reserve", func(sctx context.Context, tx pgx.Tx) (int, error) {
			if _, err := tx.Exec(sctx, `SELECT 'attack_marker'`); err != nil {
				return 0, err
			}
			_, err := tx.Exec(sctx, `INSERT INTO biz (run_id, name) VALUES ($1, 'reserve')`, ctx.RunID())
			return 1, err
		}, nil); err != nil {
			return "", err
		}
		return "done", nil
	}, nil)
	e := newEngineOn(t, pool, nil, wf)
	res, err := wf.Start(context.Background(), e, 1, nil)
	require.NoError(t, err)
	run := waitStatus(t, e, res.RunID, 20*time.Second, engine.StatusCompleted, engine.StatusDead, engine.StatusFailed)
	dumpRun(t, run)
	require.True(t, p.fired.Load(), "the proxy dropped a commit ack")
	require.Equal(t, engine.StatusCompleted, run.Status)
	require.Equal(t, 1, bizCount(t, db, "reserve"), "a tx step's rows must exist exactly once")
}

// Cancel arrives while the tx step's COMMIT is in flight (answer delayed):
// Postgres commits the rows and the step's record, the engine sees a
// cancelled ctx and treats the step as not done: its undo is never registered,
// so the run ends cancelled with the reservation still in place.
func TestCancelDuringTxStepCommitLeavesEffectUndone(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	createEvents(t, db.Pool)
	p := startProxy(t, db, "delay", 2*time.Second)
	pool := proxiedPool(t, db, p)
	wf := engine.Define("txcancel", func(ctx *engine.Context, _ int) (string, error) {
		saga := compensation.New(ctx)
		if _, err := compensation.TxStep(saga, "reserve", func(sctx context.Context, tx pgx.Tx) (int, error) {
			if _, err := tx.Exec(sctx, `SELECT 'attack_marker'`); err != nil {
				return 0, err
			}
			_, err := tx.Exec(sctx, `INSERT INTO biz (run_id, name) VALUES ($1, 'reserve')`, ctx.RunID())
			return 1, err
		}, compensation.TxUndo[int]{Name: "release", Fn: func(uctx context.Context, tx pgx.Tx, _ int) error {
			_, err := tx.Exec(uctx, `DELETE FROM biz WHERE run_id = $1 AND name = 'reserve'`, ctx.RunID())
			return err
		}}, nil); err != nil {
			return "", err
		}
		return "done", nil
	}, nil)
	e := newEngineOn(t, pool, &engine.Config{LeaseDuration: 1500 * time.Millisecond}, wf)
	res, err := wf.Start(context.Background(), e, 1, nil)
	require.NoError(t, err)
	<-p.markSeen
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, e.Cancel(context.Background(), res.RunID))
	run := waitStatus(t, e, res.RunID, 20*time.Second, engine.StatusCancelled, engine.StatusCompleted, engine.StatusDead)
	dumpRun(t, run)
	t.Logf("final status %s, reserve rows left: %d", run.Status, bizCount(t, db, "reserve"))
	if run.Status == engine.StatusCancelled {
		require.Equal(t, 0, bizCount(t, db, "reserve"), "a cancelled run must not keep an un-undone tx step effect")
	}
}
