// Package migrations holds pgdurable's schema: embedded goose v3 migrations
// (the only source of the schema) and River's own migrations, applied
// together by [Migrate] into one PostgreSQL schema of their own,
// DefaultSchema ("pgdurable") unless Opts.Schema names another, so that
// neither collides with an application's tables in the same database.
//
// An installation from before the tables had a schema of their own keeps
// them in public; Migrate(Up) moves them (see [Migrate]).
//
// Migrate never runs implicitly: engine.New does not touch the schema. Run it
// from a deploy step or at program start-up; enginetest runs it for tests.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

//go:embed *.sql
var files embed.FS

// FS returns the embedded migration files (`NNNNN_name.sql` with
// `-- +goose Up` and `-- +goose Down` sections), for tools that read the
// schema, such as sqlc or a hash of the schema in tests.
func FS() fs.FS { return files }

// DefaultSchema is the PostgreSQL schema that holds pgdurable's tables and
// River's unless Opts.Schema names another (engine.Config.Schema and
// engine's --schema must then name the same).
const DefaultSchema = "pgdurable"

// Tables are pgdurable's own tables, which Migrate creates in the schema
// (besides River's and the migration version table, VersionTable).
var Tables = []string{
	"workflow_runs", "workflow_steps", "dead_jobs", "workflow_signals",
	"schedules", "schedule_fires", "engine_processes", "ui_sessions", "queues", "queue_keys", "rate_limits", "layout",
	"two_phase_commits",
}

// RunTables are the tables of Tables whose rows belong to one run. On a
// Citus coordinator with worker nodes, Migrate(Up) makes them co-located
// distributed tables, placed whole on one worker node (see [Result]);
// every other table, River's included, stays on the coordinator.
var RunTables = []string{"workflow_runs", "workflow_steps", "workflow_signals", "dead_jobs"}

// VersionTable is goose's table of applied pgdurable migrations, in the
// schema.
const VersionTable = "pgdurable_schema_migrations"

// migrateLock names the advisory lock Migrate holds.
const migrateLock = "pgdurable: migrate"

