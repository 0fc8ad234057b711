package commands_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// migrate up --routes makes the routes of a new schema and says so;
// status shows them; a route whose schema lacks a migration stops serve
// until migrate up applies it; a schema with runs keeps its routes.
func TestMigrateUpWithRoutes(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	if enginetest.Routes() > 1 {
		t.Skip("the test database has its routes already")
	}
	// Base 10 only: a schema's routes never shrink, and an int flag would
	// read 0x10 as 16 and 010 as 8.
	for _, bad := range []string{"0x3", "0b11", "3.0", " 3"} {
		code, _, errOut := run(t, db, "migrate", "up", "--routes", bad)
		require.Equal(t, 2, code, "--routes %q: %s", bad, errOut)
		require.Contains(t, errOut, "is not a whole number in base 10")
	}
	code, out, errOut := run(t, db, "migrate", "up", "--routes", "3")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "routes: 3 (per-run tables in pgdurable, and pgdurable_r1 to pgdurable_r2)")
	if enginetest.Citus() {
		require.Contains(t, out, "route 2's per-run tables on Citus worker node")
	} else {
		require.Contains(t, out, "not a Citus coordinator with worker nodes")
	}
	code, out, _ = run(t, db, "migrate", "status")
	require.Equal(t, 0, code)
	require.Contains(t, out, "routes: 3")

	_, err := db.Pool.Exec(context.Background(), `ALTER TABLE pgdurable_r2.layout DROP COLUMN pins;
		DELETE FROM pgdurable_r2.pgdurable_schema_migrations WHERE version_id = 34`)
	require.NoError(t, err)
	code, out, _ = run(t, db, "migrate", "status")
	require.Equal(t, 0, code)
	require.Contains(t, out, "routes missing a migration: [2]")
	code, _, errOut = run(t, db, "serve", "--listen", freePort(t))
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "routes [2] of schema pgdurable lack a migration")
	code, _, errOut = run(t, db, "migrate", "up")
	require.Equal(t, 0, code, errOut)
	code, out, _ = run(t, db, "migrate", "status")
	require.Equal(t, 0, code)
	require.NotContains(t, out, "missing")

	_, err = db.Pool.Exec(context.Background(), db.SQL(`INSERT INTO pgdurable.workflow_runs (run_id, workflow_name, workflow_id, status, input)
		VALUES (gen_random_uuid(), 'w', 'id', 'pending', '{}')`))
	require.NoError(t, err)
	code, _, errOut = run(t, db, "migrate", "up", "--routes", "4")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "holds runs, so its routes stay 3")
	require.Contains(t, errOut, "leave --routes out to keep 3")
	code, out, _ = run(t, db, "--json", "migrate", "up", "--routes", "4")
	require.Equal(t, 1, code)
	require.Contains(t, out, `"invalid_parameter"`)
}
