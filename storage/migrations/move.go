package migrations

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrEnginesRunning: Migrate(Up) found engine processes alive on the
// tables it would move (out of public, or onto a Citus worker node) or
// spread over more routes, and changed nothing. Stop them (or wait until their rows and leases have
// expired) and migrate again; or, if the installation is meant to stay in
// public, migrate with Schema "public".
var ErrEnginesRunning = errors.New("engine processes are running on pgdurable's tables")

// ErrMoved: the schema asked for is where pgdurable's tables were, before
// Migrate(Up) moved them to another schema; the error names it.
var ErrMoved = errors.New("pgdurable's tables were moved")

// Moved is what Migrate(Up) moved out of public (see [Migrate]).
type Moved struct {
	// Tables are the tables moved, the version table among them.
	Tables []string `json:"tables"`
	// RiverJobs is how many of the runs' River jobs (deliveries) moved
	// to the schema's River tables. River's own tables stay in public
	// for any other River client; no other job is touched.
	RiverJobs int64 `json:"river_jobs"`
}

// movedVersion is the one version a moved installation's public version
// table holds (besides goose's 0): an engine of the earlier version reads
// every migration as missing below it, so `engine serve` refuses to start
// ("not migrated") and `engine migrate up` refuses to re-create the tables
// ("detected 24 missing (out-of-order) migrations lower than database
// version").
const movedVersion = 99_999_999_999

// riverKind is the River job kind of a run's delivery (engine's
// queue.Kind): the jobs the move carries to the schema's River tables.
const riverKind = "pgdurable.run"

// processLive is how recently a process row must have been written for
// the move to count its process as running (engine's
// maintenance.ProcessLive: three of its 10 s beats).
const processLive = 30 * time.Second

// moveLockTimeout bounds how long the move waits for an earlier engine's
// transaction to let go of a table, so a process that is still working
// fails the migration instead of stalling it.
const moveLockTimeout = 10 * time.Second

// moveFromPublic moves an installation from before the tables had a
// schema of their own (see Migrate) into schema, or returns nil when
// there is none to move.
func moveFromPublic(ctx context.Context, pool *pgxpool.Pool, schema string) (*Moved, error) {
	if schema == "public" {
		return nil, nil
	}
	var moved *Moved
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// Migrate's lock keeps a second migrator out until this commits;
		// it then finds nothing left to move.
		if legacy, err := inPublic(ctx, tx, schema); err != nil || !legacy {
			return err
		}
		tables, err := existing(ctx, tx, append([]string{VersionTable}, Tables...))
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = '%dms'", moveLockTimeout.Milliseconds())); err != nil {
			return err
		}
		qualified := make([]string, len(tables))
		for i, t := range tables {
			qualified[i] = pgx.Identifier{"public", t}.Sanitize()
		}
		if _, err := tx.Exec(ctx, "LOCK TABLE "+strings.Join(qualified, ", ")+" IN ACCESS EXCLUSIVE MODE"); err != nil {
			return fmt.Errorf("%w (a session held a lock on them for %s; see pg_locks): stop every engine working on them, or end that session, and migrate again: %w",
				ErrEnginesRunning, moveLockTimeout, err)
		}
		if err := refuseLive(ctx, tx, schema, tables); err != nil {
			return err
		}
		for i, t := range tables {
			if _, err := tx.Exec(ctx, "ALTER TABLE "+qualified[i]+" SET SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
				return fmt.Errorf("moving table %s to schema %s: %w", t, schema, err)
			}
		}
		if err := leaveTombstone(ctx, tx, schema); err != nil {
			return err
		}
		jobs, err := moveRiverJobs(ctx, tx, schema)
		if err != nil {
			return err
		}
		moved = &Moved{Tables: tables, RiverJobs: jobs}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("moving pgdurable's tables from public to schema %s: %w", schema, err)
	}
	return moved, nil
}

// inPublic reports whether public holds an installation to move into
// schema: goose's table of an earlier version there, holding a version
// (an engine of that version that started on an unmigrated database left
// it holding only goose's 0) other than the one a move leaves, while
// schema has no version table of its own yet.
func inPublic(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, schema string) (bool, error) {
	if schema == "public" {
		return false, nil
	}
	var legacy, taken bool
	if err := q.QueryRow(ctx, `SELECT to_regclass(format('public.%I', $2::text)) IS NOT NULL,
		to_regclass(format('%I.%I', $1::text, $2::text)) IS NOT NULL`, schema, VersionTable).Scan(&legacy, &taken); err != nil {
		return false, fmt.Errorf("looking for tables in public: %w", err)
	}
	if !legacy || taken {
		return false, nil
	}
	var version *int64
	var comment *string
	if err := q.QueryRow(ctx, `SELECT max(version_id), obj_description(to_regclass(format('public.%I', $1::text)), 'pg_class')
		FROM public.`+VersionTable, VersionTable).Scan(&version, &comment); err != nil {
		return false, fmt.Errorf("reading the version of the tables in public: %w", err)
	}
	if comment != nil && strings.HasPrefix(*comment, keptComment) {
		return false, nil // migrated by this version with Schema "public": meant to stay
	}
	return installed(version), nil
}

