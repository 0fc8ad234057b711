package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgdurable/pgdurable/storage/migrations"
)

// Routes. A layout that spreads runs over a Citus cluster's worker nodes
// keeps the per-run tables (migrations.RunTables) in a fixed number of
// routes, each a co-located group of those tables that Citus places on one
// worker node: route 0 is the tables in the engine's schema, route k ≥ 1
// the same tables in schema <schema>_r<k>. A run's route follows from its
// workflow name and ID (RouteOf), so the runs of one workflow ID are always
// one route's and its unique index keeps the ID unique; the run ID carries
// the route (NewRunID), so a statement by run ID needs no lookup. On a
// single PostgreSQL there is one route, route 0: the tables where they
// always were.

// MaxRoutes bounds a layout's routes: a run ID carries its route in one
// byte.
const MaxRoutes = 256

// RouteOf is the route, 0 to routes-1, of the runs of workflow ID id of
// workflow name: FNV-1a (32 bits) of the name, a zero byte and the ID,
// modulo routes. It never changes for a given routes: a layout's route
// count is fixed when it is made.
func RouteOf(name, id string, routes int) int {
	if routes <= 1 {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	h.Write([]byte{0})
	h.Write([]byte(id))
	return int(h.Sum32() % uint32(routes))
}

// NewRunID returns a new run ID that carries route (0 to MaxRoutes-1): a
// version 7 UUID's layout (a millisecond timestamp first, so run IDs sort
// by creation, then random bits) marked version 8 (RFC 9562's layout of
// one's own), with route in its last byte. The error is the random
// source's, or a route out of range.
func NewRunID(route int) (uuid.UUID, error) {
	if route < 0 || route >= MaxRoutes {
		return uuid.UUID{}, fmt.Errorf("route %d out of range 0 to %d", route, MaxRoutes-1)
	}
	id, err := uuid.NewV7()
	if err != nil {
		return id, err
	}
	id[6] = id[6]&0x0f | 0x80
	id[15] = byte(route)
	return id, nil
}

// RunRoute is the route a run ID carries, and whether it carries one: an
// ID NewRunID made (version 8) does; one made before routes existed
// (version 7 or 4) does not, and its run's route is found otherwise.
func RunRoute(id uuid.UUID) (int, bool) {
	if id.Version() != 8 || id.Variant() != uuid.RFC4122 {
		return 0, false
	}
	return int(id[15]), true
}

// runTable finds the package's references to the per-run tables.
var runTable = regexp.MustCompile(`\b` + DefaultSchema + `\.(` + strings.Join(migrations.RunTables, "|") + `)\b`)

// Route is s for route k of a layout: route 0 is s itself; for k ≥ 1,
// statements name the per-run tables (migrations.RunTables) in schema
// <s>_r<k>, and every other table in s. The same k gives the same
// *Schema. Errors: k out of range, or a route schema's name longer than
// PostgreSQL takes (63 bytes).
func (s *Schema) Route(k int) (*Schema, error) {
	if k < 0 || k >= MaxRoutes {
		return nil, fmt.Errorf("route %d out of range 0 to %d", k, MaxRoutes-1)
	}
	if k == 0 {
		return s, nil
	}
	if r, ok := s.routes.Load(k); ok {
		return r.(*Schema), nil
	}
	runs := fmt.Sprintf("%s_r%d", s.name, k)
	if err := migrations.ValidSchemaName(runs); err != nil {
		return nil, fmt.Errorf("route %d of schema %s: %w", k, s.name, err)
	}
	r, _ := s.routes.LoadOrStore(k, &Schema{name: s.name, runs: runs, base: s})
	return r.(*Schema), nil
}

// root is route 0's Schema of s.
func (s *Schema) root() *Schema {
	if s.base != nil {
		return s.base
	}
	return s
}

// Routes is the number of routes (1 to MaxRoutes) of the installation
// db's schema holds: the layout table's, read once per handle On made
// (migrations.Opts.Routes sets it, and it never changes for a schema
// that holds runs), with the route pins (see workflowRoute). A handle
// the store did not bind has one route.
func Routes(ctx context.Context, db DBTX) (int, error) {
	b, ok := db.(bound)
	if !ok || b.srv == nil {
		return 1, nil
	}
	if n := b.srv.routes.Load(); n != 0 {
		return int(n), nil
	}
	var n int
	var pins []byte
	err := b.q.QueryRow(ctx, b.s.root().SQL(`SELECT routes, pins FROM pgdurable.layout`)).Scan(&n, &pins)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42P01": // undefined_table: migrations from before routes
		n = 1
	case errors.As(err, &pgErr) && pgErr.Code == "42703": // undefined_column: migrations from before pins
		if err = b.q.QueryRow(ctx, b.s.root().SQL(`SELECT routes FROM pgdurable.layout`)).Scan(&n); err != nil {
			return 0, fmt.Errorf("reading the routes of schema %s: %w", b.s.name, err)
		}
	case err != nil:
		return 0, fmt.Errorf("reading the routes of schema %s: %w", b.s.name, err)
	}
	if n < 1 || n > MaxRoutes {
		return 0, fmt.Errorf("schema %s records %d routes, outside 1 to %d", b.s.name, n, MaxRoutes)
	}
	f, err := migrations.ParsePins(pins)
	if err != nil {
		return 0, fmt.Errorf("reading the route pins of schema %s: %w", b.s.name, err)
	}
	b.srv.pins.Store(f)
	b.srv.routes.Store(int32(n))
	return n, nil
}

