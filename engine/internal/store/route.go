package store

import (
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"

	"github.com/google/uuid"

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
// always were. What is here is the arithmetic and the statements' rewrite
// for a route; the engine does not spread runs yet.

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
	r, _ := s.routes.LoadOrStore(k, &Schema{name: s.name, runs: runs})
	return r.(*Schema), nil
}
