// Package enginetest is what a test of workflows needs: its own PostgreSQL
// database (NewDB), cloned from a template that storage/migrations has
// migrated, so tests run in parallel against a real Postgres and never see
// each other's rows; an engine on it that stops with the test (NewEngine);
// a fake clock for timers, retries and schedules (Clock); and assertions
// in the manner of River's rivertest that wait for a run to end and check
// what it recorded (RequireRunCompleted, RequireResult, RequireRunStatus,
// RequireSteps, RequireStepRecorded, RequireDeadJob), each failing with
// the run's status, error, steps and dead jobs.
//
// It reads TEST_DATABASE_URL (any database on the server; the role must be
// allowed to create databases). When the variable is unset the test is
// skipped, except under CI=true, where it fails.
package enginetest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdurable/pgdurable/engine/internal/store"
	"github.com/pgdurable/pgdurable/storage/migrations"
)

// EnvURL names the variable holding the server's connection URL.
const EnvURL = "TEST_DATABASE_URL"

// EnvRoutes names the variable that, when set to a number from 2 to
// migrations.MaxRoutes, makes every test database spread its runs over
// that many routes (migrations.Opts.Routes), so that the suite runs on
// the layout a Citus cluster uses; unset, a test database has one route.
const EnvRoutes = "PGDURABLE_TEST_ROUTES"

// Routes is the number of routes test databases have (see EnvRoutes).
func Routes() int {
	n, err := strconv.Atoi(os.Getenv(EnvRoutes))
	if err != nil || n < 1 || n > migrations.MaxRoutes {
		return 1
	}
	return n
}

// DB is one test's database.
type DB struct {
	Pool *pgxpool.Pool // MaxConns 20; closed when the test ends
	URL  string        // for child processes and extra pools
	Name string

	routesOnce sync.Once // SQL's inheritance parents
}

// RoutesSchema is the schema whose tables SQL points a test's statements
// at on a database with routes: one per per-run table, which that table
// of every route inherits (made in the test's database on first use).
const RoutesSchema = "pgdurable_routes"

// runTableRef finds a test statement's references to the per-run tables,
// with the INSERT INTO before one, if any.
var runTableRef = regexp.MustCompile(`(?i)(insert\s+into\s+)?\b` + migrations.DefaultSchema + `\.(` + strings.Join(migrations.RunTables, "|") + `)\b`)

// RunTable is the per-run table name (workflow_runs, ...) of run runID's
// route, schema-qualified: where a test inserts a row of a run the engine
// made (its ID carries its route).
func (db *DB) RunTable(name string, runID uuid.UUID) string {
	return migrations.RouteSchema(migrations.DefaultSchema, store.RouteOfRun(runID)) + "." + name
}

// RouteTables are the per-run table name of every route, schema-qualified
// (one with one route).
func (db *DB) RouteTables(name string) []string {
	out := make([]string, Routes())
	for k := range out {
		out[k] = migrations.RouteSchema(migrations.DefaultSchema, k) + "." + name
	}
	return out
}

// SQL is a test's statement q as it runs on db. With one route (the
// default) it is q. With routes (EnvRoutes) its reads, updates and
// deletes of the per-run tables, as pgdurable.<table>, reach the table of
// every route: they name RoutesSchema's parent of it instead, which
// PostgreSQL reads, updates and deletes with its children; an INSERT INTO
// one keeps route 0's table, where the engine looks for a run whose ID
// carries no route. It panics if the parents cannot be made.
func (db *DB) SQL(q string) string {
	routes := Routes()
	if routes == 1 {
		return q
	}
	db.routesOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		stmts := []string{"CREATE SCHEMA IF NOT EXISTS " + RoutesSchema}
		for _, t := range migrations.RunTables {
			stmts = append(stmts, fmt.Sprintf("CREATE TABLE %s.%s (LIKE %s.%s)", RoutesSchema, t, migrations.DefaultSchema, t))
			for k := range routes {
				stmts = append(stmts, fmt.Sprintf("ALTER TABLE %s.%s INHERIT %s.%s", migrations.RouteSchema(migrations.DefaultSchema, k), t, RoutesSchema, t))
			}
		}
		for _, st := range stmts {
			if _, err := db.Pool.Exec(ctx, st); err != nil {
				panic(fmt.Sprintf("enginetest: %s: %v", st, err))
			}
		}
	})
	return runTableRef.ReplaceAllStringFunc(q, func(ref string) string {
		if m := runTableRef.FindStringSubmatch(ref); m[1] == "" {
			return RoutesSchema + "." + m[2]
		}
		return ref
	})
}

var (
	templateOnce sync.Once
	templateName string
	templateErr  error
)