// HoldOffMigrations waits for a Migrate under way on pool's database to
// end, then keeps any other from starting until release is called: it
// holds Migrate's advisory lock shared, on a connection of its own. An
// engine process holds it from before it reads the routes until it is
// registered, since Migrate refuses to change the routes while an engine
// process is registered and an engine reads them once: without it, a
// migration could change them between the two, and the engine go on with
// the old number, starting runs in the wrong route. release closes the
// connection; it never fails.
func HoldOffMigrations(ctx context.Context, pool *pgxpool.Pool) (release func(), err error) {
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("connecting to wait for migrations: %w", err)
	}
	release = func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx) // the lock goes with its session
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock_shared(hashtext($1))`, migrateLock); err != nil {
		release()
		return nil, fmt.Errorf("waiting for a migration under way: %w", err)
	}
	return release, nil
}

// validSchema is what a schema name may be: an identifier PostgreSQL takes
// unquoted and keeps as written, since River puts its schema option into
// SQL as it is.
var validSchema = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// keywords are the PostgreSQL keywords (15 to 18) that are not unreserved
// (pg_get_keywords() catcode R, T or C): written unquoted as a schema
// name, as River writes it, some break the statement ("select.river_job")
// and the rest are one grammar change away from it.
var keywords = strings.Fields(`all analyse analyze and any array as asc asymmetric
	authorization between bigint binary bit boolean both case cast char character
	check coalesce collate collation column concurrently constraint create cross
	current_catalog current_date current_role current_schema current_time
	current_timestamp current_user dec decimal default deferrable desc distinct do
	else end except exists extract false fetch float for foreign freeze from full
	grant greatest group grouping having ilike in initially inner inout int integer
	intersect interval into is isnull join json json_array json_arrayagg
	json_exists json_object json_objectagg json_query json_scalar json_serialize
	json_table json_value lateral leading least left like limit localtime
	localtimestamp merge_action national natural nchar none normalize not notnull
	null nullif numeric offset on only or order out outer overlaps overlay placing
	position precision primary real references returning right row select
	session_user setof similar smallint some substring symmetric system_user table
	tablesample then time timestamp to trailing treat trim true union unique user
	using values varchar variadic verbose when where window with xmlattributes
	xmlconcat xmlelement xmlexists xmlforest xmlnamespaces xmlparse xmlpi xmlroot
	xmlserialize xmltable`)

// ValidSchemaName reports why name cannot hold pgdurable's tables, or nil:
// lower-case ASCII letters, digits and underscores, not starting with a
// digit, at most 63 bytes, not a "pg_" name or information_schema (which
// PostgreSQL and pg_dump keep for themselves), and not a PostgreSQL
// keyword other than an unreserved one (such as select or user).
func ValidSchemaName(name string) error {
	if !validSchema.MatchString(name) || strings.HasPrefix(name, "pg_") {
		return fmt.Errorf("schema name %q: want lower-case letters, digits and underscores, starting with a letter or underscore, at most 63 bytes, not starting with pg_", name)
	}
	if name == "information_schema" {
		return fmt.Errorf("schema name %q: PostgreSQL keeps it for itself (and pg_dump leaves it out)", name)
	}
	if slices.Contains(keywords, name) {
		return fmt.Errorf("schema name %q: a PostgreSQL keyword, which SQL cannot name a schema by unquoted; pick another name, such as %s_pgdurable", name, name)
	}
	return nil
}

// Direction says which way [Migrate] moves the schema.
type Direction string

const (
	// Up applies River's migrations, then every pending pgdurable migration.
	Up Direction = "up"
	// Down rolls back pgdurable's migrations (all of them, or Opts.Steps),
	// and River's too when Opts.IncludeRiver is set.
	Down Direction = "down"
)

// Opts tunes [Migrate] and [GetStatus]. A nil *Opts uses the defaults.
type Opts struct {
	// Schema is the PostgreSQL schema that holds the tables, created by
	// Up when missing. Default DefaultSchema. "public" keeps an
	// installation from before the tables had a schema of their own where
	// it is (and moves nothing).
	Schema string
	// Steps limits a Down migration to this many pgdurable versions.
	// 0 means all of them. Ignored for Up.
	Steps int
	// IncludeRiver makes Down also remove River's tables once every
	// pgdurable migration is rolled back. Off by default because other
	// River users may share the schema.
	IncludeRiver bool
	// Routes, for Up, is the number of routes (1 to MaxRoutes) to spread
	// runs over: route 0 is the per-run tables (RunTables) in Schema,
	// route k ≥ 1 the same in schema RouteSchema(Schema, k), which Up
	// makes, marks and migrates with Schema (each holds a whole set of
	// pgdurable's tables, River's aside, of which the engine uses the
	// per-run ones). On a Citus coordinator each route's tables are
	// placed whole on one worker node, the routes spread evenly over the
	// nodes. A run's route follows from its workflow ID and the number of
	// routes, so routes never shrink, and more are refused once a schema
	// of several routes holds a run. A schema of one route that holds
	// runs can be given routes: its runs stay in route 0, their workflow
	// IDs, deduplication IDs and debounce keys pinned there (a Bloom
	// filter in the layout table, which the engine reads), refused when
	// one of its workflow IDs is a run ID that carries a route. Up refuses
	// more routes while an engine works on the schema (ErrEnginesRunning).
	// 0 keeps what the schema has (1 for a new one).
	Routes int
}

func (o *Opts) schema() (string, error) {
	if o == nil || o.Schema == "" {
		return DefaultSchema, nil
	}
	return o.Schema, ValidSchemaName(o.Schema)
}

// Result lists what one [Migrate] call changed. Both slices are empty when
// nothing was pending, which makes Migrate(Up) idempotent.
type Result struct {
	// Schema is the schema migrated.
	Schema string `json:"schema"`
	// Applied holds pgdurable migration versions applied (Up) or rolled back
	// (Down), in the order they ran.
	Applied []int64 `json:"applied"`
	// River holds River migration versions applied or rolled back.
	River []int `json:"river"`
	// Moved, when not nil, says that Up moved an installation's tables
	// out of public into Schema before migrating.
	Moved *Moved `json:"moved,omitempty"`
	// Routes is the number of routes of the schema after Up (see
	// Opts.Routes).
	Routes int `json:"routes,omitempty"`
	// Distributed, when not empty, is the Citus worker node (host:port)
	// Up moved RunTables to, with their rows: the database is a Citus
	// coordinator with worker nodes, and they were the coordinator's.
	Distributed string `json:"distributed,omitempty"`
	// Placed, on a Citus coordinator with worker nodes, is the worker node
	// (host:port) holding each route's per-run tables, by route, when Up
	// distributed or moved any.
	Placed []string `json:"placed,omitempty"`
}

// Migrate moves the schema of the database behind pool in direction.
//
// Up first moves an installation from before the tables had a schema of
// their own: when public holds pgdurable's tables and the schema does not,
// it moves them (with every run, step, signal, schedule and dead job) and
// the runs' River jobs into the schema, in one transaction, and leaves
// public a version table that stops an engine of the earlier version from
// starting on, or re-creating, the moved tables. It refuses, with
// ErrEnginesRunning and moving nothing, while an engine process of the
// earlier version is alive (seen in the last 30 s, or holding a run's
// lease): stop those first. (By then the schema and River's tables in it
// may have been created; they hold nothing, and the next Up uses them.) A database whose tables were moved out of the
// schema asked for fails with ErrMoved, naming where they went.
//
// On a Citus coordinator with active worker nodes, Up ends by putting
// RunTables on a worker node (see Result.Distributed), after adding the
// table the engine's two-phase commits update to Citus's metadata, which
// needs the coordinator in it (ErrCoordinatorNotInMetadata otherwise).
// It refuses with ErrDistributionRefused, before it makes any route, when
// another table has a foreign key to one of them or they were distributed
// by hand.
//
// Concurrent callers are safe: they take turns on a PostgreSQL advisory
// lock (one migration at a time per database), and the later ones find
// nothing pending. Errors name the failing migration.
//
// The role needs CREATE on the database when the schema does not exist
// yet; a schema created beforehand needs only to be owned by the role (or
// grant it CREATE and USAGE).
func Migrate(ctx context.Context, pool *pgxpool.Pool, direction Direction, opts *Opts) (*Result, error) {
	schema, err := opts.schema()
	if err != nil {
		return nil, err
	}
	if opts == nil {
		opts = &Opts{}
	}
	if direction == Up {
		if err := checkRoutes(schema, opts.Routes); err != nil {
			return nil, err
		}
	}
	if err := refuseCitusWorker(ctx, pool); err != nil {
		return nil, err
	}
	res := &Result{Schema: schema, Applied: []int64{}, River: []int{}}
	river, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: schema})
	if err != nil {
		return nil, fmt.Errorf("creating river migrator: %w", err)
	}
	// One migration at a time per database: CREATE SCHEMA and River's
	// first migration race when two deploy steps start together.
	// The lock's session is a connection of its own, so that a pool of
	// one connection still has it free for the migration; closing the
	// connection releases the lock, whatever happened to ctx.
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("connecting for migrations: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtext($1))`, migrateLock); err != nil {
		return nil, fmt.Errorf("waiting for another migration: %w", err)
	}
	if err := refuseMoved(ctx, pool, schema); err != nil {
		return nil, err
	}
	if err := refuseRoute(ctx, pool, schema); err != nil {
		return nil, err
	}
	if direction == Up {
		// A schema created beforehand by its owner needs no CREATE
		// privilege on the database, so none is asked for.
		var exists bool
		if err := pool.QueryRow(ctx, `SELECT to_regnamespace($1) IS NOT NULL`, schema).Scan(&exists); err != nil {
			return nil, fmt.Errorf("looking for schema %s: %w", schema, err)
		}
		// A move that would be refused is refused before anything is
		// created.
		if err := precheckMove(ctx, pool, schema); err != nil {
			return nil, err
		}
		if !exists {
			if _, err := pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
				var pgErr *pgconn.PgError
				if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
					return nil, fmt.Errorf("creating schema %s: %w: the role may not create schemas; have it created for the role (CREATE SCHEMA %s AUTHORIZATION <role>), or grant the role CREATE on the database", schema, err, schema)
				}
				return nil, fmt.Errorf("creating schema %s: %w", schema, err)
			}
		}
	}
	spool, err := schemaPool(ctx, pool, schema)
	if err != nil {
		return nil, err
	}
	defer spool.Close()
	db := stdlib.OpenDBFromPool(spool)
	defer db.Close()
	provider, err := newProvider(db)
	if err != nil {
		return nil, err
	}

	switch direction {
	case Up:
		rr, err := river.Migrate(ctx, rivermigrate.DirectionUp, nil)
		if err != nil {
			return nil, fmt.Errorf("applying river migrations: %w", err)
		}
		for _, v := range rr.Versions {
			res.River = append(res.River, v.Version)
		}
		if res.Moved, err = moveFromPublic(ctx, pool, schema); err != nil {
			return nil, err
		}
		applied, err := provider.Up(ctx)
		if err != nil {
			return nil, fmt.Errorf("applying pgdurable migrations: %w", err)
		}
		for _, r := range applied {
			res.Applied = append(res.Applied, r.Source.Version)
		}
		if schema == "public" {
			if err := keepInPublic(ctx, pool); err != nil {
				return nil, err
			}
		}
		// Refusals to distribute come before routes are made: each
		// refusal changes nothing of them.
		have, err := Routes(ctx, pool, schema)
		if err != nil {
			return nil, err
		}
		for k := range have {
			if _, err := distributable(ctx, pool, RouteSchema(schema, k)); err != nil {
				return nil, err
			}
		}
		if res.Routes, err = migrateRoutes(ctx, pool, schema, opts.Routes); err != nil {
			return nil, err
		}
		twoPhase, err := needsTwoPhase(ctx, pool, schema)
		if err != nil {
			return nil, err
		}
		if res.Distributed, err = distribute(ctx, pool, schema); err != nil {
			return nil, err
		}
		var moved bool
		for k := 1; k < res.Routes; k++ {
			node, err := distribute(ctx, pool, RouteSchema(schema, k))
			if err != nil {
				return nil, fmt.Errorf("route %d: %w", k, err)
			}
			moved = moved || node != ""
		}
		if res.Placed, err = placeRoutes(ctx, pool, schema, res.Routes, moved || res.Distributed != ""); err != nil {
			return nil, err
		}
		if res.Distributed != "" && len(res.Placed) > 0 && res.Placed[0] != "" {
			res.Distributed = res.Placed[0] // placing the routes may have moved route 0's tables
		}
		if twoPhase {
			if _, err := pool.Exec(ctx, `SELECT citus_add_local_table_to_metadata($1::regclass)`, twoPhaseTable(schema)); err != nil {
				return nil, fmt.Errorf("adding %s to Citus's metadata: %w", twoPhaseTable(schema), err)
			}
		}
	case Down:
		for i := 0; opts.Steps == 0 || i < opts.Steps; i++ {
			current, err := provider.GetDBVersion(ctx)
			if err != nil {
				return nil, fmt.Errorf("reading pgdurable schema version: %w", err)
			}
			if current > 0 {
				if err := downRoutes(ctx, pool, schema, current); err != nil {
					return nil, err
				}
			}
			r, err := provider.Down(ctx)
			if errors.Is(err, goose.ErrNoNextVersion) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("rolling back pgdurable migrations: %w", err)
			}
			res.Applied = append(res.Applied, r.Source.Version)
		}
		if opts.IncludeRiver {
			current, err := provider.GetDBVersion(ctx)
			if err != nil {
				return nil, fmt.Errorf("reading pgdurable schema version: %w", err)
			}
			if current != 0 {
				return res, fmt.Errorf("keeping river's tables: pgdurable schema is still at version %d", current)
			}
			rr, err := river.Migrate(ctx, rivermigrate.DirectionDown, &rivermigrate.MigrateOpts{TargetVersion: -1})
			if err != nil {
				return nil, fmt.Errorf("rolling back river migrations: %w", err)
			}
			for _, v := range rr.Versions {
				res.River = append(res.River, v.Version)
			}
		}
	default:
		return nil, fmt.Errorf("unknown migration direction %q (want %q or %q)", direction, Up, Down)
	}
	return res, nil
}

