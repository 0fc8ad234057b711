package citus_test

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/cmd/engine/commands"
	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/internal/citus"
	"github.com/pgdurable/pgdurable/internal/citus/citustest"
	"github.com/pgdurable/pgdurable/storage/migrations"
)

// The cluster is a coordinator with 2 active worker nodes; the engine
// migrates onto its coordinator, which puts the per-run tables on a worker
// node and keeps River's and the rest on the coordinator, and runs
// workflows there.
func TestEngineRunsOnACitusCoordinator(t *testing.T) {
	t.Parallel()
	c := citustest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := coordinatorPool(ctx, t, c)
	var workers int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM citus_get_active_worker_nodes()`).Scan(&workers))
	require.Equal(t, 2, workers)
	res, err := migrations.Migrate(ctx, pool, migrations.Up, nil)
	require.NoError(t, err)
	requireOnAWorker(ctx, t, c, pool, res.Distributed)

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

// coordinatorPool is a pool of 20 connections to c's coordinator, closed
// when t ends.
func coordinatorPool(ctx context.Context, t *testing.T, c *citus.Cluster) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(c.URL())
	require.NoError(t, err)
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// disableWorkers disables c's worker nodes, so that the coordinator keeps
// its tables, as a database migrated before migrate distributed anything
// has them; the func it returns activates them again.
func disableWorkers(ctx context.Context, t *testing.T, c *citus.Cluster, pool *pgxpool.Pool) (activate func()) {
	t.Helper()
	var hosts []*url.URL
	for _, w := range c.Workers {
		u, err := url.Parse(w.URL)
		require.NoError(t, err)
		hosts = append(hosts, u)
		_, err = pool.Exec(ctx, `SELECT citus_disable_node($1, $2::int, synchronous => true)`, u.Hostname(), u.Port())
		require.NoError(t, err)
	}
	return func() {
		for _, u := range hosts {
			_, err := pool.Exec(ctx, `SELECT citus_activate_node($1, $2::int)`, u.Hostname(), u.Port())
			require.NoError(t, err)
		}
	}
}

// requireOnAWorker fails unless node is one of c's worker nodes and holds
// every per-run table, and River's tables and the engine's others are the
// coordinator's own (the one the engine's two-phase commits update a
// Citus local table, on the coordinator).
func requireOnAWorker(ctx context.Context, t *testing.T, c *citus.Cluster, pool *pgxpool.Pool, node string) {
	t.Helper()
	var workers []string
	for _, w := range c.Workers {
		u, err := url.Parse(w.URL)
		require.NoError(t, err)
		workers = append(workers, u.Host)
	}
	require.Contains(t, workers, node, "the per-run tables' node")
	rows, err := pool.Query(ctx, `SELECT table_name::text, nodename || ':' || nodeport FROM citus_shards ORDER BY 1`)
	require.NoError(t, err)
	placed := map[string]string{}
	for rows.Next() {
		var table, at string
		require.NoError(t, rows.Scan(&table, &at))
		placed[table] = at
	}
	require.NoError(t, rows.Err())
	coordinator, err := url.Parse(c.URL())
	require.NoError(t, err)
	want := map[string]string{"pgdurable.two_phase_commits": coordinator.Host}
	for _, table := range migrations.RunTables {
		want["pgdurable."+table] = node
	}
	require.Equal(t, want, placed, "only the per-run tables are distributed, all on one node")
}

// migrate up converts a database whose per-run tables are the
// coordinator's, with their rows, and every migration rolls back and
// applies again on the distributed tables (Citus takes one constraint per
// ALTER TABLE there).
func TestMigrateDistributesAnExistingDatabase(t *testing.T) {
	t.Parallel()
	c := citustest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, c.URL())
	require.NoError(t, err)
	defer pool.Close()
	// With its worker nodes disabled, the coordinator keeps its tables, as
	// a database migrated before migrate distributed anything has them.
	activate := disableWorkers(ctx, t, c, pool)
	res, err := migrations.Migrate(ctx, pool, migrations.Up, nil)
	require.NoError(t, err)
	require.Empty(t, res.Distributed, "a coordinator alone keeps its tables")
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_dist_partition`).Scan(&n))
	require.Zero(t, n)
	// Another installation's per-run tables, made reference tables by hand.
	_, err = migrations.Migrate(ctx, pool, migrations.Up, &migrations.Opts{Schema: "by_hand"})
	require.NoError(t, err)
	for _, table := range migrations.RunTables {
		_, err = pool.Exec(ctx, `SELECT create_reference_table($1::regclass)`, "by_hand."+table)
		require.NoError(t, err)
	}
	activate()
	runID := uuid.New()
	_, err = pool.Exec(ctx, `INSERT INTO pgdurable.workflow_runs (run_id, workflow_name, workflow_id, input, queue) VALUES ($1, 'w', 'kept', '{}', 'q')`, runID)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO pgdurable.workflow_steps (run_id, seq, name, status) VALUES ($1, 0, 's', 'started')`, runID)
	require.NoError(t, err)

	// Refused, changing nothing: a foreign key of an application's table
	// to the runs, which Citus could not keep; an engine process at work.
	_, err = pool.Exec(ctx, `CREATE TABLE public.app_orders (id int, run_id uuid REFERENCES pgdurable.workflow_runs (run_id))`)
	require.NoError(t, err)
	_, err = migrations.Migrate(ctx, pool, migrations.Up, nil)
	require.ErrorIs(t, err, migrations.ErrDistributionRefused)
	require.ErrorContains(t, err, "foreign keys of other tables refer to them (public.app_orders (app_orders_run_id_fkey))")
	// Asked for routes too, it refuses before making them.
	_, err = migrations.Migrate(ctx, pool, migrations.Up, &migrations.Opts{Routes: 2})
	require.ErrorIs(t, err, migrations.ErrDistributionRefused)
	routes, err := migrations.Routes(ctx, pool, "pgdurable")
	require.NoError(t, err)
	require.Equal(t, 1, routes, "no route made")
	var routeSchema bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'pgdurable_r1')`).Scan(&routeSchema))
	require.False(t, routeSchema, "no route's schema made")
	_, err = pool.Exec(ctx, `DROP TABLE public.app_orders`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO pgdurable.engine_processes (process_id, hostname, pid, queue, workflows) VALUES ($1, 'old-engine', 7, 'pgdurable', '[]')`, uuid.New())
	require.NoError(t, err)
	_, err = migrations.Migrate(ctx, pool, migrations.Up, nil)
	require.ErrorIs(t, err, migrations.ErrEnginesRunning)
	require.ErrorContains(t, err, "old-engine (pid 7")
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::text LIKE 'pgdurable.%'`).Scan(&n))
	require.Zero(t, n, "nothing moved")
	_, err = pool.Exec(ctx, `DELETE FROM pgdurable.engine_processes`)
	require.NoError(t, err)

	_, err = migrations.Migrate(ctx, pool, migrations.Up, &migrations.Opts{Schema: "by_hand"})
	require.ErrorContains(t, err, "by_hand.workflow_runs, by_hand.workflow_steps, by_hand.workflow_signals, by_hand.dead_jobs distributed otherwise")
	_, err = pool.Exec(ctx, `DROP SCHEMA by_hand CASCADE`)
	require.NoError(t, err)

	res, err = migrations.Migrate(ctx, pool, migrations.Up, nil)
	require.NoError(t, err)
	requireOnAWorker(ctx, t, c, pool, res.Distributed)
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgdurable.workflow_runs r JOIN pgdurable.workflow_steps s USING (run_id) WHERE r.run_id = $1`, runID).Scan(&n))
	require.Equal(t, 1, n, "the run and its step moved with the tables")
	res, err = migrations.Migrate(ctx, pool, migrations.Up, nil)
	require.NoError(t, err)
	require.Empty(t, res.Distributed, "done once")

	_, err = migrations.Migrate(ctx, pool, migrations.Down, &migrations.Opts{Steps: 10})
	require.NoError(t, err)
	res, err = migrations.Migrate(ctx, pool, migrations.Up, nil)
	require.NoError(t, err)
	require.Len(t, res.Applied, 10)
	_, err = migrations.Migrate(ctx, pool, migrations.Down, &migrations.Opts{IncludeRiver: true})
	require.NoError(t, err)
	res, err = migrations.Migrate(ctx, pool, migrations.Up, nil)
	require.NoError(t, err)
	requireOnAWorker(ctx, t, c, pool, res.Distributed)

	// A schema on the connection's search_path (where PostgreSQL names its
	// tables without their schema) is distributed the same way.
	cfg, err := pgxpool.ParseConfig(c.URL())
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = "acme"
	acme, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer acme.Close()
	res, err = migrations.Migrate(ctx, acme, migrations.Up, &migrations.Opts{Schema: "acme"})
	require.NoError(t, err)
	require.NotEmpty(t, res.Distributed)
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM citus_shards WHERE table_name::text LIKE 'acme.%' AND table_name::text <> 'acme.two_phase_commits'`).Scan(&n))
	require.Equal(t, len(migrations.RunTables), n)
}

