package store_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine/internal/store"
	"github.com/pgdurable/pgdurable/internal/citus/citustest"
	"github.com/pgdurable/pgdurable/storage/migrations"
)

// perRunTables are the tables whose rows belong to one run, which a
// distributed layout spreads over Citus's worker nodes.
var perRunTables = []string{"workflow_runs", "workflow_steps", "workflow_signals", "dead_jobs"}

// Every statement of a run's hot path, and the sweep, is a single-node (router) query on
// Citus when the per-run tables are distributed: Citus plans it as one
// task on one worker node, with no distributed subplans (each of which
// is a round trip of its own) and nothing pulled through the coordinator.
// The per-run tables are copied into a distributed schema (each of its
// tables one shard, the schema placed whole on one worker node), the
// statements rewritten to it, and each one EXPLAINed with a value of its
// parameters' types (NULLs would let PostgreSQL fold expressions Citus
// refuses), then run in a transaction rolled back.
func TestRoutedStatementsAreSingleNodeOnCitus(t *testing.T) {
	t.Parallel()
	c := citustest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	conn := probeSchema(ctx, t, c.URL())
	pool, err := pgxpool.New(ctx, c.URL())
	require.NoError(t, err)
	defer pool.Close()
	citus, err := store.OnCitus(ctx, store.Default.On(pool))
	require.NoError(t, err)
	require.True(t, citus, "a Citus coordinator taken for plain PostgreSQL")

	names := make([]string, 0, len(store.RoutedStatements))
	for name := range store.RoutedStatements {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		sql := toProbe.ReplaceAllString(store.RoutedStatements[name], "pgdurable_probe.$1")
		plan, err := explain(ctx, conn, sql)
		if err != nil {
			t.Errorf("%s: Citus refuses it: %v", name, err)
			continue
		}
		if problem := notSingleNode(plan); problem != "" {
			t.Errorf("%s: %s:\n%s", name, problem, plan)
		}
		if err := runRolledBack(ctx, conn, sql); err != nil {
			t.Errorf("%s: fails on Citus: %v", name, err)
		}
	}

	// The statements that read runs with the coordinator's tables (a
	// queue's) run, in whatever tasks and subplans Citus splits them into.
	names = names[:0]
	for name := range store.PlannedStatements {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := runRolledBack(ctx, conn, toProbe.ReplaceAllString(store.PlannedStatements[name], "pgdurable_probe.$1")); err != nil {
			t.Errorf("%s: fails on Citus: %v", name, err)
		}
	}
}

// runRolledBack runs sql with sample values of its parameters (see
// explain) in a transaction it rolls back: Citus plans some statements
// anew when it runs them (when it evaluates a function on the
// coordinator), and what it sends the worker node then may fail there.
func runRolledBack(ctx context.Context, conn *pgx.Conn, sql string) error {
	desc, err := conn.Prepare(ctx, "", sql)
	if err != nil {
		return err
	}
	args := make([]any, len(desc.ParamOIDs))
	for i, oid := range desc.ParamOIDs {
		if args[i], err = sampleOf(oid); err != nil {
			return fmt.Errorf("$%d: %w", i+1, err)
		}
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	rows, err := tx.Query(ctx, sql, args...)
	if err == nil {
		rows.Close()
		err = rows.Err()
	}
	// A data exception (a fence's guard dividing by zero) or a constraint
	// violation (a sample value a check refuses) is the statement's own
	// outcome, reached on the worker node: it ran there.
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "23")) {
		return nil
	}
	return err
}

// toProbe finds the statements' references to the per-run tables.
var toProbe = regexp.MustCompile(`\bpgdurable\.(` + strings.Join(perRunTables, "|") + `)\b`)

// probeSchema migrates the cluster at url and copies the per-run tables
// into pgdurable_probe, a distributed schema (each of its tables one
// shard, the schema placed whole on one worker node), and returns a
// connection to the coordinator, closed when t ends.
func probeSchema(ctx context.Context, t *testing.T, url string) *pgx.Conn {
	t.Helper()
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	_, err = migrations.Migrate(ctx, pool, migrations.Up, nil)
	pool.Close()
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	_, err = conn.Exec(ctx, `SET citus.enable_schema_based_sharding = on`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `CREATE SCHEMA pgdurable_probe`)
	require.NoError(t, err)
	for _, table := range perRunTables {
		_, err = conn.Exec(ctx, fmt.Sprintf(`CREATE TABLE pgdurable_probe.%[1]s (LIKE pgdurable.%[1]s INCLUDING ALL)`, table))
		require.NoError(t, err)
	}
	return conn
}

var taskCount = regexp.MustCompile(`Task Count: (\d+)`)

// notSingleNode says why plan (Citus's EXPLAIN) is not one task on one
// node, or "" when it is.
func notSingleNode(plan string) string {
	switch {
	case strings.Contains(plan, "Could not get remote plan"):
		return "refused by the worker node (the statement Citus sent it fails there)"
	case strings.Contains(plan, "Distributed Subplan"):
		return "planned as distributed subplans"
	case strings.Contains(plan, "pull to coordinator"), strings.Contains(plan, "repartition"):
		return "pulled through the coordinator"
	}
	counts := taskCount.FindAllStringSubmatch(plan, -1)
	if len(counts) == 0 {
		return "not run on a worker node"
	}
	for _, m := range counts {
		if m[1] != "1" {
			return m[0]
		}
	}
	return ""
}

// explain is sql's plan with a sample value for each parameter, of the
// type PostgreSQL infers for it.
func explain(ctx context.Context, conn *pgx.Conn, sql string) (string, error) {
	desc, err := conn.Prepare(ctx, "", sql)
	if err != nil {
		return "", err
	}
	args := make([]any, len(desc.ParamOIDs))
	for i, oid := range desc.ParamOIDs {
		if args[i], err = sampleOf(oid); err != nil {
			return "", fmt.Errorf("$%d: %w", i+1, err)
		}
	}
	rows, err := conn.Query(ctx, "EXPLAIN (COSTS OFF) "+sql, args...)
	if err != nil {
		return "", err
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return strings.Join(lines, "\n"), err
}

// sampleOf is a value of the type with OID oid: not NULL, and valid JSON
// where it is text (which statements cast to jsonb).
func sampleOf(oid uint32) (any, error) {
	now := time.Now()
	switch oid {
	case 16:
		return false, nil
	case 1000:
		return []bool{false}, nil
	case 20, 21, 23:
		return 1000, nil
	case 1005, 1007, 1016:
		return []int64{1000}, nil
	case 25, 1043, 3802:
		return "{}", nil
	case 1009, 1015, 3807:
		return []string{"{}"}, nil
	case 1184:
		return now, nil
	case 1185:
		return []time.Time{now}, nil
	case 2950:
		return uuid.New(), nil
	case 2951:
		return []uuid.UUID{uuid.New()}, nil
	case 701:
		return 0.5, nil
	case 1022:
		return []float64{0.5}, nil
	}
	return nil, fmt.Errorf("no sample value for type OID %d", oid)
}