// Status reports each pgdurable migration and whether it is applied, plus
// River's applied versions.
type Status struct {
	// Schema is the schema read.
	Schema     string            `json:"schema"`
	Migrations []MigrationStatus `json:"migrations"`
	// RiverVersion is the highest applied River migration, 0 when none.
	RiverVersion int `json:"river_version"`
	// InPublic: Schema holds no tables yet, and public holds an
	// installation from before the tables had a schema of their own,
	// which Migrate(Up) moves.
	InPublic bool `json:"in_public"`
	// OtherSchemas are the other schemas of the database that hold
	// pgdurable's tables (see [Schemas]), in name order: where to look
	// when Schema holds none.
	OtherSchemas []string `json:"other_schemas"`
	// Routes is the number of routes Schema spreads its runs over (see
	// Opts.Routes); RoutesBehind lists those whose schema lacks a
	// migration Schema has (a Up that stopped part way; the next one
	// applies it).
	Routes       int   `json:"routes"`
	RoutesBehind []int `json:"routes_behind,omitempty"`
}

// MigrationStatus is one pgdurable migration's state.
type MigrationStatus struct {
	Version int64  `json:"version"`
	Name    string `json:"name"`
	Applied bool   `json:"applied"`
}

// GetStatus reads the state of opts.Schema without changing it. It fails
// with ErrMoved when the schema's tables were moved elsewhere.
func GetStatus(ctx context.Context, pool *pgxpool.Pool, opts *Opts) (*Status, error) {
	schema, err := opts.schema()
	if err != nil {
		return nil, err
	}
	if err := refuseCitusWorker(ctx, pool); err != nil {
		return nil, err
	}
	if err := refuseMoved(ctx, pool, schema); err != nil {
		return nil, err
	}
	out := &Status{Schema: schema}
	var versioned, riverTables bool
	err = pool.QueryRow(ctx, `SELECT to_regclass(format('%I.%I', $1::text, $2::text)) IS NOT NULL,
		to_regclass(format('%I.river_migration', $1::text)) IS NOT NULL`,
		schema, VersionTable).Scan(&versioned, &riverTables)
	if err != nil {
		return nil, fmt.Errorf("reading pgdurable migration status: %w", err)
	}
	if out.InPublic, err = inPublic(ctx, pool, schema); err != nil {
		return nil, err
	}
	all, err := Schemas(ctx, pool)
	if err != nil {
		return nil, err
	}
	out.OtherSchemas = slices.DeleteFunc(all, func(s string) bool { return s == schema })
	if out.Routes, err = Routes(ctx, pool, schema); err != nil {
		return nil, err
	}
	if out.RoutesBehind, err = routesBehind(ctx, pool, schema, out.Routes); err != nil {
		return nil, err
	}
	if !versioned {
		// Nothing applied; goose would create its table to say so.
		provider, err := newProvider(nil)
		if err != nil {
			return nil, err
		}
		for _, s := range provider.ListSources() {
			out.Migrations = append(out.Migrations, MigrationStatus{Version: s.Version, Name: s.Path})
		}
	} else {
		spool, err := schemaPool(ctx, pool, schema)
		if err != nil {
			return nil, err
		}
		defer spool.Close()
		db := stdlib.OpenDBFromPool(spool)
		defer db.Close()
		provider, err := newProvider(db)
		if err != nil {
			return nil, err
		}
		st, err := provider.Status(ctx)
		if err != nil {
			return nil, fmt.Errorf("reading pgdurable migration status: %w", err)
		}
		for _, s := range st {
			out.Migrations = append(out.Migrations, MigrationStatus{
				Version: s.Source.Version,
				Name:    s.Source.Path,
				Applied: s.State == goose.StateApplied,
			})
		}
	}
	if !riverTables {
		return out, nil
	}
	river, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: schema})
	if err != nil {
		return nil, fmt.Errorf("creating river migrator: %w", err)
	}
	versions, err := river.ExistingVersions(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading river migration status: %w", err)
	}
	for _, v := range versions {
		out.RiverVersion = max(out.RiverVersion, v.Version)
	}
	return out, nil
}