// With routes, migrate up places each route's per-run tables on a worker
// node of its own (round robin), and the engine's runs divide among them.
func TestRoutesSpreadRunsOverTheWorkers(t *testing.T) {
	t.Parallel()
	c := citustest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := coordinatorPool(ctx, t, c)
	res, err := migrations.Migrate(ctx, pool, migrations.Up, &migrations.Opts{Routes: 4})
	require.NoError(t, err)
	require.Equal(t, 4, res.Routes)
	require.Len(t, res.Placed, 4)
	var workers []string
	for _, w := range c.Workers {
		u, err := url.Parse(w.URL)
		require.NoError(t, err)
		workers = append(workers, u.Host)
	}
	require.ElementsMatch(t, workers, []string{res.Placed[0], res.Placed[1]}, "routes 0 and 1 on the two worker nodes")
	require.Equal(t, res.Placed[0], res.Placed[2])
	require.Equal(t, res.Placed[1], res.Placed[3])

	wf := engine.Define("citus-routed", func(ctx *engine.Context, in int) (int, error) {
		for i := range 3 {
			if _, err := engine.Step(ctx, fmt.Sprint("s", i), func(context.Context) (int, error) { return i, nil }, nil); err != nil {
				return 0, err
			}
		}
		return in * 2, nil
	}, nil)
	kid := engine.Define("citus-kid", func(ctx *engine.Context, in int) (int, error) { return in + 1, nil }, nil)
	parent := engine.Define("citus-parent", func(ctx *engine.Context, n int) (int, error) {
		var kids []*engine.ChildRun[int]
		for i := range n {
			c, err := engine.StartChild(ctx, kid, i, &engine.ChildOpts{WorkflowID: fmt.Sprint(ctx.RunID(), "-kid-", i)})
			if err != nil {
				return 0, err
			}
			kids = append(kids, c)
		}
		sum := 0
		for _, c := range kids {
			v, err := c.Get(ctx)
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	}, nil)
	e, err := engine.New(pool, nil)
	require.NoError(t, err)
	require.NoError(t, e.Register(wf, kid, parent))
	require.NoError(t, e.Start(ctx))
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		require.NoError(t, e.Stop(sctx))
	}()
	// Children in other routes (worker nodes) than their parent.
	for range 3 {
		res, err := parent.Start(ctx, e, 8, nil)
		require.NoError(t, err)
		out, err := parent.Wait(ctx, e, res.RunID, 10*time.Millisecond)
		require.NoError(t, err)
		require.Equal(t, 36, out)
	}
	for i := range 40 {
		opts := &engine.StartOpts{}
		if i%2 == 0 {
			opts.WorkflowID = fmt.Sprint("order-", i) // routed by its workflow ID; the rest by the engine
		}
		res, err := wf.Start(ctx, e, i, opts)
		require.NoError(t, err)
		out, err := wf.Wait(ctx, e, res.RunID, 10*time.Millisecond)
		require.NoError(t, err)
		require.Equal(t, i*2, out)
	}
	for k := range 4 {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+migrations.RouteSchema(migrations.DefaultSchema, k)+`.workflow_runs WHERE status = 'completed'`).Scan(&n))
		require.Positive(t, n, "route %d's runs", k)
	}
	runs, _, err := e.ListRuns(ctx, engine.ListRunsParams{Limit: 100})
	require.NoError(t, err)
	require.Len(t, runs, 40+3+24, "a list reads every route")
}

