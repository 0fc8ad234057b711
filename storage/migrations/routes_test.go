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
	res, err = migrations.Migrate(ctx, db.Pool, migrations.Down, &migrations.Opts{Steps: 2})
	require.NoError(t, err)
	require.Equal(t, []int64{34, 33}, res.Applied, "the migrations after the routes'")
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
	require.Equal(t, []int64{31, 32, 33, 34}, res.Applied)
	require.Equal(t, 2, res.Routes)
	require.Equal(t, []int{4, 4}, routeTables(t, db, schema, 2))

	// A migration pending in a route (as a later version's would be) is
	// applied there by the next Up.
	_, err = db.Pool.Exec(ctx, `ALTER TABLE pgdurable_r1.layout DROP COLUMN pins;
		DELETE FROM pgdurable_r1.`+migrations.VersionTable+` WHERE version_id = 34`)
	require.NoError(t, err)
	res, err = migrations.Migrate(ctx, db.Pool, migrations.Up, nil)
	require.NoError(t, err)
	require.Empty(t, res.Applied, "route 0 had nothing pending")
	var back bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns
		WHERE table_schema = 'pgdurable_r1' AND table_name = 'layout' AND column_name = 'pins')`).Scan(&back))
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

// A schema of one route that holds runs can be given routes: its runs stay
// in route 0, with their keys pinned there (layout.pins), and the
// migration that adds the pins cannot be rolled back while they are set;
// routes made before a schema held a run have none.
func TestMigrateRoutesOfASchemaWithRunsPinsThem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := unmigratedDB(t)
	_, err := migrations.Migrate(ctx, db.Pool, migrations.Up, nil)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO pgdurable.workflow_runs (run_id, workflow_name, workflow_id, status, input, dedup_id, flow_queue)
		VALUES (gen_random_uuid(), 'w', 'id', 'pending', '{}', 'once', 'q')`)
	require.NoError(t, err)
	res, err := migrations.Migrate(ctx, db.Pool, migrations.Up, &migrations.Opts{Routes: 3})
	require.NoError(t, err)
	require.Equal(t, 3, res.Routes)
	var pins []byte
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pins FROM pgdurable.layout`).Scan(&pins))
	f, err := migrations.ParsePins(pins)
	require.NoError(t, err)
	require.True(t, f.Has(migrations.WorkflowKey("w", "id")))
	require.True(t, f.Has(migrations.DedupKey("q", "once")))
	require.False(t, f.Has(migrations.WorkflowKey("w", "other")))
	var count int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgdurable.workflow_runs`).Scan(&count))
	require.Equal(t, 1, count, "the run stays in route 0")

	_, err = migrations.Migrate(ctx, db.Pool, migrations.Down, &migrations.Opts{Steps: 1})
	require.ErrorContains(t, err, "keep the runs it held before them in route 0")
	var still []byte
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pins FROM pgdurable.layout`).Scan(&still))
	require.Equal(t, pins, still, "the refused rollback changed nothing")

	// A run whose workflow ID looks like a run ID of a layout with
	// routes (version 8, route 1 in its last byte) would be looked for in
	// that route: refused.
	odd := unmigratedDB(t)
	_, err = migrations.Migrate(ctx, odd.Pool, migrations.Up, nil)
	require.NoError(t, err)
	_, err = odd.Pool.Exec(ctx, `INSERT INTO pgdurable.workflow_runs (run_id, workflow_name, workflow_id, status, input)
		VALUES (gen_random_uuid(), 'w', '01a24a48-7402-863d-8724-32a2352a9f01', 'pending', '{}')`)
	require.NoError(t, err)
	_, err = migrations.Migrate(ctx, odd.Pool, migrations.Up, &migrations.Opts{Routes: 2})
	require.ErrorIs(t, err, migrations.ErrRoutesRefused)
	require.ErrorContains(t, err, `look like the run IDs of a layout with routes (version 8 UUIDs, the last byte a route below 2: "01a24a48-7402-863d-8724-32a2352a9f01" of "w")`)
	n, err := migrations.Routes(ctx, odd.Pool, migrations.DefaultSchema)
	require.NoError(t, err)
	require.Equal(t, 1, n, "nothing recorded")
	var made bool
	require.NoError(t, odd.Pool.QueryRow(ctx, `SELECT to_regnamespace('pgdurable_r1') IS NOT NULL`).Scan(&made))
	require.False(t, made, "nor any route made")

	fresh := unmigratedDB(t)
	_, err = migrations.Migrate(ctx, fresh.Pool, migrations.Up, &migrations.Opts{Routes: 2})
	require.NoError(t, err)
	require.NoError(t, fresh.Pool.QueryRow(ctx, `SELECT pins FROM pgdurable.layout`).Scan(&pins))
	require.Nil(t, pins)
}