// schemaPool is a small pool like pool whose connections resolve names in
// schema alone: the migrations name their tables without a schema, as
// goose names its version table.
func schemaPool(ctx context.Context, pool *pgxpool.Pool, schema string) (*pgxpool.Pool, error) {
	cfg := pool.Config()
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MinConns, cfg.MaxConns = 0, 2
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting for migrations: %w", err)
	}
	return p, nil
}

// newProvider is goose over db; a nil db serves only ListSources.
func newProvider(db *sql.DB) (*goose.Provider, error) {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, fmt.Errorf("creating migration lock: %w", err)
	}
	if db == nil {
		db = &sql.DB{}
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, files,
		goose.WithSessionLocker(locker),
		goose.WithTableName(VersionTable),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return nil, fmt.Errorf("loading pgdurable migrations: %w", err)
	}
	return p, nil
}

// distribution is what distribute would do to a schema's RunTables: runs
// is the runs' table's name (sanitized), local the tables still the
// coordinator's own.
type distribution struct {
	runs  string
	local []string
}

// distributable reads what distribute would do to schema's RunTables,
// changing nothing: nil when there is nothing to do (not a Citus
// coordinator with worker nodes, or the tables moved), an error that is
// ErrDistributionRefused when distribute would refuse them (see
// distribute). Migrate asks it of every route's schema before it makes
// routes, so that such a refusal comes before any change.
func distributable(ctx context.Context, pool *pgxpool.Pool, schema string) (*distribution, error) {
	var citus bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`).Scan(&citus); err != nil {
		return nil, fmt.Errorf("reading whether the database is a Citus coordinator: %w", err)
	}
	if !citus {
		return nil, nil
	}
	tables := make([]string, len(RunTables))
	for i, t := range RunTables {
		tables[i] = pgx.Identifier{schema, t}.Sanitize()
	}
	runs := tables[0]
	var workers int
	var localAt, foreignAt []int
	// Positions in tables (from 1), not names: a table's regclass text
	// leaves its schema out when the schema is on the search_path.
	err := pool.QueryRow(ctx, `
WITH t AS (SELECT rel, i FROM unnest($1::regclass[]) WITH ORDINALITY AS u(rel, i)),
     runs AS (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = $2::regclass)
SELECT (SELECT count(*) FROM pg_dist_node WHERE groupid <> 0 AND noderole = 'primary' AND isactive),
       ARRAY(SELECT t.i FROM t WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = t.rel) ORDER BY t.i),
       ARRAY(SELECT t.i FROM t JOIN pg_dist_partition p ON p.logicalrelid = t.rel
             WHERE p.partmethod <> 'n' OR p.repmodel <> 's' OR p.colocationid = 0
                OR p.colocationid IS DISTINCT FROM (SELECT colocationid FROM runs) ORDER BY t.i)`,
		tables, runs).Scan(&workers, &localAt, &foreignAt)
	if err != nil {
		return nil, fmt.Errorf("reading the Citus cluster's worker nodes: %w", err)
	}
	pick := func(at []int) []string {
		out := make([]string, len(at))
		for i, n := range at {
			out[i] = tables[n-1]
		}
		return out
	}
	local := pick(localAt)
	switch {
	case workers == 0, len(local) == 0 && len(foreignAt) == 0:
		// A coordinator alone keeps every table its own; or they moved.
		return nil, nil
	case len(foreignAt) > 0:
		names := make([]string, len(foreignAt))
		for i, n := range foreignAt {
			names[i] = schema + "." + RunTables[n-1]
		}
		return nil, refusedDistribution("distributing the per-run tables of schema %s: %s distributed otherwise (by a column, as reference tables, or as Citus-managed local tables), not by migrate: undistribute them (undistribute_table) and run migrate up again",
			schema, strings.Join(names, ", "))
	}
	var outside []string
	rows, err := pool.Query(ctx, `
