package citus_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/internal/citus/citustest"
	"github.com/pgdurable/pgdurable/storage/migrations"
)

// The cluster is a coordinator with 2 active worker nodes, and the engine
// migrates onto its coordinator and runs workflows there, every table
// local to the coordinator.
func TestEngineRunsOnACitusCoordinator(t *testing.T) {
	t.Parallel()
	c := citustest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(c.URL())
	require.NoError(t, err)
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	var workers int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM citus_get_active_worker_nodes()`).Scan(&workers))
	require.Equal(t, 2, workers)
	_, err = migrations.Migrate(ctx, pool, migrations.Up, nil)
	require.NoError(t, err)

	wf := engine.Define("citus-three-steps", func(ctx *engine.Context, in int) (int, error) {
		for i := range 3 {
			if _, err := engine.Step(ctx, fmt.Sprint("s", i), func(context.Context) (int, error) { return i, nil }, nil); err != nil {
				return 0, err
			}
		}
		return in * 2, nil
	}, nil)
	e, err := engine.New(pool, nil)
	require.NoError(t, err)
	require.NoError(t, e.Register(wf))
	require.NoError(t, e.Start(ctx))
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		require.NoError(t, e.Stop(sctx))
	}()
	for i := range 20 {
		res, err := wf.Start(ctx, e, i, nil)
		require.NoError(t, err)
		out, err := wf.Wait(ctx, e, res.RunID, 10*time.Millisecond)
		require.NoError(t, err)
		require.Equal(t, i*2, out)
	}
}
