package migrations

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
)

// MaxRoutes bounds Opts.Routes: a run ID carries its route in one byte.
const MaxRoutes = 256

// ErrRoutesRefused: Migrate(Up) refused the routes Opts.Routes asks for
// (out of range, fewer than the schema has, more while a schema of
// several routes holds a run, runs it cannot pin) or a schema it would
// take for a route, and changed nothing of them; the error says why and
// what to do.
var ErrRoutesRefused = errors.New("routes refused")

// refusal is an error that is ErrRoutesRefused.
type refusal struct{ msg string }

func (r refusal) Error() string        { return r.msg }
func (r refusal) Is(target error) bool { return target == ErrRoutesRefused }

// refuse is a refusal of the routes, formatted as fmt.Sprintf does.
func refuse(format string, args ...any) error { return refusal{fmt.Sprintf(format, args...)} }

// routesVersion is the migration that records the routes (layout).
const routesVersion = 32

// routeComment marks a route schema, so that Schemas does not list it as
// an installation of its own.
const routeComment = "pgdurable: route "

// RouteSchema is the schema that holds route k's per-run tables (k ≥ 1)
// of the installation in schema: <schema>_r<k>. Route 0's are schema's
// own.
func RouteSchema(schema string, k int) string {
	if k == 0 {
		return schema
	}
	return fmt.Sprintf("%s_r%d", schema, k)
}

// Routes reads the number of routes of the installation in schema (see
// Opts.Routes): 1 when its migrations predate routes.
func Routes(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, schema string) (int, error) {
	var exists bool
	if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{schema, "layout"}.Sanitize()).Scan(&exists); err != nil {
		return 0, fmt.Errorf("reading the routes of schema %s: %w", schema, err)
	}
	if !exists {
		return 1, nil
	}
	var routes int
	if err := q.QueryRow(ctx, `SELECT routes FROM `+pgx.Identifier{schema, "layout"}.Sanitize()).Scan(&routes); err != nil {
		return 0, fmt.Errorf("reading the routes of schema %s: %w", schema, err)
	}
	return routes, nil
}