SELECT format('%I.%I (%I)', n.nspname, c.relname, k.conname)
FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE k.contype = 'f' AND k.confrelid = ANY ($1::regclass[]) AND NOT k.conrelid = ANY ($1::regclass[]) ORDER BY 1`, tables)
	if err == nil {
		outside, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		return nil, fmt.Errorf("reading the foreign keys to the per-run tables: %w", err)
	}
	if len(outside) > 0 {
		return nil, refusedDistribution("distributing the per-run tables of schema %s: foreign keys of other tables refer to them (%s), which Citus cannot keep once they are on a worker node: drop those foreign keys and run migrate up again",
			schema, strings.Join(outside, ", "))
	}
	return &distribution{runs: runs, local: local}, nil
}

// ErrDistributionRefused: Migrate(Up) on a Citus coordinator refused to
// distribute the per-run tables (some distributed otherwise by hand, or
// another table's foreign key to one) before changing anything of them or
// of the routes; the error names the tables and what to do.
var ErrDistributionRefused = errors.New("distribution of the per-run tables refused")

// distributionRefusal is an error that is ErrDistributionRefused.
type distributionRefusal struct{ msg string }

func (r distributionRefusal) Error() string        { return r.msg }
func (r distributionRefusal) Is(target error) bool { return target == ErrDistributionRefused }

func refusedDistribution(format string, args ...any) error {
	return distributionRefusal{fmt.Sprintf(format, args...)}
}

// distribute makes schema's RunTables co-located distributed tables
// without a distribution column, placed whole on one worker node that
// Citus picks, when pool's database is a Citus coordinator with active
// worker nodes and they are the coordinator's own tables; their rows move
// with them. A table a migration created after the others moved (a
// migration rolled back and applied again) joins them. It returns the
// node (host:port), or "" when there was nothing to do. It runs in one
// transaction: the foreign keys among the tables that move are dropped
// while they move (Citus refuses one between a coordinator's table and a
// distributed one) and made again. It refuses, changing nothing, when
// some of the tables were distributed otherwise (by hand: by a column, as
// reference tables), when a table outside them has a foreign key to one
// (Citus cannot keep it once they are on a worker node), and, with runs to
// move, while an engine process works on them (ErrEnginesRunning): an
// engine of an earlier version fails on the moved tables.
func distribute(ctx context.Context, pool *pgxpool.Pool, schema string) (string, error) {
	d, err := distributable(ctx, pool, schema)
	if d == nil || err != nil {
		return "", err
	}
	runs, local := d.runs, d.local
	tx, err := pool.Begin(ctx)
	if err != nil {
		return "", fmt.Errorf("distributing the per-run tables: %w", err)
	}
	defer tx.Rollback(ctx)
	if slices.Contains(local, runs) {
		if err := refuseLiveOn(ctx, tx, schema); err != nil {
			return "", err
		}
	}
	type fkey struct{ table, name, def string }
	rows, err := tx.Query(ctx, `
