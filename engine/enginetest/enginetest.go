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
// skipped, except under CI=true, where it fails. When it names a Citus
// coordinator's database with worker nodes registered, every test
// database is made on the whole cluster (see Citus).
package enginetest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
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

	routesOnce sync.Once // SQL's views (RoutesSchema) are there
}

// RoutesSchema is the schema whose views SQL points a test's reads at on
// a database with routes: one per per-run table, the UNION ALL of that
// table of every route (made in the template, or in a test's database
// on first use when its template was built without them). Views
// rather than inheritance parents, because Citus refuses inheritance on
// its distributed tables and plans a UNION ALL of them.
const RoutesSchema = "pgdurable_routes"

// runTableRef finds a test statement's references to the per-run tables,
// with the INSERT INTO, UPDATE or DELETE FROM before one, if any.
var runTableRef = regexp.MustCompile(`(?i)(insert\s+into\s+|update\s+|delete\s+from\s+)?\b` + migrations.DefaultSchema + `\.(` + strings.Join(migrations.RunTables, "|") + `)\b`)

// RunTable is the per-run table name (workflow_runs, ...) of run runID's
// route, schema-qualified: where a test inserts, updates or deletes a row
// of a run the engine made (its ID carries its route).
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
// default) it is q. With routes (EnvRoutes) its reads of the per-run
// tables, as pgdurable.<table>, reach the table of every route: they name
// RoutesSchema's view of it instead; an INSERT INTO one keeps route 0's
// table, where the engine looks for a run whose ID carries no route. An
// UPDATE or DELETE of one cannot go through a view of several tables: it
// panics, naming RunTable, as it does when the views cannot be made.
func (db *DB) SQL(q string) string {
	routes := Routes()
	if routes == 1 {
		return q
	}
	db.routesOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// The template has them; a template built before it did has not.
		var made bool
		err := db.Pool.QueryRow(ctx, `SELECT to_regnamespace($1) IS NOT NULL`, RoutesSchema).Scan(&made)
		if err == nil && !made {
			err = createRouteViews(ctx, db.Pool, routes)
		}
		if err != nil {
			panic(fmt.Sprintf("enginetest: %v", err))
		}
	})
	return runTableRef.ReplaceAllStringFunc(q, func(ref string) string {
		m := runTableRef.FindStringSubmatch(ref)
		switch verb := strings.ToLower(strings.Fields(m[1] + " x")[0]); verb {
		case "insert":
			return ref
		case "update", "delete":
			panic(fmt.Sprintf("enginetest: %q: with routes, name the run's table with RunTable (or each route's with RouteTables)", ref))
		}
		return RoutesSchema + "." + m[2]
	})
}

// createRouteViews makes RoutesSchema's views in the database of exec.
func createRouteViews(ctx context.Context, exec interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, routes int) error {
	stmts := []string{"CREATE SCHEMA IF NOT EXISTS " + RoutesSchema}
	for _, t := range migrations.RunTables {
		legs := make([]string, routes)
		for k := range routes {
			legs[k] = "SELECT * FROM " + migrations.RouteSchema(migrations.DefaultSchema, k) + "." + t
		}
		stmts = append(stmts, fmt.Sprintf("CREATE VIEW %s.%s AS %s", RoutesSchema, t, strings.Join(legs, " UNION ALL ")))
	}
	for _, st := range stmts {
		if _, err := exec.Exec(ctx, st); err != nil {
			return fmt.Errorf("%s: %w", st, err)
		}
	}
	return nil
}

var (
	templateOnce sync.Once
	templateName string
	templateErr  error

	nodesOnce     sync.Once
	templateNodes []string // URLs of the server's nodes: the coordinator's (base) first
	nodesErr      error
)

// learnNodes learns the server's nodes (clusterNodes) once.
func learnNodes(ctx context.Context, base string) error {
	nodesOnce.Do(func() { templateNodes, nodesErr = clusterNodes(ctx, base) })
	return nodesErr
}

