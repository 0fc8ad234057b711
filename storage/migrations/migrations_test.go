package migrations_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/storage/migrations"
)

func TestMigrateIsIdempotentAndReversible(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t) // already migrated up
	ctx := context.Background()

	res, err := migrations.Migrate(ctx, db.Pool, migrations.Up, nil)
	require.NoError(t, err)
	require.Empty(t, res.Applied, "a second Up applies nothing")
	require.Empty(t, res.River)

	st, err := migrations.GetStatus(ctx, db.Pool, nil)
	require.NoError(t, err)
	require.NotEmpty(t, st.Migrations)
	for _, m := range st.Migrations {
		require.True(t, m.Applied, m.Name)
	}
	require.Positive(t, st.RiverVersion)

	res, err = migrations.Migrate(ctx, db.Pool, migrations.Down, &migrations.Opts{IncludeRiver: true})
	require.NoError(t, err)
	require.Equal(t, []int64{34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1}, res.Applied, "newest first")
	require.NotEmpty(t, res.River)
	var tables int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'pgdurable'
		AND tablename IN ('workflow_runs', 'workflow_steps', 'dead_jobs', 'workflow_signals', 'schedules', 'schedule_fires', 'river_job')`).Scan(&tables))
	require.Zero(t, tables)

	res, err = migrations.Migrate(ctx, db.Pool, migrations.Up, nil)
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34}, res.Applied)
	require.NotEmpty(t, res.River)

	_, err = migrations.Migrate(ctx, db.Pool, "sideways", nil)
	require.ErrorContains(t, err, "unknown migration direction")
}

func TestSchemaRejectsInvalidStatus(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	_, err := db.Pool.Exec(context.Background(), `INSERT INTO pgdurable.workflow_runs (run_id, workflow_name, workflow_id, status, input)
		VALUES (gen_random_uuid(), 'w', 'id', 'bogus', '{}')`)
	require.ErrorContains(t, err, "workflow_runs_status_check")
}

func TestSchemaNames(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"pgdurable", "acme", "_x", "flows_2", "users", "orders", strings.Repeat("a", 63)} {
		require.NoError(t, migrations.ValidSchemaName(ok), ok)
	}
	for _, bad := range []string{"", "Acme", "1x", "a-b", "a.b", `a"b`, "pg_flows", strings.Repeat("a", 64), "a b", "ä",
		"information_schema", "select", "user", "order", "all", "table"} {
		require.Error(t, migrations.ValidSchemaName(bad), bad)
	}

	// Every keyword of the server at hand that is not unreserved is
	// refused (the list in the package covers PostgreSQL 15 to 18).
	db := enginetest.NewDB(t)
	rows, err := db.Pool.Query(context.Background(), `SELECT word FROM pg_get_keywords() WHERE catcode <> 'U'`)
	require.NoError(t, err)
	words, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.NotEmpty(t, words)
	for _, w := range words {
		require.ErrorContains(t, migrations.ValidSchemaName(w), "keyword", w)
	}
}