SELECT format('%I.%I', n.nspname, c.relname), conname, pg_get_constraintdef(k.oid)
FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE k.contype = 'f' AND k.confrelid = $1::regclass AND ($1::regclass = ANY ($2::regclass[]) OR k.conrelid = ANY ($2::regclass[]))
ORDER BY 1, 2`, runs, local)
	if err != nil {
		return "", fmt.Errorf("reading the foreign keys to the runs' table: %w", err)
	}
	fkeys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (fkey, error) {
		var k fkey
		return k, r.Scan(&k.table, &k.name, &k.def)
	})
	if err != nil {
		return "", fmt.Errorf("reading the foreign keys to the runs' table: %w", err)
	}
	for _, k := range fkeys {
		if _, err := tx.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s DROP CONSTRAINT %s`, k.table, pgx.Identifier{k.name}.Sanitize())); err != nil {
			return "", fmt.Errorf("dropping foreign key %s while the per-run tables move: %w", k.name, err)
		}
	}
	for _, t := range local {
		colocate := runs
		if t == runs {
			colocate = "none"
		}
		if _, err := tx.Exec(ctx, `SELECT create_distributed_table($1::regclass, NULL, colocate_with => $2)`, t, colocate); err != nil {
			return "", fmt.Errorf("distributing %s: %w", t, err)
		}
	}
	for _, k := range fkeys {
		if _, err := tx.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s ADD CONSTRAINT %s %s`, k.table, pgx.Identifier{k.name}.Sanitize(), k.def)); err != nil {
			return "", fmt.Errorf("making foreign key %s again: %w", k.name, err)
		}
	}
	var node string
	err = tx.QueryRow(ctx, `SELECT nodename || ':' || nodeport FROM citus_shards WHERE table_name = $1::regclass LIMIT 1`, runs).Scan(&node)
	if err != nil {
		return "", fmt.Errorf("reading where the per-run tables went: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return "", fmt.Errorf("distributing the per-run tables: %w", err)
	}
	// Their rows were copied to the worker node; the coordinator's copies
	// are no longer read, and only take disk.
	for _, t := range local {
		if _, err := pool.Exec(ctx, `SELECT truncate_local_data_after_distributing_table($1::regclass)`, t); err != nil {
			return node, fmt.Errorf("removing the coordinator's copy of %s: %w", t, err)
		}
	}
	return node, nil
}

// ErrCitusWorker: the database is a Citus worker node's, which holds the
// shards of the engine's per-run tables under other names: the engine,
// its migrations and its commands work on the coordinator's database,
// whose URL the error asks for.
var ErrCitusWorker = errors.New("this database is a Citus worker node's: connect to the coordinator's database instead (the URL Citus's clients use); a worker node holds only shards of the engine's tables, under other names, and migrating it would install the tables beside them")

// RefuseCitusWorker fails with ErrCitusWorker when pool's database is a
// Citus worker node's, and with the query's error when it cannot tell;
// nil on plain PostgreSQL and on a coordinator. Migrate and GetStatus
// check it; the engine binary's commands check it on every connection,
// so that one that only reads (runs list) does not show a worker node's
// share of the runs as if it were all of them.
func RefuseCitusWorker(ctx context.Context, pool *pgxpool.Pool) error {
	return refuseCitusWorker(ctx, pool)
}

// refuseCitusWorker fails with ErrCitusWorker when pool's database is a
// Citus worker node's: one whose node group, which the coordinator set
// when it added the node, is not the coordinator's (0).
func refuseCitusWorker(ctx context.Context, pool *pgxpool.Pool) error {
	var citus bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('pg_catalog.pg_dist_local_group') IS NOT NULL`).Scan(&citus); err != nil || !citus {
		return err
	}
	var group int
	if err := pool.QueryRow(ctx, `SELECT coalesce(max(groupid), 0) FROM pg_dist_local_group`).Scan(&group); err != nil {
		return fmt.Errorf("reading whether the database is a Citus worker node's: %w", err)
	}
	if group != 0 {
		return fmt.Errorf("%w (node group %d)", ErrCitusWorker, group)
	}
	return nil
}