// WorkflowRoute is the route of the runs of workflow ID id of workflow
// name, out of routes: the route an ID carries when it is a run ID with
// one (a start without a workflow ID takes its run ID as its workflow
// ID, made in a route of the engine's choosing) within routes, else
// RouteOf.
func WorkflowRoute(name, id string, routes int) int {
	if routes <= 1 {
		return 0
	}
	if k, ok := carriedRoute(id, routes); ok {
		return k
	}
	return RouteOf(name, id, routes)
}

// carriedRoute is the route workflow ID id carries, when it is a run ID
// with a route (see RunRoute) within routes.
func carriedRoute(id string, routes int) (int, bool) {
	if len(id) != 36 {
		return 0, false
	}
	u, err := uuid.Parse(id)
	if err != nil {
		return 0, false
	}
	if k, ok := RunRoute(u); ok && k < routes {
		return k, true
	}
	return 0, false
}

// workflowRoute is WorkflowRoute on db's installation of routes routes
// (Routes read them), but route 0 for a workflow ID its route pins hold:
// one of the runs the schema held when it was given routes, which stayed
// in route 0 (migrate up --routes on a schema with runs), or one the
// pins hold by mistake, which every engine then keeps in route 0 alike.
// A workflow ID that carries a route is never pinned: a run made with
// routes took it, in that route (the migration refuses earlier runs whose
// workflow IDs look so).
func workflowRoute(db DBTX, name, id string, routes int) int {
	if routes <= 1 {
		return 0
	}
	if k, ok := carriedRoute(id, routes); ok {
		return k
	}
	if pinned(db, migrations.WorkflowKey(name, id)) {
		return 0
	}
	return RouteOf(name, id, routes)
}

// keyRoute is the route of route key key (a deduplication ID's or a
// debounce key's, see NewRunIDFor) out of routes, pinned as workflowRoute
// pins a workflow ID.
func keyRoute(db DBTX, key string, routes int) int {
	if routes <= 1 || pinned(db, key) {
		return 0
	}
	return RouteOf("", key, routes)
}

// pinned reports whether db's installation's route pins hold key (Routes
// has read them).
func pinned(db DBTX, key string) bool {
	srv := serverOf(db)
	return srv != nil && srv.pins.Load().Has(key)
}

// at is db bound to the route of run runID (route 0 for an ID that
// carries none: runs made before routes). The handle is the same
// connection, pool or transaction, so a transaction may span routes (on
// Citus, worker nodes).
func at(db DBTX, runID uuid.UUID) DBTX {
	k, _ := RunRoute(runID)
	return onRoute(db, k)
}

// onRoute is db bound to route k. A route the installation does not
// have (a run ID made elsewhere, or made up) is route 0, where the run is
// not found either.
func onRoute(db DBTX, k int) DBTX {
	b, ok := db.(bound)
	if !ok {
		return db
	}
	if k > 0 && b.srv != nil {
		n := int(b.srv.routes.Load())
		if n == 0 {
			// Learned once per handle; the statement that asks runs
			// next anyway.
			n, _ = Routes(context.Background(), db)
		}
		if n > 0 && k >= n {
			k = 0
		}
	}
	r, err := b.s.root().Route(k)
	if err != nil || r == b.s {
		return db // a name too long was refused when the routes were made
	}
	return bound{q: b.q, s: r, srv: b.srv}
}

// RouteOfRun is the route of run runID's rows.
func RouteOfRun(runID uuid.UUID) int {
	k, _ := RunRoute(runID)
	return k
}

// eachRoute calls f with db bound to each route of its installation in
// turn, stopping at the first error.
func eachRoute(ctx context.Context, db DBTX, f func(DBTX) error) error {
	n, err := Routes(ctx, db)
	if err != nil {
		return err
	}
	for k := range n {
		if err := f(onRoute(db, k)); err != nil {
			return err
		}
	}
	return nil
}