// installed reports whether a version table's highest version, version,
// is an installation's: not empty (nil, or goose's 0 alone, which an
// engine of an earlier version left on a database nobody migrated) and
// not what a move leaves behind.
func installed(version *int64) bool {
	return version != nil && *version != 0 && *version != movedVersion
}

// keptComment marks the version table of an installation that Migrate put
// (or kept) in public on purpose, which a migration into another schema
// must leave alone: that is a second installation.
const keptComment = "pgdurable keeps its tables in schema public"

// keepInPublic marks public's installation as meant to stay there.
func keepInPublic(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `COMMENT ON TABLE `+pgx.Identifier{"public", VersionTable}.Sanitize()+` IS `+
		quoteLiteral(keptComment+" (migrated with schema public): a migration into another schema starts a second installation there and leaves these tables alone."))
	if err != nil {
		return fmt.Errorf("marking the tables in public as kept there: %w", err)
	}
	return nil
}

// precheckMove refuses, as moveFromPublic would, a move while engines run
// on the tables in public, before Migrate creates anything; moveFromPublic
// checks again under its locks.
func precheckMove(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if legacy, err := inPublic(ctx, tx, schema); err != nil || !legacy {
			return err
		}
		tables, err := existing(ctx, tx, Tables)
		if err != nil {
			return err
		}
		return refuseLive(ctx, tx, schema, tables)
	})
	if err != nil {
		return fmt.Errorf("moving pgdurable's tables from public to schema %s: %w", schema, err)
	}
	return nil
}

// existing returns those of tables that public holds, in order (an
// earlier version may predate some).
func existing(ctx context.Context, tx pgx.Tx, tables []string) ([]string, error) {
	rows, err := tx.Query(ctx, `SELECT t FROM unnest($1::text[]) WITH ORDINALITY AS u(t, i)
		WHERE to_regclass(format('public.%I', t)) IS NOT NULL ORDER BY i`, tables)
	if err != nil {
		return nil, fmt.Errorf("listing the tables in public: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// refuseLive fails with ErrEnginesRunning when an engine process works
// on the tables: its registry row was written lately, or a run's lease
// is held.
func refuseLive(ctx context.Context, tx pgx.Tx, schema string, tables []string) error {
	msg, err := liveWork(ctx, tx, "public", slices.Contains(tables, "engine_processes"))
	if err != nil || msg == "" {
		return err
	}
	return fmt.Errorf("%w (%s): to move them to schema %s, stop every engine working on them, wait for their leases to expire, and migrate again; to keep them in public, pass --schema public (migrations.Opts.Schema, engine.Config.Schema) instead",
		ErrEnginesRunning, msg, schema)
}

// liveWork says what works on schema's tables ("" for nothing): the
// engine processes whose registry row was written lately (when processes:
// the schema has the registry) and the runs whose lease is held.
func liveWork(ctx context.Context, tx pgx.Tx, schema string, processes bool) (string, error) {
	var live []string
	if processes {
		rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT format('%%s (pid %%s, seen %%s ago)', hostname, pid, date_trunc('second', now() - last_seen_at))
			FROM %s WHERE last_seen_at > now() - $1 * interval '1 millisecond' ORDER BY last_seen_at DESC LIMIT 10`,
			pgx.Identifier{schema, "engine_processes"}.Sanitize()), processLive.Milliseconds())
		if err == nil {
			live, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		if err != nil {
			return "", fmt.Errorf("reading the engine processes in %s: %w", schema, err)
		}
	}
	var leased int64
	err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE lease_expires_at > now()`, pgx.Identifier{schema, "workflow_runs"}.Sanitize())).Scan(&leased)
	if err != nil {
		return "", fmt.Errorf("reading the runs in %s: %w", schema, err)
	}
	if len(live) == 0 && leased == 0 {
		return "", nil
	}
	msg := fmt.Sprintf("%d runs are held by a delivery", leased)
	if len(live) > 0 {
		msg = "processes seen in the last " + processLive.String() + ": " + strings.Join(live, ", ") + "; " + msg
	}
	return msg, nil
}

// leaveTombstone puts a version table back in public that holds only
// movedVersion, and names schema in its comment.
func leaveTombstone(ctx context.Context, tx pgx.Tx, schema string) error {
	table := pgx.Identifier{"public", VersionTable}.Sanitize()
	stmts := []string{
		// goose's own table, as its Postgres dialect creates it.
		`CREATE TABLE ` + table + ` (
			id integer PRIMARY KEY GENERATED BY DEFAULT AS IDENTITY,
			version_id bigint NOT NULL,
			is_applied boolean NOT NULL,
			tstamp timestamp NOT NULL DEFAULT now())`,
		fmt.Sprintf(`INSERT INTO %s (version_id, is_applied) VALUES (0, true), (%d, true)`, table, movedVersion),
		`COMMENT ON TABLE ` + table + ` IS ` + quoteLiteral(tombstoneComment+schema+
			". This table keeps an engine of an earlier version from starting on the tables in public, or creating them again; drop it once no such engine is left."),
	}
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			return fmt.Errorf("leaving a version table in public: %w", err)
		}
	}
	return nil
}

