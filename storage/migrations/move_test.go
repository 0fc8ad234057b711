package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/storage/migrations"
)

// legacyDB is a database laid out as pgdurable laid it out before its
// tables had a schema of their own: every table (River's too) in public,
// migrated by goose and River with the connection's search_path.
func legacyDB(t *testing.T) *enginetest.DB {
	t.Helper()
	db := publicDB(t)
	// The earlier version left its version table unmarked; this version
	// marks one it keeps in public on purpose.
	_, err := db.Pool.Exec(context.Background(), `COMMENT ON TABLE public.pgdurable_schema_migrations IS NULL`)
	require.NoError(t, err)
	return db
}

// unmigratedDB is a database with none of pgdurable's tables in the
// default schema.
func unmigratedDB(t *testing.T) *enginetest.DB {
	t.Helper()
	db := enginetest.NewDB(t)
	_, err := db.Pool.Exec(context.Background(), `DROP SCHEMA `+migrations.DefaultSchema+` CASCADE`)
	require.NoError(t, err)
	return db
}

// publicDB is a database this version migrated into public.
func publicDB(t *testing.T) *enginetest.DB {
	t.Helper()
	db := unmigratedDB(t)
	_, err := migrations.Migrate(context.Background(), db.Pool, migrations.Up, &migrations.Opts{Schema: "public"})
	require.NoError(t, err)
	return db
}

