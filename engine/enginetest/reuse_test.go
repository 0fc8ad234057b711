package enginetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
)

// reusableDB is a test database with what reset needs, whether or not
// the binary reuses databases (EnvReuse): its template has it then.
func reusableDB(t *testing.T) *DB {
	t.Helper()
	db := NewDB(t)
	ctx := context.Background()
	var has bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT to_regnamespace($1) IS NOT NULL`, testSchema).Scan(&has))
	if !has {
		require.NoError(t, prepareReuse(ctx, db.URL))
	}
	return db
}

func count(t *testing.T, db *DB, q string) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), db.SQL(q)).Scan(&n))
	return n
}

// A database that a test filled with runs, and left a session open on,
// is emptied back to the template's rows: the runs, their steps and
// River's jobs gone, the migrations' records kept, the sequences back.
func TestResetEmptiesWhatATestLeft(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := reusableDB(t)
	migrated := count(t, db, `SELECT count(*) FROM pgdurable.pgdurable_schema_migrations`)
	var jobSeq int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT last_value FROM pgdurable.river_job_id_seq`).Scan(&jobSeq))

	wf := engine.Define("reuse-reset", func(ctx *engine.Context, in int) (int, error) {
		return engine.Step(ctx, "double", func(context.Context) (int, error) { return 2 * in, nil }, nil)
	}, nil)
	e, err := engine.New(db.Pool, nil)
	require.NoError(t, err)
	require.NoError(t, e.Register(wf))
	require.NoError(t, e.Start(ctx))
	for i := range 3 {
		h, err := wf.Start(ctx, e, i, nil)
		require.NoError(t, err)
		RequireRunCompleted(ctx, t, e, h.RunID, 0)
	}
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	require.NoError(t, e.StopAndCancel(stopCtx))
	cancel()
	require.Equal(t, 3, count(t, db, `SELECT count(*) FROM pgdurable.workflow_runs`))

	// A session the test left open (a child process, a pool it did not
	// close), in a transaction that holds a lock TRUNCATE needs.
	left, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer left.Close(context.Background())
	_, err = left.Exec(ctx, `BEGIN; SELECT count(*) FROM pgdurable.river_job`)
	require.NoError(t, err)

	require.NoError(t, reset(ctx, db.URL, Citus()))
	require.Error(t, left.Ping(ctx), "the session left open was ended")
	db.Pool.Reset() // its connections were ended too

	for _, q := range []string{
		`SELECT count(*) FROM pgdurable.workflow_runs`,
		`SELECT count(*) FROM pgdurable.workflow_steps`,
		`SELECT count(*) FROM pgdurable.river_job`,
		`SELECT count(*) FROM pgdurable.engine_processes`,
	} {
		require.Zero(t, count(t, db, q), q)
	}
	require.Equal(t, migrated, count(t, db, `SELECT count(*) FROM pgdurable.pgdurable_schema_migrations`), "the template's rows stay")
	var after int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT last_value FROM pgdurable.river_job_id_seq`).Scan(&after))
	require.Equal(t, jobSeq, after, "River's job IDs start again where the template's do")

	// The emptied database takes the next test's runs.
	e2 := NewEngine(t, db, nil, true, wf)
	h, err := wf.Start(ctx, e2, 21, nil)
	require.NoError(t, err)
	require.Equal(t, 42, RequireResult(ctx, t, e2, wf, h.RunID, 0))
}

// A database that is not as a fresh clone beyond its rows and what the
// test made is never handed to another test: DDL changed one of the
// template's objects or made a kind of object reset does not drop, or a
// row the template holds changed.
func TestResetRefusesADatabaseChangedBeyondItsRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, change := range map[string]string{
		"AlteredTemplateTable": `ALTER TABLE pgdurable.queues ADD COLUMN reuse_ddl int`,
		"DroppedTemplateIndex": `DROP INDEX pgdurable.workflow_runs_flow_age_idx`,
		"CommentOnTemplate":    `COMMENT ON TABLE pgdurable.queues IS 'changed'`,
		"Extension":            `CREATE EXTENSION IF NOT EXISTS pg_trgm`,
		"DDLRolledBack":        `ALTER TABLE pgdurable.queues ADD COLUMN reuse_ddl int`,
		"TemplateRows":         `DELETE FROM pgdurable.river_migration WHERE version = (SELECT max(version) FROM pgdurable.river_migration)`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := reusableDB(t)
			if name == "DDLRolledBack" {
				// What a rolled-back transaction did is not there: the
				// database is as it was.
				tx, err := db.Pool.Begin(ctx)
				require.NoError(t, err)
				_, err = tx.Exec(ctx, change)
				require.NoError(t, err)
				require.NoError(t, tx.Rollback(ctx))
				require.NoError(t, reset(ctx, db.URL, Citus()))
				return
			}
			_, err := db.Pool.Exec(ctx, change)
			require.NoError(t, err)
			err = reset(ctx, db.URL, Citus())
			require.True(t, errors.Is(err, errChanged), "reset: %v", err)
		})
	}
}

func dbOID(t *testing.T, db *DB) uint32 {
	t.Helper()
	var oid uint32
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT oid FROM pg_database WHERE datname = current_database()`).Scan(&oid))
	return oid
}