// A single-node database that holds runs becomes a layout of routes over
// the worker nodes in one migrate up --routes: its runs move with route
// 0's tables to a worker node and stay in route 0, where a start of their
// workflow IDs finds them and their open runs finish; new workflow IDs
// spread over both nodes. A schema already on one worker node with runs
// is given routes the same way.
func TestMigrateGivesRoutesToADatabaseWithRuns(t *testing.T) {
	t.Parallel()
	c := citustest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pool := coordinatorPool(ctx, t, c)
	activate := disableWorkers(ctx, t, c, pool)
	res, err := migrations.Migrate(ctx, pool, migrations.Up, nil)
	require.NoError(t, err)
	require.Empty(t, res.Distributed, "a coordinator alone keeps its tables")

	waiter := engine.Define("citus-legacy", func(ctx *engine.Context, in int) (int, error) {
		n, err := engine.AwaitSignal[int](ctx, "go", 0)
		if err != nil {
			return 0, err
		}
		return in + n, nil
	}, nil)
	newEngine := func() *engine.Engine {
		e, err := engine.New(pool, nil)
		require.NoError(t, err)
		require.NoError(t, e.Register(waiter))
		require.NoError(t, e.Start(ctx))
		return e
	}
	before := newEngine()
	const legacy = 20
	var ids []uuid.UUID
	for i := range legacy {
		res, err := waiter.Start(ctx, before, i, &engine.StartOpts{WorkflowID: fmt.Sprint("legacy-", i)})
		require.NoError(t, err)
		ids = append(ids, res.RunID)
	}
	for _, id := range ids {
		require.Eventually(t, func() bool {
			r, err := before.GetRun(ctx, id)
			require.NoError(t, err)
			return r.Status == engine.StatusWaiting
		}, 30*time.Second, 20*time.Millisecond)
	}
	require.NoError(t, before.Stop(ctx))

	activate()
	res, err = migrations.Migrate(ctx, pool, migrations.Up, &migrations.Opts{Routes: 2})
	require.NoError(t, err)
	require.Equal(t, 2, res.Routes)
	require.Len(t, res.Placed, 2)
	require.NotEqual(t, res.Placed[0], res.Placed[1], "a route on each worker node")
	require.Equal(t, res.Placed[0], res.Distributed, "the node route 0's tables are on")
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgdurable.workflow_runs`).Scan(&n))
	require.Equal(t, legacy, n, "the runs stay in route 0, on its worker node")

	after := newEngine()
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		require.NoError(t, after.Stop(sctx))
	}()
	for i, id := range ids {
		res, err := waiter.Start(ctx, after, i, &engine.StartOpts{WorkflowID: fmt.Sprint("legacy-", i)})
		require.NoError(t, err)
		require.Equal(t, id, res.RunID, "a start of a workflow ID finds its run")
		require.NoError(t, after.Signal(ctx, fmt.Sprint("legacy-", i), "go", 100, nil))
	}
	for i, id := range ids {
		out, err := waiter.Wait(ctx, after, id, 10*time.Millisecond)
		require.NoError(t, err)
		require.Equal(t, i+100, out)
	}
	for i := range 20 {
		res, err := waiter.Start(ctx, after, i, &engine.StartOpts{WorkflowID: fmt.Sprint("new-", i)})
		require.NoError(t, err)
		require.NoError(t, after.Signal(ctx, res.RunID.String(), "go", 1, nil))
		out, err := waiter.Wait(ctx, after, res.RunID, 10*time.Millisecond)
		require.NoError(t, err)
		require.Equal(t, i+1, out)
	}
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgdurable_r1.workflow_runs WHERE status = 'completed'`).Scan(&n))
	require.Positive(t, n, "new workflow IDs in route 1, on the other node")
	// The table sizes (pgdurable_table_bytes) are the shards' on the
	// worker nodes, over both routes, not the coordinator's empty tables.
	stats, err := after.Stats(ctx)
	require.NoError(t, err)
	var shards, shells int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT citus_total_relation_size('pgdurable.workflow_runs') + citus_total_relation_size('pgdurable_r1.workflow_runs'),
		pg_total_relation_size('pgdurable.workflow_runs') + pg_total_relation_size('pgdurable_r1.workflow_runs')`).Scan(&shards, &shells))
	require.NotEqual(t, shells, shards)
	require.InEpsilon(t, shards, stats.TableBytes["workflow_runs"], 0.25)

	// A worker node's database is refused: the engine works on the
	// coordinator's.
	wpool, err := pgxpool.New(ctx, c.Workers[0].URL)
	require.NoError(t, err)
	defer wpool.Close()
	_, err = migrations.Migrate(ctx, wpool, migrations.Up, nil)
	require.ErrorIs(t, err, migrations.ErrCitusWorker)
	_, err = migrations.GetStatus(ctx, wpool, nil)
	require.ErrorIs(t, err, migrations.ErrCitusWorker)
	// So is it by a command that only reads, which would otherwise list
	// that node's share of the runs as if it were all of them.
	for _, args := range [][]string{{"runs", "list"}, {"--json", "dead", "list"}} {
		var out bytes.Buffer
		code := commands.Execute(ctx, append([]string{"--database-url", c.Workers[0].URL}, args...),
			commands.Options{Stdout: &out, Stderr: &out, Getenv: func(string) string { return "" }})
		require.Equal(t, 1, code, "engine %v on a worker node: %s", args, out.String())
		require.Contains(t, out.String(), "connect to the coordinator's database instead")
	}

	// A schema of one route already on a worker node, with a run.
	_, err = migrations.Migrate(ctx, pool, migrations.Up, &migrations.Opts{Schema: "second"})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO second.workflow_runs (run_id, workflow_name, workflow_id, input, queue) VALUES ($1, 'w', 'kept', '{}', 'q')`, uuid.New())
	require.NoError(t, err)
	res, err = migrations.Migrate(ctx, pool, migrations.Up, &migrations.Opts{Schema: "second", Routes: 2})
	require.NoError(t, err)
	require.Equal(t, 2, res.Routes)
	var pinned bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT pins IS NOT NULL FROM second.layout`).Scan(&pinned))
	require.True(t, pinned)
}