// counts is how many rows each of pgdurable's tables holds in schema, and
// how many River jobs of runs it has.
func counts(t *testing.T, pool *pgxpool.Pool, schema string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, table := range append([]string{"river_job"}, migrations.Tables...) {
		var n int64
		where := ""
		if table == "river_job" {
			where = " WHERE kind = 'pgdurable.run'"
		}
		require.NoError(t, pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT count(*) FROM %s.%s%s`, schema, table, where)).Scan(&n))
		out[table] = n
	}
	return out
}

type moveWorkflows struct {
	greet, wait, boom *engine.Workflow[string, string]
}

func newMoveWorkflows() moveWorkflows {
	return moveWorkflows{
		greet: engine.Define("greet", func(ctx *engine.Context, name string) (string, error) {
			return engine.Step(ctx, "hello", func(context.Context) (string, error) { return "hello " + name, nil }, nil)
		}, nil),
		wait: engine.Define("wait", func(ctx *engine.Context, name string) (string, error) {
			before, err := engine.Step(ctx, "before", func(context.Context) (string, error) { return name, nil }, nil)
			if err != nil {
				return "", err
			}
			got, err := engine.AwaitSignal[string](ctx, "go", time.Hour)
			if err != nil {
				return "", err
			}
			return before + " " + got, nil
		}, nil),
		boom: engine.Define("boom", func(ctx *engine.Context, _ string) (string, error) {
			return engine.Step(ctx, "boom", func(context.Context) (string, error) { panic("boom") }, nil)
		}, nil),
	}
}

func (w moveWorkflows) all() []engine.Registration {
	return []engine.Registration{w.greet, w.wait, w.boom}
}

// An installation from before the tables had a schema of their own
// migrates into the schema with every run, step, signal, schedule and
// dead job, and its runs go on; while an engine of that installation
// runs, the migration refuses and moves nothing; afterwards, neither an
// engine of the earlier layout nor the earlier version's own migration
// can start on (or re-create) the tables in public.
func TestMigrateMovesAnInstallationOutOfPublic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := legacyDB(t)
	wf := newMoveWorkflows()

	old := enginetest.NewEngine(t, db, &engine.Config{Schema: "public"}, true, wf.all()...)
	done, err := wf.greet.Start(ctx, old, "ada", nil)
	require.NoError(t, err)
	enginetest.RequireRunCompleted(ctx, t, old, done.RunID, 0)
	var waiting []uuid.UUID
	for i := range 3 {
		r, err := wf.wait.Start(ctx, old, fmt.Sprint("w", i), &engine.StartOpts{WorkflowID: fmt.Sprint("wait-", i)})
		require.NoError(t, err)
		enginetest.RequireRunStatus(ctx, t, old, r.RunID, engine.StatusWaiting, 0)
		waiting = append(waiting, r.RunID)
	}
	// A signal the run does not wait for: kept, unconsumed.
	require.NoError(t, old.Signal(ctx, waiting[0].String(), "unrelated", "x", nil))
	dead, err := wf.boom.Start(ctx, old, "", nil)
	require.NoError(t, err)
	enginetest.RequireRunStatus(ctx, t, old, dead.RunID, engine.StatusDead, 0)
	enginetest.RequireDeadJob(ctx, t, old, dead.RunID, &enginetest.RequireDeadJobOpts{Reason: engine.ReasonPanic})
	_, err = old.CreateSchedule(ctx, engine.ScheduleSpec{Name: "nightly", Cron: "0 3 * * *", TimeZone: "UTC", Workflow: "greet", Input: []byte(`"night"`)})
	require.NoError(t, err)
	later, err := wf.greet.Start(ctx, old, "later", &engine.StartOpts{Delay: time.Hour})
	require.NoError(t, err)

	before := counts(t, db.Pool, "public")
	require.Equal(t, int64(6), before["workflow_runs"])
	require.Positive(t, before["workflow_signals"])
	require.Equal(t, int64(1), before["dead_jobs"])
	require.Equal(t, int64(1), before["schedules"])
	require.Equal(t, int64(1), before["engine_processes"])

	// The earlier installation's engine is running: refused, nothing moved.
	_, err = migrations.Migrate(ctx, db.Pool, migrations.Up, nil)
	require.ErrorIs(t, err, migrations.ErrEnginesRunning)
	require.ErrorContains(t, err, "stop every engine working on them")
	require.Equal(t, before, counts(t, db.Pool, "public"))
	st, err := migrations.GetStatus(ctx, db.Pool, nil)
	require.NoError(t, err)
	require.True(t, st.InPublic, "the default schema is empty, and public holds the tables")

	require.NoError(t, old.Stop(ctx))
	// A run started in a transaction while no engine works: its River
	// job waits in public's River tables.
	client, err := engine.New(db.Pool, &engine.Config{Schema: "public"})
	require.NoError(t, err)
	require.NoError(t, client.Register(wf.all()...))
	var queued *engine.StartResult
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) (err error) {
		queued, err = wf.greet.StartTx(ctx, client, tx, "queued", nil)
		return err
	}))
	before = counts(t, db.Pool, "public")
	require.Positive(t, before["river_job"])
	res, err := migrations.Migrate(ctx, db.Pool, migrations.Up, nil)
	require.NoError(t, err)
	require.NotNil(t, res.Moved)
	require.Equal(t, migrations.DefaultSchema, res.Schema)
	require.Contains(t, res.Moved.Tables, "workflow_runs")
	require.Contains(t, res.Moved.Tables, migrations.VersionTable)
	require.Empty(t, res.Applied, "the moved tables were at the latest version")
	after := counts(t, db.Pool, migrations.DefaultSchema)
	before["engine_processes"] = 0 // the stopped engine deleted its row
	require.Equal(t, before, after, "every row moved")
	require.Equal(t, after["river_job"], res.Moved.RiverJobs)
	var publicJobs int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM public.river_job WHERE kind = 'pgdurable.run'`).Scan(&publicJobs))
	require.Zero(t, publicJobs, "the runs' River jobs left public's River tables, which stay")

	again, err := migrations.Migrate(ctx, db.Pool, migrations.Up, nil)
	require.NoError(t, err)
	require.Nil(t, again.Moved, "a second Up moves nothing")

	// The runs go on in the new schema.
	e := enginetest.NewEngine(t, db, nil, true, wf.all()...)
	for i, id := range waiting {
		require.NoError(t, e.Signal(ctx, id.String(), "go", fmt.Sprint("go", i), nil))
		run := enginetest.RequireRunCompleted(ctx, t, e, id, 0)
		require.JSONEq(t, fmt.Sprintf(`"w%d go%d"`, i, i), string(run.Output))
	}
	enginetest.RequireDeadJob(ctx, t, e, dead.RunID, &enginetest.RequireDeadJobOpts{Reason: engine.ReasonPanic})
	sched, err := e.GetSchedule(ctx, "nightly")
	require.NoError(t, err)
	require.Equal(t, "0 3 * * *", sched.Cron)
	enginetest.RequireRunCompleted(ctx, t, e, queued.RunID, 0)
	require.NoError(t, e.StartNow(ctx, later.RunID))
	enginetest.RequireRunCompleted(ctx, t, e, later.RunID, 0)
	got, err := e.GetRun(ctx, done.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, got.Status)

	// The earlier layout is refused from now on: by this version,
	_, err = migrations.GetStatus(ctx, db.Pool, &migrations.Opts{Schema: "public"})
	require.ErrorIs(t, err, migrations.ErrMoved)
	require.ErrorContains(t, err, "to schema pgdurable")
	_, err = migrations.Migrate(ctx, db.Pool, migrations.Up, &migrations.Opts{Schema: "public"})
	require.ErrorIs(t, err, migrations.ErrMoved)
	// by an engine still configured for it (it finds no tables and
	// creates no rows),
	stale, err := engine.New(db.Pool, &engine.Config{Schema: "public"})
	require.NoError(t, err)
	_, err = wf.greet.Start(ctx, stale, "stale", nil)
	require.ErrorContains(t, err, `relation "public.workflow_runs" does not exist`)
	// and by the earlier version's own migration (goose on the
	// connection's search_path), which engine serve checks and
	// engine migrate up runs.
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	earlier, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations.FS(),
		goose.WithTableName(migrations.VersionTable), goose.WithDisableGlobalRegistry(true))
	require.NoError(t, err)
	status, err := earlier.Status(ctx)
	require.NoError(t, err)
	for _, s := range status {
		require.Equal(t, goose.StatePending, s.State, "the earlier engine serve sees migration %d as not applied, and refuses to start", s.Source.Version)
	}
	_, err = earlier.Up(ctx)
	require.ErrorContains(t, err, "missing (out-of-order) migrations lower than database version (99999999999)")
	var publicTables int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename = ANY($1)`,
		migrations.Tables).Scan(&publicTables))
	require.Zero(t, publicTables, "nothing re-created the tables in public")
	require.Equal(t, after["workflow_runs"], counts(t, db.Pool, migrations.DefaultSchema)["workflow_runs"])
}

// A run that a delivery holds keeps the migration from moving it, even
// when no process row says so (an engine of a version from before the
// process registry).
func TestMigrateRefusesWhileARunIsLeased(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := legacyDB(t)
	_, err := db.Pool.Exec(ctx, `INSERT INTO public.workflow_runs (run_id, workflow_name, workflow_id, status, input, owner_token, lease_expires_at)
		VALUES (gen_random_uuid(), 'w', 'id', 'running', '{}', gen_random_uuid(), now() + interval '1 minute')`)
	require.NoError(t, err)
	_, err = migrations.Migrate(ctx, db.Pool, migrations.Up, nil)
	require.ErrorIs(t, err, migrations.ErrEnginesRunning)
	require.ErrorContains(t, err, "1 runs are held by a delivery")
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM public.workflow_runs`).Scan(&n))
	require.Equal(t, 1, n)
	var created bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT to_regnamespace('pgdurable') IS NOT NULL`).Scan(&created))
	require.False(t, created, "a refused move creates nothing, not even the schema")

	_, err = db.Pool.Exec(ctx, `UPDATE public.workflow_runs SET lease_expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	res, err := migrations.Migrate(ctx, db.Pool, migrations.Up, nil)
	require.NoError(t, err)
	require.NotNil(t, res.Moved)
}