// byRoute calls f with the items of each route (by the run ID idOf
// gives), on db bound to that route, and returns their results in the
// order of items. Items of one route (always, with one route) take one
// call.
func byRoute[T, R any](items []T, db DBTX, idOf func(T) uuid.UUID, f func(DBTX, []T) ([]R, error)) ([]R, error) {
	if len(items) == 0 {
		return f(db, items)
	}
	first := RouteOfRun(idOf(items[0]))
	mixed := false
	for _, it := range items[1:] {
		if RouteOfRun(idOf(it)) != first {
			mixed = true
			break
		}
	}
	if !mixed {
		return f(onRoute(db, first), items)
	}
	groups := map[int][]int{}
	var order []int
	for i, it := range items {
		k := RouteOfRun(idOf(it))
		if _, seen := groups[k]; !seen {
			order = append(order, k)
		}
		groups[k] = append(groups[k], i)
	}
	out := make([]R, len(items))
	for _, k := range order {
		part := make([]T, len(groups[k]))
		for j, i := range groups[k] {
			part[j] = items[i]
		}
		res, err := f(onRoute(db, k), part)
		if err != nil {
			return nil, err
		}
		for j, i := range groups[k] {
			out[i] = res[j]
		}
	}
	return out, nil
}

// idsByRoute calls f with the IDs of each route, on db bound to it, and
// returns what they return, concatenated.
func idsByRoute[R any](ids []uuid.UUID, db DBTX, f func(DBTX, []uuid.UUID) ([]R, error)) ([]R, error) {
	groups := map[int][]uuid.UUID{}
	var order []int
	for _, id := range ids {
		k := RouteOfRun(id)
		if _, seen := groups[k]; !seen {
			order = append(order, k)
		}
		groups[k] = append(groups[k], id)
	}
	if len(order) <= 1 {
		return f(onRoute(db, RouteOfRun(firstOr(ids))), ids)
	}
	var out []R
	for _, k := range order {
		res, err := f(onRoute(db, k), groups[k])
		if err != nil {
			return nil, err
		}
		out = append(out, res...)
	}
	return out, nil
}

func firstOr(ids []uuid.UUID) uuid.UUID {
	if len(ids) == 0 {
		return uuid.UUID{}
	}
	return ids[0]
}

// NewRunIDFor is a new run ID for a run of workflow name with workflow
// ID workflowID ("" for none: the run ID becomes it) on db's
// installation: in the workflow ID's route (WorkflowRoute); for none, in
// routeKey's (RouteOf("", routeKey)) when routeKey is not "" (a start
// whose deduplication ID or debounce key must find the runs that share
// it: the caller makes the key of what they share), else in one drawn at
// random, so that runs spread evenly. With one route it is a version 7
// UUID, as run IDs were before routes.
func NewRunIDFor(ctx context.Context, db DBTX, name, workflowID, routeKey string) (uuid.UUID, error) {
	n, err := Routes(ctx, db)
	if err != nil {
		return uuid.UUID{}, err
	}
	if n <= 1 {
		return uuid.NewV7()
	}
	var k int
	switch {
	case workflowID != "":
		k = workflowRoute(db, name, workflowID, n)
	case routeKey != "":
		k = keyRoute(db, routeKey, n)
	default:
		k = rand.IntN(n)
	}
	return NewRunID(k)
}

// newestFirst lists, on every route, what list lists on one (at most
// limit rows, in descending ID order), and returns the limit newest of
// them all, by ID (IDs sort by creation time, whatever route made them).
func newestFirst[T any](ctx context.Context, db DBTX, limit int, list func(DBTX) ([]T, error), idOf func(T) uuid.UUID) ([]T, error) {
	n, err := Routes(ctx, db)
	if err != nil {
		return nil, err
	}
	if n == 1 {
		return list(db)
	}
	var all []T
	for k := range n {
		part, err := list(onRoute(db, k))
		if err != nil {
			return nil, err
		}
		all = append(all, part...)
	}
	slices.SortFunc(all, func(a, b T) int {
		x, y := idOf(a), idOf(b)
		return -bytes.Compare(x[:], y[:])
	})
	if limit > 0 && len(all) > limit {
		all = all[:limit]
	}
	return all, nil
}

// NewDeadJobID is a new ID for a dead job of run runID: one that carries
// the run's route, as a run ID does, so that the dead job is found by its
// ID alone.
func NewDeadJobID(runID uuid.UUID) (uuid.UUID, error) {
	k, ok := RunRoute(runID)
	if !ok {
		return uuid.NewV7()
	}
	return NewRunID(k)
}