// Under EnvReuse a test's database goes to the binary's next test, empty
// and under a new name; one that DDL changed is dropped and the next test
// gets a new one.
func TestNewDBReusesAFinishedTestsDatabase(t *testing.T) {
	if !reuseEnabled() {
		t.Skipf("the binary does not reuse databases: %s=1 must be set from its start (withpg and withcluster set it)", EnvReuse)
	}
	ctx := context.Background()
	var first, firstURL string
	var firstOID uint32
	t.Run("Fills", func(t *testing.T) {
		db := NewDB(t)
		first, firstURL = db.Name, db.URL
		_, err := db.Pool.Exec(ctx, `INSERT INTO pgdurable.queues (name) VALUES ('reuse')`)
		require.NoError(t, err)
		firstOID = dbOID(t, db)
	})
	var second string
	t.Run("GetsItEmpty", func(t *testing.T) {
		db := NewDB(t)
		second = db.Name
		require.Equal(t, firstOID, dbOID(t, db), "the first test's database")
		require.NotEqual(t, first, db.Name, "under a new name: what the first test left running cannot reach it")
		_, err := pgx.Connect(ctx, firstURL)
		require.Error(t, err, "the first name is gone")
		require.Zero(t, count(t, db, `SELECT count(*) FROM pgdurable.queues`))
		_, err = db.Pool.Exec(ctx, `COMMENT ON TABLE pgdurable.queues IS 'changed'`)
		require.NoError(t, err)
	})
	t.Run("GetsANewOne", func(t *testing.T) {
		db := NewDB(t)
		require.NotEqual(t, second, db.Name)
		var exists bool
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, second).Scan(&exists))
		require.False(t, exists, "the changed database was dropped")
	})
}

// What a test made — a schema with a table, a table with a sequence and
// an index and a trigger on a template table calling its own function,
// some of it dropped and made again — is dropped, and the database is
// the template's again.
func TestResetDropsWhatATestMade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := reusableDB(t)
	objects := func() int {
		return count(t, db, `SELECT (SELECT count(*) FROM pg_class) + (SELECT count(*) FROM pg_proc)
			+ (SELECT count(*) FROM pg_namespace) + (SELECT count(*) FROM pg_trigger) + (SELECT count(*) FROM pg_type)`)
	}
	before := objects()
	for _, st := range []string{
		`CREATE SCHEMA reuse_made`,
		`CREATE TABLE reuse_made.t (id bigserial PRIMARY KEY, v text)`,
		`CREATE TABLE public.ledger (id serial PRIMARY KEY, amount int NOT NULL)`,
		`CREATE INDEX ledger_amount ON public.ledger (amount)`,
		`DROP TABLE public.ledger`,
		`CREATE TABLE public.ledger (id serial PRIMARY KEY, amount int NOT NULL)`,
		`CREATE INDEX queues_reuse ON pgdurable.queues (concurrency)`,
		`CREATE FUNCTION public.reuse_noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$`,
		`CREATE TRIGGER reuse_noop BEFORE INSERT ON pgdurable.queues FOR EACH ROW EXECUTE FUNCTION public.reuse_noop()`,
		`ALTER TABLE public.ledger ADD COLUMN note text`,
		`INSERT INTO public.ledger (amount) VALUES (1)`,
	} {
		_, err := db.Pool.Exec(ctx, st)
		require.NoError(t, err, st)
	}
	require.NoError(t, reset(ctx, db.URL, Citus()))
	db.Pool.Reset()
	require.Equal(t, before, objects(), "what the test made is gone")
	require.Zero(t, count(t, db, `SELECT count(*) FROM `+testSchema+`.ddl`))
	// And the next test may make it again.
	_, err := db.Pool.Exec(ctx, `CREATE TABLE public.ledger (id serial PRIMARY KEY)`)
	require.NoError(t, err)
	require.NoError(t, reset(ctx, db.URL, Citus()))
}