// Two installations in one database, in schemas of their own, never see
// each other's runs, though their workflows and workflow IDs are the same.
func TestTwoSchemasInOneDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := enginetest.NewDB(t)
	res, err := migrations.Migrate(ctx, db.Pool, migrations.Up, &migrations.Opts{Schema: "acme_flows"})
	require.NoError(t, err)
	require.Equal(t, "acme_flows", res.Schema)
	require.Len(t, res.Applied, migrationCount(t))
	st, err := migrations.GetStatus(ctx, db.Pool, &migrations.Opts{Schema: "acme_flows"})
	require.NoError(t, err)
	require.Positive(t, st.RiverVersion)

	wf := newMoveWorkflows()
	ours := enginetest.NewEngine(t, db, nil, true, wf.all()...)
	theirs := enginetest.NewEngine(t, db, &engine.Config{Schema: "acme_flows"}, true, wf.all()...)
	require.Equal(t, "acme_flows", theirs.Schema())
	for _, e := range []*engine.Engine{ours, theirs} {
		r, err := wf.wait.Start(ctx, e, e.Schema(), &engine.StartOpts{WorkflowID: "same"})
		require.NoError(t, err)
		enginetest.RequireRunStatus(ctx, t, e, r.RunID, engine.StatusWaiting, 0)
		require.NoError(t, e.Signal(ctx, "same", "go", "now", nil))
		run := enginetest.RequireRunCompleted(ctx, t, e, r.RunID, 0)
		require.JSONEq(t, fmt.Sprintf(`"%s now"`, e.Schema()), string(run.Output))
		runs, _, err := e.ListRuns(ctx, engine.ListRunsParams{})
		require.NoError(t, err)
		require.Len(t, runs, 1)
		require.Equal(t, r.RunID, runs[0].RunID)
	}
	require.Equal(t, int64(1), counts(t, db.Pool, "acme_flows")["workflow_runs"])
	require.Equal(t, int64(1), counts(t, db.Pool, migrations.DefaultSchema)["workflow_runs"])

	_, err = engine.New(db.Pool, &engine.Config{Schema: "Acme-Flows"})
	require.ErrorContains(t, err, `schema name "Acme-Flows"`)
	_, err = migrations.Migrate(ctx, db.Pool, migrations.Up, &migrations.Opts{Schema: "x; DROP TABLE y"})
	require.Error(t, err)
	require.False(t, errors.Is(err, migrations.ErrMoved))
}