// migrateRoutes brings the route schemas of the installation in schema
// (just migrated Up) to its version, making new ones when want asks for
// more routes than it has, and returns the routes it has then. want 0
// keeps the routes as they are. A schema of one route that holds runs
// keeps them in route 0, with their workflow IDs, deduplication IDs and
// debounce keys pinned there (pinRuns). More routes are refused while a
// schema that has routes holds a run (a workflow ID's route follows from
// the number of routes, so its earlier runs would be looked for in the
// wrong route), and fewer are refused always.
func migrateRoutes(ctx context.Context, pool *pgxpool.Pool, schema string, want int) (int, error) {
	have, err := Routes(ctx, pool, schema)
	if err != nil {
		return 0, err
	}
	switch {
	case want != 0 && want < have:
		return have, refuse("schema %s has %d routes, and routes never shrink (a workflow ID's route follows from their number): asked for %d; leave --routes out (Opts.Routes 0) to keep %d", schema, have, want, have)
	case want > have:
		// Engines read the number of routes once, when they start: one
		// that read the old number would put a workflow ID's next run in
		// another route than an engine that reads the new one.
		tx, err := pool.Begin(ctx)
		if err != nil {
			return have, err
		}
		msg, err := liveWork(ctx, tx, schema, true)
		_ = tx.Rollback(ctx)
		if err != nil {
			return have, err
		}
		if msg != "" {
			return have, fmt.Errorf("%w (%s): engines read the number of routes when they start, so stop every engine on schema %s, then migrate up --routes %d again", ErrEnginesRunning, msg, schema, want)
		}
		for k := 0; k < have && have > 1; k++ {
			var held bool
			if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+pgx.Identifier{RouteSchema(schema, k), "workflow_runs"}.Sanitize()+`)`).Scan(&held); err != nil {
				return have, fmt.Errorf("reading whether route %d of schema %s holds runs: %w", k, schema, err)
			}
			if held {
				return have, refuse("schema %s holds runs, so its routes stay %d: a workflow ID's route follows from the number of routes, and the runs of %d routes would be looked for in the wrong one (a schema of one route that holds runs can be given routes: they stay in route 0); make the routes in a new schema (--schema), or leave --routes out to keep %d", schema, have, have, have)
			}
		}
	}
	routes := max(have, want)
	if routes == have {
		for k := 1; k < routes; k++ {
			if err := migrateRoute(ctx, pool, schema, k); err != nil {
				return have, err
			}
		}
		return routes, nil
	}
	// The runs' pins are read first, under a lock that holds off new runs
	// until the routes are recorded, so that a refusal makes nothing.
	tx, err := pool.Begin(ctx)
	if err != nil {
		return have, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit, a no-op
	pins, err := pinRuns(ctx, tx, schema, routes)
	if err != nil {
		return have, err
	}
	for k := 1; k < routes; k++ {
		if err := migrateRoute(ctx, pool, schema, k); err != nil {
			return have, err
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE `+pgx.Identifier{schema, "layout"}.Sanitize()+` SET routes = $1, pins = $2`, routes, pins); err != nil {
		return have, fmt.Errorf("recording %d routes in schema %s: %w", routes, schema, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return have, fmt.Errorf("recording %d routes in schema %s: %w", routes, schema, err)
	}
	return routes, nil
}

// carriesRoute reports whether workflow ID id is a run ID that carries a
// route below routes (a version 8 UUID with the route in its last byte,
// as the engine makes them on a layout with routes), which the engine
// sends to that route whatever the pins hold.
func carriesRoute(id string, routes int) bool {
	if len(id) != 36 {
		return false
	}
	u, err := uuid.Parse(id)
	return err == nil && u.Version() == 8 && u.Variant() == uuid.RFC4122 && int(u[15]) < routes
}

// pinRuns locks the runs of schema, which is to have routes routes, in
// tx, and returns their pins (nil when it holds none): a Bloom filter
// (Pins) of their workflow IDs, deduplication IDs and
// debounce keys, which keeps a later start of any of them in route 0,
// where those runs stay (their IDs carry no route). The lock holds off
// new runs until tx records the routes. Refused: more runs than a filter
// takes, or a workflow ID the engine would send to another route
// (carriesRoute).
func pinRuns(ctx context.Context, tx pgx.Tx, schema string, routes int) ([]byte, error) {
	runs := pgx.Identifier{schema, "workflow_runs"}.Sanitize()
	if _, err := tx.Exec(ctx, `LOCK TABLE `+runs+` IN SHARE MODE`); err != nil {
		return nil, fmt.Errorf("locking the runs of schema %s: %w", schema, err)
	}
	var n, keys int
	if err := tx.QueryRow(ctx, `SELECT count(*), count(*) + count(dedup_id) + count(debounce_key) FROM `+runs).Scan(&n, &keys); err != nil {
		return nil, fmt.Errorf("counting the runs of schema %s: %w", schema, err)
	}
	if n == 0 {
		return nil, nil
	}
	f, err := NewPins(keys)
	if err != nil {
		return nil, refuse("schema %s holds %d runs, too many to keep in route 0 when it is given routes: %v", schema, n, err)
	}
	rows, err := tx.Query(ctx, `SELECT workflow_name, workflow_id, dedup_id, coalesce(flow_queue, ''), debounce_key FROM `+runs)
	if err != nil {
		return nil, fmt.Errorf("reading the runs of schema %s: %w", schema, err)
	}
	var name, id, queue string
	var dedup, debounce *string
	var routed []string
	_, err = pgx.ForEachRow(rows, []any{&name, &id, &dedup, &queue, &debounce}, func() error {
		if carriesRoute(id, routes) && len(routed) < 3 {
			routed = append(routed, fmt.Sprintf("%q of %q", id, name))
		}
		f.Add(WorkflowKey(name, id))
		if dedup != nil {
			f.Add(DedupKey(queue, *dedup))
		}
		if debounce != nil {
			f.Add(DebounceKey(name, *debounce))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading the runs of schema %s: %w", schema, err)
	}
	if len(routed) > 0 {
		return nil, refuse("schema %s holds runs whose workflow IDs look like the run IDs of a layout with routes (version 8 UUIDs, the last byte a route below %d: %s), whose runs the engine would look for in that route, not in route 0: make the routes in a new schema (--schema), or leave --routes out",
			schema, routes, strings.Join(routed, ", "))
	}
	return f.Bytes(), nil
}

// migrateRoute makes route k's schema when missing and applies every
// pending migration to it: a route schema holds a whole set of pgdurable's
// tables (not River's), of which the engine uses the per-run ones, so
// that a later migration of the per-run tables reaches every route.
func migrateRoute(ctx context.Context, pool *pgxpool.Pool, schema string, k int) error {
	rs := RouteSchema(schema, k)
	mark := fmt.Sprintf("%s%d of %s", routeComment, k, schema)
	var exists bool
	var comment *string
	err := pool.QueryRow(ctx, `SELECT to_regnamespace($1) IS NOT NULL, obj_description(to_regnamespace($1), 'pg_namespace')`, rs).Scan(&exists, &comment)
	if err != nil {
		return fmt.Errorf("looking for schema %s: %w", rs, err)
	}
	if exists && (comment == nil || *comment != mark) {
		// Not one this made: another installation's, or an
		// application's. Its tables are not the route's to take.
		return refuse("schema %s, which route %d of schema %s would use, exists and is not that route: rename or drop it, or install into another --schema", rs, k, schema)
	}
	if !exists {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return fmt.Errorf("creating schema %s for route %d: %w", rs, k, err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{rs}.Sanitize()); err != nil {
			return fmt.Errorf("creating schema %s for route %d: %w", rs, k, err)
		}
		if _, err := tx.Exec(ctx, "COMMENT ON SCHEMA "+pgx.Identifier{rs}.Sanitize()+" IS "+quoteLiteral(mark)); err != nil {
			return fmt.Errorf("marking schema %s as route %d: %w", rs, k, err)
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("creating schema %s for route %d: %w", rs, k, err)
		}
	}
	return withProvider(ctx, pool, rs, func(p *goose.Provider) error {
		if _, err := p.Up(ctx); err != nil {
			return fmt.Errorf("applying pgdurable migrations to route %d (schema %s): %w", k, rs, err)
		}
		return nil
	})
}

// withProvider runs f with goose over schema.
func withProvider(ctx context.Context, pool *pgxpool.Pool, schema string, f func(*goose.Provider) error) error {
	spool, err := schemaPool(ctx, pool, schema)
	if err != nil {
		return err
	}
	defer spool.Close()
	db := stdlib.OpenDBFromPool(spool)
	defer db.Close()
	p, err := newProvider(db)
	if err != nil {
		return err
	}
	return f(p)
}

// downRoutes rolls the route schemas of schema back one migration, from
// version, before the schema itself is: when version is the one that
// records the routes, the route schemas go (refused while they hold
// runs), since without it the engine would read one route.
func downRoutes(ctx context.Context, pool *pgxpool.Pool, schema string, version int64) error {
	routes, err := Routes(ctx, pool, schema)
	if err != nil || routes == 1 {
		return err
	}
	if version == routesVersion {
		for k := 1; k < routes; k++ {
			var held bool
			if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+pgx.Identifier{RouteSchema(schema, k), "workflow_runs"}.Sanitize()+`)`).Scan(&held); err != nil {
				return fmt.Errorf("reading whether route %d of schema %s holds runs: %w", k, schema, err)
			}
			if held {
				return fmt.Errorf("rolling back migration %d of schema %s would drop its %d routes' schemas, and route %d holds runs: prune or move them first", routesVersion, schema, routes, k)
			}
		}
		for k := 1; k < routes; k++ {
			if _, err := pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{RouteSchema(schema, k)}.Sanitize()+" CASCADE"); err != nil {
				return fmt.Errorf("dropping route %d's schema: %w", k, err)
			}
		}
		return nil
	}
	for k := 1; k < routes; k++ {
		rs := RouteSchema(schema, k)
		err := withProvider(ctx, pool, rs, func(p *goose.Provider) error {
			_, err := p.Down(ctx)
			if errors.Is(err, goose.ErrNoNextVersion) {
				return nil
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("rolling back route %d (schema %s): %w", k, rs, err)
		}
	}
	return nil
}

// placeRoutes returns the worker node (host:port) holding each route's
// per-run tables when pool's database is a Citus coordinator with worker
// nodes (nil otherwise). With arrange (Up has just distributed some), it
// first moves route k's tables to the k-th of the worker nodes (in node
// ID order, round robin) where Citus put them elsewhere, so that the
// routes, and the runs with them, divide evenly among the nodes; Citus
// places each new group by its colocation ID, which other tables' groups
// also take. After that, Citus's rebalancer may move them as it sees fit.
func placeRoutes(ctx context.Context, pool *pgxpool.Pool, schema string, routes int, arrange bool) ([]string, error) {
	var citus bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`).Scan(&citus); err != nil {
		return nil, fmt.Errorf("reading whether the database is a Citus coordinator: %w", err)
	}
	if !citus {
		return nil, nil
	}
	type node struct {
		name string
		port int
	}
	rows, err := pool.Query(ctx, `SELECT nodename, nodeport FROM pg_dist_node
		WHERE groupid <> 0 AND noderole = 'primary' AND isactive AND shouldhaveshards ORDER BY nodeid`)
	if err != nil {
		return nil, fmt.Errorf("reading the Citus cluster's worker nodes: %w", err)
	}
	workers, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (node, error) {
		var n node
		return n, r.Scan(&n.name, &n.port)
	})
	if err != nil {
		return nil, fmt.Errorf("reading the Citus cluster's worker nodes: %w", err)
	}
	if len(workers) == 0 {
		return nil, nil
	}
	placed := make([]string, routes)
	for k := range routes {
		runs := pgx.Identifier{RouteSchema(schema, k), "workflow_runs"}.Sanitize()
		var shard int64
		var at node
		err := pool.QueryRow(ctx, `SELECT shardid, nodename, nodeport FROM citus_shards WHERE table_name = $1::regclass LIMIT 1`, runs).
			Scan(&shard, &at.name, &at.port)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // not distributed: a coordinator's own tables
		}
		if err != nil {
			return nil, fmt.Errorf("reading where route %d's per-run tables are: %w", k, err)
		}
		if want := workers[k%len(workers)]; arrange && routes > 1 && at != want {
			_, err := pool.Exec(ctx, `SELECT citus_move_shard_placement($1, $2, $3, $4, $5, shard_transfer_mode => 'block_writes')`,
				shard, at.name, at.port, want.name, want.port)
			if err != nil {
				return nil, fmt.Errorf("moving route %d's per-run tables from %s:%d to %s:%d: %w", k, at.name, at.port, want.name, want.port, err)
			}
			at = want
		}
		placed[k] = fmt.Sprintf("%s:%d", at.name, at.port)
	}
	return placed, nil
}