// clusterNodes are the URLs of the servers a test database is made on:
// base's alone, or, when base is a Citus coordinator with worker nodes
// registered in its database, base's and each worker node's (base with
// the node's host and port).
func clusterNodes(ctx context.Context, base string) ([]string, error) {
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", EnvURL, err)
	}
	defer conn.Close(ctx)
	var citus bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`).Scan(&citus); err != nil || !citus {
		return []string{base}, err
	}
	rows, err := conn.Query(ctx, `SELECT nodename, nodeport FROM pg_dist_node
		WHERE groupid <> 0 AND isactive AND noderole = 'primary' ORDER BY nodeid`)
	if err != nil {
		return nil, fmt.Errorf("reading the Citus worker nodes: %w", err)
	}
	nodes := []string{base}
	for rows.Next() {
		var host string
		var port int
		if err := rows.Scan(&host, &port); err != nil {
			return nil, err
		}
		u, err := url.Parse(base)
		if err != nil {
			return nil, fmt.Errorf("parsing %s: %w", EnvURL, err)
		}
		u.Host = net.JoinHostPort(host, strconv.Itoa(port))
		nodes = append(nodes, u.String())
	}
	return nodes, rows.Err()
}

// Citus reports whether the test databases are on a Citus cluster: when
// TEST_DATABASE_URL names a coordinator with worker nodes registered in
// its database, each test database is made on every node (from a
// template database on each), the Citus extension in each and the worker
// nodes registered, and migrated as on a coordinator (its per-run tables
// on the worker nodes, a route per node with EnvRoutes). False when the
// variable is unset or the server cannot be reached.
func Citus() bool {
	base := os.Getenv(EnvURL)
	if base == "" {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return learnNodes(ctx, base) == nil && len(templateNodes) > 1
}

// SkipOnCitus skips t when the test databases are on a Citus cluster
// (Citus): for a test of what only one PostgreSQL server does or lets a
// test do, which why names (it is in the skip message).
func SkipOnCitus(t testing.TB, why string) {
	t.Helper()
	if Citus() {
		t.Skip("a single server's behaviour, not tested on a Citus cluster: " + why)
	}
}

// redactURL is u without its password.
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparsable URL)"
	}
	return p.Redacted()
}

// NewDB creates a fresh migrated database for t and drops it when t ends
// (or, under EnvReuse, empties it back to the template's rows and hands
// it to the binary's next test).
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
// benchmarks' helpers); drop closes its pool and drops it (or, under
// EnvReuse, empties it for the next Open).
func Open(ctx context.Context) (db *DB, drop func() error, err error) {
	base := os.Getenv(EnvURL)
	if base == "" {
		return nil, nil, fmt.Errorf("%s is not set", EnvURL)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	templateOnce.Do(func() {
		if templateErr = learnNodes(ctx, base); templateErr == nil {
			templateName, templateErr = ensureTemplate(ctx, base, templateNodes)
		}
	})
	if templateErr != nil {
		return nil, nil, fmt.Errorf("preparing template database: %w", templateErr)
	}

	reuse := reuseEnabled()
	name, reused := "", false
	if reuse {
		name, reused = takeIdle()
	}
	if !reused {
		name = newDatabaseName()
		if err := createOnNodes(ctx, name); err != nil {
			return nil, nil, err
		}
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
		var errs []error
		if reuse {
			err := reset(context.Background(), dbURL, len(templateNodes) > 1)
			if err == nil {
				// Under a new name, as a new database would have: a
				// process the test left running (a child it did not
				// stop, a pool that reconnects) cannot reach the next
				// test's runs, as it could not reach a dropped database.
				fresh := newDatabaseName()
				if err = renameOnNodes(name, fresh); err == nil {
					putIdle(fresh)
					return nil
				}
				for _, node := range templateNodes {
					_ = dropOn(node, fresh) // the nodes renamed before the failure
				}
			}
			if !errors.Is(err, errChanged) {
				// Dropped all the same: only the time is lost.
				errs = append(errs, fmt.Errorf("emptying test database %s for reuse: %w", name, err))
			}
		}
		for _, node := range templateNodes {
			errs = append(errs, dropOn(node, name))
		}
		return errors.Join(errs...)
	}
	return &DB{Pool: pool, URL: dbURL, Name: name}, drop, nil
}

// createOnNodes makes database name from the template. On a Citus
// cluster it is made on every node, from each node's copy of the
// template: the coordinator's metadata names the shards that the worker
// nodes' copies hold, and the coordinator reaches a worker's database by
// its own name.
func createOnNodes(ctx context.Context, name string) error {
	for i, node := range templateNodes {
		admin, err := pgx.Connect(ctx, node)
		if err != nil {
			return fmt.Errorf("connecting to %s: %w", redactURL(node), err)
		}
		err = createFromTemplate(ctx, admin, name, templateName)
		admin.Close(ctx)
		if err != nil {
			for _, made := range templateNodes[:i] {
				_ = dropOn(made, name)
			}
			return fmt.Errorf("creating test database on %s: %w", redactURL(node), err)
		}
	}
	return nil
}

// renameOnNodes renames test database from to to on every node: the
// worker nodes' first, the coordinator's, through which the tests reach
// it, last.
func renameOnNodes(from, to string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := len(templateNodes) - 1; i >= 0; i-- {
		if err := renameDatabase(ctx, templateNodes[i], from, to); err != nil {
			return err
		}
	}
	return nil
}

// dropOn drops database name on the server at node's URL.
func dropOn(node, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, node)
	if err != nil {
		return fmt.Errorf("dropping test database %s: %w", name, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("dropping test database %s on %s: %w", name, redactURL(node), err)
	}
	return nil
}

// createFromTemplate retries while another session briefly holds the
// template (SQLSTATE 55006), ending any Citus maintenance process
// connected to it (see renameDatabase).
func createFromTemplate(ctx context.Context, admin *pgx.Conn, name, template string) error {
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize() + " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	for {
		_, err := admin.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "55006" {
			return err
		}
		_, _ = admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = $1 AND backend_type LIKE 'Citus%'`, template)
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
func ensureTemplate(ctx context.Context, base string, nodes []string) (string, error) {
	h := sha256.New()
	// Where Migrate puts the tables is part of what the template holds.
	h.Write([]byte("schema " + migrations.DefaultSchema + "\n"))
	for _, n := range nodes[1:] {
		fmt.Fprintf(h, "citus node %s\n", redactURL(n))
	}
	if Routes() > 1 {
		fmt.Fprintf(h, "routes %d\n", Routes())
	}
	if reuseEnabled() {
		h.Write([]byte(reuseVersion + "\n"))
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
	for _, node := range nodes {
		if err := execOn(ctx, node, "DROP DATABASE IF EXISTS "+pgx.Identifier{build}.Sanitize()+" WITH (FORCE)"); err != nil {
			return "", err
		}
		if err := execOn(ctx, node, "CREATE DATABASE "+pgx.Identifier{build}.Sanitize()); err != nil {
			return "", err
		}
	}
	buildURL, err := withDatabase(base, build)
	if err != nil {
		return "", err
	}
	if len(nodes) > 1 {
		if err := registerNodes(ctx, admin, build, nodes); err != nil {
			return "", fmt.Errorf("making the template a Citus cluster's database: %w", err)
		}
	}
	pool, err := pgxpool.New(ctx, buildURL)
	if err != nil {
		return "", err
	}
	_, err = migrations.Migrate(ctx, pool, migrations.Up, &migrations.Opts{Routes: Routes()})
	if err == nil && Routes() > 1 {
		// Made in the template, not by a test's first SQL: DDL in a
		// test's database keeps it from being reused.
		err = createRouteViews(ctx, pool, Routes())
	}
	pool.Close()
	if err != nil {
		return "", fmt.Errorf("migrating template: %w", err)
	}
	if reuseEnabled() {
		if err := prepareReuse(ctx, buildURL); err != nil {
			return "", err
		}
	}
	// Renamed only once complete, so a crash mid-build never leaves a
	// half-migrated template behind under the final name: the worker
	// nodes' first, the coordinator's, whose name says the template
	// exists, last.
	for i := len(nodes) - 1; i >= 0; i-- {
		if err := renameDatabase(ctx, nodes[i], build, name); err != nil {
			return "", err
		}
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

// registerNodes makes database db, made on every node, a Citus cluster's
// database: the extension in each node's, the coordinator's host and the
// worker nodes registered in the coordinator's, as base's database has
// them.
func registerNodes(ctx context.Context, admin *pgx.Conn, db string, nodes []string) error {
	for _, node := range nodes {
		u, err := withDatabase(node, db)
		if err != nil {
			return err
		}
		if err := execOn(ctx, u, "CREATE EXTENSION IF NOT EXISTS citus"); err != nil {
			return err
		}
	}
	var host string
	var port int
	err := admin.QueryRow(ctx, `SELECT nodename, nodeport FROM pg_dist_node WHERE groupid = 0`).Scan(&host, &port)
	if errors.Is(err, pgx.ErrNoRows) {
		u, perr := url.Parse(nodes[0])
		if perr != nil {
			return perr
		}
		host = u.Hostname()
		port, _ = strconv.Atoi(u.Port())
		if port == 0 {
			port = 5432
		}
	} else if err != nil {
		return err
	}
	coordinator, err := withDatabase(nodes[0], db)
	if err != nil {
		return err
	}
	if err := execOn(ctx, coordinator, "SELECT citus_set_coordinator_host($1, $2)", host, port); err != nil {
		return err
	}
	for _, node := range nodes[1:] {
		u, err := url.Parse(node)
		if err != nil {
			return err
		}
		p, _ := strconv.Atoi(u.Port())
		if p == 0 {
			p = 5432
		}
		if err := execOn(ctx, coordinator, "SELECT citus_add_node($1, $2)", u.Hostname(), p); err != nil {
			return err
		}
	}
	return nil
}

// renameDatabase renames database from to to on the server at node's
// URL. Citus keeps a maintenance process connected to each of its
// databases (nothing else is connected to a template being built), which
// a rename, like a later CREATE DATABASE from it, would wait for forever:
// it is ended first (it exits, and no one connects to the template again
// to start another).
func renameDatabase(ctx context.Context, node, from, to string) error {
	conn, err := pgx.Connect(ctx, node)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for {
		if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, from); err != nil {
			return err
		}
		_, err := conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{from}.Sanitize()+" RENAME TO "+pgx.Identifier{to}.Sanitize())
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

// execOn runs one statement on the server at url.
func execOn(ctx context.Context, url, sql string, args ...any) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("connecting to %s: %w", redactURL(url), err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("%s on %s: %w", sql, redactURL(url), err)
	}
	return nil
}

func withDatabase(base, name string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("parsing %s: %w", EnvURL, err)
	}
	u.Path = "/" + name
	return u.String(), nil
}

// newDatabaseName names a test database, new or reused: random, so that
// test binaries running at once on one server never share one.
func newDatabaseName() string { return "pgdurable_t_" + randomHex(8) }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