// An engine of an earlier version that started on a database nobody had
// migrated left goose's version table in public holding only goose's 0:
// nothing to move, and nothing in public to report.
func TestMigrateIgnoresAnEmptyVersionTableInPublic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := enginetest.NewDB(t)
	_, err := db.Pool.Exec(ctx, `DROP SCHEMA `+migrations.DefaultSchema+` CASCADE;
		CREATE TABLE public.pgdurable_schema_migrations (
			id integer PRIMARY KEY GENERATED BY DEFAULT AS IDENTITY,
			version_id bigint NOT NULL, is_applied boolean NOT NULL, tstamp timestamp NOT NULL DEFAULT now());
		INSERT INTO public.pgdurable_schema_migrations (version_id, is_applied) VALUES (0, true)`)
	require.NoError(t, err)
	st, err := migrations.GetStatus(ctx, db.Pool, nil)
	require.NoError(t, err)
	require.False(t, st.InPublic)

	res, err := migrations.Migrate(ctx, db.Pool, migrations.Up, nil)
	require.NoError(t, err)
	require.Nil(t, res.Moved)
	require.Len(t, res.Applied, migrationCount(t))
	wf := newMoveWorkflows()
	e := enginetest.NewEngine(t, db, nil, true, wf.all()...)
	r, err := wf.greet.Start(ctx, e, "new", nil)
	require.NoError(t, err)
	enginetest.RequireRunCompleted(ctx, t, e, r.RunID, 0)
}

// Deploy steps that migrate at once take turns: every one succeeds, and
// the migrations are applied once.
func TestConcurrentMigrations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := unmigratedDB(t)
	const n = 4
	results := make(chan *migrations.Result, n)
	errs := make(chan error, n)
	for range n {
		go func() {
			// A pool of one connection each: the lock's session is not
			// taken from it.
			cfg, err := pgxpool.ParseConfig(db.URL)
			if err != nil {
				errs <- err
				return
			}
			cfg.MaxConns = 1
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				errs <- err
				return
			}
			defer pool.Close()
			res, err := migrations.Migrate(ctx, pool, migrations.Up, nil)
			errs <- err
			results <- res
		}()
	}
	applied := 0
	for range n {
		require.NoError(t, <-errs)
		if res := <-results; len(res.Applied) > 0 {
			require.Len(t, res.Applied, migrationCount(t))
			applied++
		}
	}
	require.Equal(t, 1, applied)
}

// A role that owns a schema created for it, but may not create schemas,
// migrates into it.
func TestMigrateIntoASchemaCreatedBeforehand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := enginetest.NewDB(t)
	role := "pgdurable_owner_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	_, err := db.Pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN; CREATE SCHEMA flows AUTHORIZATION `+role)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), `DROP SCHEMA flows CASCADE; DROP ROLE `+role)
	})
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.User = role
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	var canCreate bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT has_database_privilege(current_database(), 'CREATE')`).Scan(&canCreate))
	require.False(t, canCreate)

	res, err := migrations.Migrate(ctx, pool, migrations.Up, &migrations.Opts{Schema: "flows"})
	require.NoError(t, err)
	require.Len(t, res.Applied, migrationCount(t))
	_, err = migrations.Migrate(ctx, pool, migrations.Up, &migrations.Opts{Schema: "not_there"})
	require.ErrorContains(t, err, "creating schema not_there")
	require.ErrorContains(t, err, "(CREATE SCHEMA not_there AUTHORIZATION <role>)")
}

// An installation this version migrated into public on purpose stays
// there: a migration into another schema starts a second installation.
func TestAnInstallationKeptInPublicStaysThere(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := publicDB(t)
	wf := newMoveWorkflows()
	kept := enginetest.NewEngine(t, db, &engine.Config{Schema: "public"}, false, wf.all()...)
	_, err := wf.greet.Start(ctx, kept, "kept", nil)
	require.NoError(t, err)
	before := counts(t, db.Pool, "public")

	st, err := migrations.GetStatus(ctx, db.Pool, nil)
	require.NoError(t, err)
	require.False(t, st.InPublic)
	require.Equal(t, []string{"public"}, st.OtherSchemas)
	res, err := migrations.Migrate(ctx, db.Pool, migrations.Up, nil)
	require.NoError(t, err)
	require.Nil(t, res.Moved)
	require.Len(t, res.Applied, migrationCount(t))
	require.Equal(t, before, counts(t, db.Pool, "public"))
	require.Zero(t, counts(t, db.Pool, migrations.DefaultSchema)["workflow_runs"])
	st, err = migrations.GetStatus(ctx, db.Pool, &migrations.Opts{Schema: "public"})
	require.NoError(t, err)
	require.Equal(t, []string{migrations.DefaultSchema}, st.OtherSchemas)
}

// migrationCount is how many pgdurable migrations there are.
func migrationCount(t *testing.T) int {
	t.Helper()
	files, err := fs.Glob(migrations.FS(), "*.sql")
	require.NoError(t, err)
	return len(files)
}