const tombstoneComment = "pgdurable moved its tables to schema "

// quoteLiteral quotes s as an SQL string literal (COMMENT takes no
// parameters); s is ours and holds a validated schema name.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// moveRiverJobs moves the runs' River jobs to schema's River tables (which
// Migrate created first: River's migrations cannot share one transaction)
// from public's (which stay, for any other River client), returning
// how many moved. A job a stopped engine was running is made available
// again, as River's rescuer would make it once stuck.
func moveRiverJobs(ctx context.Context, tx pgx.Tx, schema string) (int64, error) {
	var public bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass('public.river_job') IS NOT NULL`).Scan(&public); err != nil || !public {
		return 0, err
	}
	// The columns both tables have (public's River may be older); id is
	// left to the schema's sequence, as nothing refers to it.
	rows, err := tx.Query(ctx, `SELECT column_name FROM information_schema.columns WHERE table_schema = 'public' AND table_name = 'river_job'
		INTERSECT SELECT column_name FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'river_job'`, schema)
	if err != nil {
		return 0, fmt.Errorf("reading river's columns: %w", err)
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, fmt.Errorf("reading river's columns: %w", err)
	}
	var into, from []string
	for _, c := range cols {
		if c == "id" {
			continue
		}
		id := pgx.Identifier{c}.Sanitize()
		into = append(into, id)
		if c == "state" {
			id = `(CASE WHEN state = 'running' THEN 'available' ELSE state::text END)::` + pgx.Identifier{schema, "river_job_state"}.Sanitize()
		}
		from = append(from, id)
	}
	tag, err := tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "river_job"}.Sanitize()+` (`+strings.Join(into, ", ")+`)
		SELECT `+strings.Join(from, ", ")+` FROM public.river_job WHERE kind = $1 ORDER BY id ON CONFLICT DO NOTHING`, riverKind)
	if err != nil {
		return 0, fmt.Errorf("moving the runs' river jobs: %w", err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM public.river_job WHERE kind = $1`, riverKind); err != nil {
		return 0, fmt.Errorf("moving the runs' river jobs: %w", err)
	}
	return tag.RowsAffected(), nil
}

// refuseMoved fails with ErrMoved when schema's tables were moved out.
func refuseMoved(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	var comment *string
	err := pool.QueryRow(ctx, `SELECT obj_description(to_regclass(format('%I.%I', $1::text, $2::text)), 'pg_class')`,
		schema, VersionTable).Scan(&comment)
	if err != nil {
		return fmt.Errorf("reading schema %s: %w", schema, err)
	}
	if comment == nil || !strings.HasPrefix(*comment, tombstoneComment) {
		return nil
	}
	to, _, _ := strings.Cut(strings.TrimPrefix(*comment, tombstoneComment), ".")
	return fmt.Errorf("%w from schema %s to schema %s: use --schema %s (engine.Config.Schema, migrations.Opts.Schema)", ErrMoved, schema, to, to)
}

// Schemas lists the schemas of the database that hold pgdurable's tables
// (a version table with a migration applied, other than what a move
// leaves in public, and other than an installation's route schemas), in
// name order: where to point a mistyped --schema.
func Schemas(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	rows, err := pool.Query(ctx, `SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relname = $1 AND c.relkind IN ('r', 'p')
		AND coalesce(obj_description(n.oid, 'pg_namespace'), '') NOT LIKE $2 ORDER BY n.nspname`, VersionTable, routeComment+"%")
	if err != nil {
		return nil, fmt.Errorf("listing pgdurable's schemas: %w", err)
	}
	candidates, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("listing pgdurable's schemas: %w", err)
	}
	var out []string
	for _, s := range candidates {
		var version *int64
		// The name comes from the catalog; Identifier quotes it anyway.
		err := pool.QueryRow(ctx, `SELECT max(version_id) FROM `+pgx.Identifier{s, VersionTable}.Sanitize()).Scan(&version)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			continue // not ours to read (permission denied), or gone meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("reading the version in schema %s: %w", s, err)
		}
		if installed(version) {
			out = append(out, s)
		}
	}
	return out, nil
}