// ErrCoordinatorNotInMetadata is Migrate's refusal on a Citus coordinator
// with worker nodes whose own node is not in Citus's metadata: the
// engine's transactions that write both the coordinator and a worker node
// commit in two phases only through a table Citus manages on the
// coordinator (see needsTwoPhase), which needs it there.
var ErrCoordinatorNotInMetadata = errors.New("the coordinator is not in Citus's metadata, which the engine needs to commit a transaction that writes both the coordinator and a worker node in two phases: " +
	"run SELECT citus_set_coordinator_host('<the coordinator's host as the worker nodes reach it>', <port>) on the coordinator's database, then migrate up again")

// needsTwoPhase reports whether schema's two_phase_commits table
// (migration 33) is yet to be added to Citus's metadata, as a Citus local
// table, which Up does last (so that a refusal before changes nothing):
// on a Citus coordinator with worker nodes, where it is not yet. An update
// of it, which the engine's two_phase_commit() makes before a transaction
// that wrote the coordinator commits, is a modification Citus executes on
// the coordinator, after which it commits the transaction in two phases
// (PREPARE TRANSACTION on each worker node written, the coordinator's
// commit, COMMIT PREPARED), where it would otherwise commit the worker
// node's part first and the coordinator's after it. A coordinator with
// worker nodes that is not in the metadata itself is refused
// (ErrCoordinatorNotInMetadata), before anything changes.
func needsTwoPhase(ctx context.Context, pool *pgxpool.Pool, schema string) (bool, error) {
	var citus bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`).Scan(&citus); err != nil {
		return false, fmt.Errorf("reading whether the database is a Citus coordinator: %w", err)
	}
	if !citus {
		return false, nil
	}
	var workers int
	var coordinator, managed bool
	err := pool.QueryRow(ctx, `
SELECT (SELECT count(*) FROM pg_dist_node WHERE groupid <> 0 AND noderole = 'primary' AND isactive),
       EXISTS (SELECT 1 FROM pg_dist_node WHERE groupid = 0),
       EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = $1::regclass)`, twoPhaseTable(schema)).Scan(&workers, &coordinator, &managed)
	switch {
	case err != nil:
		return false, fmt.Errorf("reading the Citus cluster's nodes: %w", err)
	case workers == 0 || managed:
		return false, nil
	case !coordinator:
		return false, ErrCoordinatorNotInMetadata
	}
	return true, nil
}

// twoPhaseTable is schema's two_phase_commits, quoted.
func twoPhaseTable(schema string) string {
	return pgx.Identifier{schema, "two_phase_commits"}.Sanitize()
}

// refuseLiveOn fails with ErrEnginesRunning when an engine process works
// on schema's tables (see liveWork).
func refuseLiveOn(ctx context.Context, tx pgx.Tx, schema string) error {
	msg, err := liveWork(ctx, tx, schema, true)
	if err != nil || msg == "" {
		return err
	}
	return fmt.Errorf("%w (%s): to put the per-run tables of schema %s on a worker node, stop every engine working on them (an engine of an earlier version fails on the moved tables), wait for their leases to expire, and migrate again",
		ErrEnginesRunning, msg, schema)
}