// routesBehind lists the routes of schema (from 1) whose schema's latest
// applied migration is older than schema's own.
func routesBehind(ctx context.Context, pool *pgxpool.Pool, schema string, routes int) ([]int, error) {
	if routes <= 1 {
		return nil, nil
	}
	latest := func(s string) (int64, error) {
		var exists bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{s, VersionTable}.Sanitize()).Scan(&exists); err != nil || !exists {
			return 0, err
		}
		var v *int64
		err := pool.QueryRow(ctx, `SELECT max(version_id) FROM `+pgx.Identifier{s, VersionTable}.Sanitize()+` WHERE is_applied`).Scan(&v)
		if err != nil || v == nil {
			return 0, err
		}
		return *v, nil
	}
	want, err := latest(schema)
	if err != nil {
		return nil, fmt.Errorf("reading the version of schema %s: %w", schema, err)
	}
	var behind []int
	for k := 1; k < routes; k++ {
		v, err := latest(RouteSchema(schema, k))
		if err != nil {
			return nil, fmt.Errorf("reading the version of route %d: %w", k, err)
		}
		if v < want {
			behind = append(behind, k)
		}
	}
	return behind, nil
}

// checkRoutes refuses, before anything changes, routes out of range or
// whose schemas' names PostgreSQL would not take.
func checkRoutes(schema string, routes int) error {
	if routes < 0 || routes > MaxRoutes {
		return refuse("routes %d out of range: 1 to %d, or 0 to keep the schema's", routes, MaxRoutes)
	}
	if routes > 1 {
		if err := ValidSchemaName(RouteSchema(schema, routes-1)); err != nil {
			return refuse("schema %s cannot have %d routes: the schema of route %d: %v", schema, routes, routes-1, err)
		}
	}
	return nil
}

// refuseRoute refuses to migrate a schema that is another schema's route:
// it is migrated with that schema.
func refuseRoute(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	var comment *string
	if err := pool.QueryRow(ctx, `SELECT obj_description(to_regnamespace($1), 'pg_namespace')`, schema).Scan(&comment); err != nil {
		return fmt.Errorf("looking for schema %s: %w", schema, err)
	}
	if comment != nil && strings.HasPrefix(*comment, routeComment) {
		return refuse("schema %s is a route of another schema (%s): migrate that schema, which migrates its routes", schema, strings.TrimPrefix(*comment, "pgdurable: "))
	}
	return nil
}