// NewDB creates a fresh migrated database for t and drops it when t ends.
func NewDB(t testing.TB) *DB {
	t.Helper()
	if os.Getenv(EnvURL) == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set; CI must provide a PostgreSQL server", EnvURL)
		}
		t.Skipf("%s is not set; skipping a test that needs PostgreSQL", EnvURL)
	}
	db, drop, err := Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := drop(); err != nil {
			t.Log(err)
		}
	})
	return db
}

// Open creates a fresh migrated database outside a test (runnable examples,
// benchmarks' helpers); drop closes its pool and drops it.
func Open(ctx context.Context) (db *DB, drop func() error, err error) {
	base := os.Getenv(EnvURL)
	if base == "" {
		return nil, nil, fmt.Errorf("%s is not set", EnvURL)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	templateOnce.Do(func() { templateName, templateErr = ensureTemplate(ctx, base) })
	if templateErr != nil {
		return nil, nil, fmt.Errorf("preparing template database: %w", templateErr)
	}

	name := "pgdurable_t_" + randomHex(8)
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to %s: %w", EnvURL, err)
	}
	defer admin.Close(ctx)
	if err := createFromTemplate(ctx, admin, name, templateName); err != nil {
		return nil, nil, fmt.Errorf("creating test database: %w", err)
	}
	dbURL, err := withDatabase(base, name)
	if err != nil {
		return nil, nil, err
	}
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, nil, err
	}
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to test database: %w", err)
	}
	drop = func() error {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			return fmt.Errorf("dropping test database %s: %w", name, err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("dropping test database %s: %w", name, err)
		}
		return nil
	}
	return &DB{Pool: pool, URL: dbURL, Name: name}, drop, nil
}

// createFromTemplate retries while another session briefly holds the
// template (SQLSTATE 55006).
func createFromTemplate(ctx context.Context, admin *pgx.Conn, name, template string) error {
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize() + " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	for {
		_, err := admin.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "55006" {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ensureTemplate builds the migrated template once per schema version:
// its name carries a hash of the migration files, so a changed migration
// gets a new template and an unchanged one is reused across test runs.
func ensureTemplate(ctx context.Context, base string) (string, error) {
	h := sha256.New()
	// Where Migrate puts the tables is part of what the template holds.
	h.Write([]byte("schema " + migrations.DefaultSchema + "\n"))
	if Routes() > 1 {
		fmt.Fprintf(h, "routes %d\n", Routes())
	}
	err := fs.WalkDir(migrations.FS(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrations.FS(), path)
		h.Write([]byte(path))
		h.Write(b)
		return err
	})
	if err != nil {
		return "", err
	}
	name := "pgdurable_tmpl_" + hex.EncodeToString(h.Sum(nil))[:16]

	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", fmt.Errorf("connecting to %s: %w", EnvURL, err)
	}
	defer admin.Close(ctx)
	// Test binaries of several packages start at once: one builds the
	// template while the others wait on this lock.
	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1))", name); err != nil {
		return "", err
	}
	defer admin.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock(hashtext($1))", name) //nolint:errcheck
	var exists bool
	if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", err
	}
	if exists {
		return name, nil
	}
	build := name + "_build"
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{build}.Sanitize()+" WITH (FORCE)"); err != nil {
		return "", err
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{build}.Sanitize()); err != nil {
		return "", err
	}
	buildURL, err := withDatabase(base, build)
	if err != nil {
		return "", err
	}
	pool, err := pgxpool.New(ctx, buildURL)
	if err != nil {
		return "", err
	}
	_, err = migrations.Migrate(ctx, pool, migrations.Up, &migrations.Opts{Routes: Routes()})
	pool.Close()
	if err != nil {
		return "", fmt.Errorf("migrating template: %w", err)
	}
	// Renamed only once complete, so a crash mid-build never leaves a
	// half-migrated template behind under the final name.
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{build}.Sanitize()+" RENAME TO "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", err
	}
	// Templates of other schemas may belong to another checkout testing on
	// the same server right now (cloning from one takes no lock that a
	// DROP would wait for): drop only those untouched for a day.
	rows, err := admin.Query(ctx, `SELECT datname FROM pg_database
		WHERE datname LIKE 'pgdurable_tmpl_%' AND datname <> $1
		  AND (pg_stat_file('base/' || oid || '/PG_VERSION')).modification < now() - interval '1 day'`, name)
	if err == nil {
		old, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, o := range old {
			_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{o}.Sanitize())
		}
	}
	return name, nil
}

func withDatabase(base, name string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("parsing %s: %w", EnvURL, err)
	}
	u.Path = "/" + name
	return u.String(), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
