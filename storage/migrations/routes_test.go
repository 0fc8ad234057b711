package migrations_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/storage/migrations"
)

// routeTables counts, per route schema of schema, its per-run tables.
func routeTables(t *testing.T, db *enginetest.DB, schema string, routes int) []int {
	t.Helper()
	out := make([]int, routes)
	for k := range routes {
		require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = ANY ($2)`,
			migrations.RouteSchema(schema, k), migrations.RunTables).Scan(&out[k]))
	}
	return out
}

func TestMigrateMakesRoutes(t *testing.T) {
	t.Parallel()
	db := unmigratedDB(t)
	ctx := context.Background()
	const schema = migrations.DefaultSchema

	res, err := migrations.Migrate(ctx, db.Pool, migrations.Up, &migrations.Opts{Routes: 3})
	require.NoError(t, err)
	require.Equal(t, 3, res.Routes)
	require.Equal(t, []int{4, 4, 4}, routeTables(t, db, schema, 3))
	n, err := migrations.Routes(ctx, db.Pool, schema)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	schemas, err := migrations.Schemas(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, []string{schema}, schemas, "route schemas are not installations of their own")

	// Up again keeps the routes, and applies nothing anywhere.
	res, err = migrations.Migrate(ctx, db.Pool, migrations.Up, nil)
	require.NoError(t, err)
	require.Equal(t, 3, res.Routes)
	require.Empty(t, res.Applied)

	_, err = migrations.Migrate(ctx, db.Pool, migrations.Up, &migrations.Opts{Routes: 2})
	require.ErrorContains(t, err, "routes never shrink")
	_, err = migrations.Migrate(ctx, db.Pool, migrations.Up, &migrations.Opts{Routes: migrations.MaxRoutes + 1})
	require.ErrorContains(t, err, "out of range")

	// A run in any route fixes the routes: more would send its workflow
	// ID's next start to another route.
	_, err = db.Pool.Exec(ctx, `INSERT INTO pgdurable_r2.workflow_runs (run_id, workflow_name, workflow_id, status, input)
		VALUES (gen_random_uuid(), 'w', 'id', 'pending', '{}')`)
	require.NoError(t, err)
	_, err = migrations.Migrate(ctx, db.Pool, migrations.Up, &migrations.Opts{Routes: 4})
	require.ErrorContains(t, err, "holds runs")
	n, err = migrations.Routes(ctx, db.Pool, schema)
	require.NoError(t, err)
	require.Equal(t, 3, n)

	// Rolling back a migration rolls back every route; rolling back the
	// one that records the routes is refused while a route holds a run,
	// and drops the route schemas once none does.
	res, err = migrations.Migrate(ctx, db.Pool, migrations.Down, &migrations.Opts{Steps: 1})
	require.NoError(t, err)
	require.Equal(t, []int64{33}, res.Applied, "the migration after the routes'")
	_, err = migrations.Migrate(ctx, db.Pool, migrations.Down, &migrations.Opts{Steps: 1})
	require.ErrorContains(t, err, "route 2 holds runs")
	_, err = db.Pool.Exec(ctx, `DELETE FROM pgdurable_r2.workflow_runs`)
	require.NoError(t, err)
	res, err = migrations.Migrate(ctx, db.Pool, migrations.Down, &migrations.Opts{Steps: 2})
	require.NoError(t, err)
	require.Equal(t, []int64{32, 31}, res.Applied)
	var left int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'pgdurable\_r%'`).Scan(&left))
	require.Zero(t, left)

	res, err = migrations.Migrate(ctx, db.Pool, migrations.Up, &migrations.Opts{Routes: 2})
	require.NoError(t, err)
	require.Equal(t, []int64{31, 32, 33}, res.Applied)
	require.Equal(t, 2, res.Routes)
	require.Equal(t, []int{4, 4}, routeTables(t, db, schema, 2))

	// A migration pending in a route (as a later version's would be) is
	// applied there by the next Up.
	_, err = db.Pool.Exec(ctx, `DROP FUNCTION pgdurable_r1.two_phase_commit(); DROP TABLE pgdurable_r1.two_phase_commits;
		DELETE FROM pgdurable_r1.`+migrations.VersionTable+` WHERE version_id = 33`)
	require.NoError(t, err)
	res, err = migrations.Migrate(ctx, db.Pool, migrations.Up, nil)
	require.NoError(t, err)
	require.Empty(t, res.Applied, "route 0 had nothing pending")
	var back bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT to_regclass('pgdurable_r1.two_phase_commits') IS NOT NULL`).Scan(&back))
	require.True(t, back)
}

// Routes take no schema they did not make, a route schema is migrated only
// with its installation, more routes wait for the engines to stop, and
// routes out of range change nothing.
func TestMigrateRoutesRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	db := unmigratedDB(t)
	_, err := migrations.Migrate(ctx, db.Pool, migrations.Up, &migrations.Opts{Routes: migrations.MaxRoutes + 1})
	require.ErrorContains(t, err, "out of range: 1 to 256, or 0 to keep the schema's")
	var exists bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT to_regnamespace('pgdurable') IS NOT NULL`).Scan(&exists))
	require.False(t, exists, "a refused Up changes nothing")

	// Another installation in the schema route 1 would take.
	_, err = migrations.Migrate(ctx, db.Pool, migrations.Up, &migrations.Opts{Schema: "pgdurable_r1"})
	require.NoError(t, err)
	_, err = migrations.Migrate(ctx, db.Pool, migrations.Up, &migrations.Opts{Routes: 2})
	require.ErrorContains(t, err, "schema pgdurable_r1, which route 1 of schema pgdurable would use, exists and is not that route")

	other := unmigratedDB(t)
	_, err = migrations.Migrate(ctx, other.Pool, migrations.Up, &migrations.Opts{Routes: 2})
	require.NoError(t, err)
	_, err = migrations.Migrate(ctx, other.Pool, migrations.Up, &migrations.Opts{Schema: "pgdurable_r1"})
	require.ErrorContains(t, err, "schema pgdurable_r1 is a route of another schema (route 1 of pgdurable)")

	// An engine process seen lately holds the routes as they are.
	_, err = other.Pool.Exec(ctx, `INSERT INTO pgdurable.engine_processes (process_id, hostname, pid, queue, workflows)
		VALUES (gen_random_uuid(), 'h', 1, 'default', '[]')`)
	require.NoError(t, err)
	_, err = migrations.Migrate(ctx, other.Pool, migrations.Up, &migrations.Opts{Routes: 3})
	require.ErrorIs(t, err, migrations.ErrEnginesRunning)
	n, err := migrations.Routes(ctx, other.Pool, migrations.DefaultSchema)
	require.NoError(t, err)
	require.Equal(t, 2, n)
}
