package store_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine/internal/store"
	"github.com/pgdurable/pgdurable/storage/migrations"
)

// A workflow ID's route is fixed, and workflow IDs spread evenly over the
// routes: 10,000 of them over 8 routes put 1,250 ± 10% on each.
func TestRouteOfSpreadsWorkflowIDs(t *testing.T) {
	t.Parallel()
	require.Equal(t, 0, store.RouteOf("payment", "order-1", 1))
	require.Equal(t, store.RouteOf("payment", "order-1", 8), store.RouteOf("payment", "order-1", 8))
	require.NotEqual(t, store.RouteOf("ab", "c", 1<<20), store.RouteOf("a", "bc", 1<<20), "the name and the ID are kept apart")
	counts := make([]int, 8)
	for i := range 10_000 {
		counts[store.RouteOf("payment", fmt.Sprintf("order-%d", i), 8)]++
	}
	for k, n := range counts {
		require.InDelta(t, 1250, n, 125, "route %d", k)
	}
}

// A run ID carries its route in a version 8 UUID that sorts by creation
// time, as a version 7 one does; an ID made before routes carries none.
func TestRunIDCarriesItsRoute(t *testing.T) {
	t.Parallel()
	a, err := store.NewRunID(5)
	require.NoError(t, err)
	require.Equal(t, uuid.Version(8), a.Version())
	require.Equal(t, uuid.RFC4122, a.Variant())
	route, ok := store.RunRoute(a)
	require.True(t, ok)
	require.Equal(t, 5, route)
	time.Sleep(2 * time.Millisecond)
	b, err := store.NewRunID(255)
	require.NoError(t, err)
	require.Negative(t, strings.Compare(a.String(), b.String()), "later IDs sort later")
	route, ok = store.RunRoute(b)
	require.True(t, ok)
	require.Equal(t, 255, route)

	_, ok = store.RunRoute(uuid.Must(uuid.NewV7()))
	require.False(t, ok)
	_, ok = store.RunRoute(uuid.New())
	require.False(t, ok)
	_, err = store.NewRunID(256)
	require.Error(t, err)
	_, err = store.NewRunID(-1)
	require.Error(t, err)
}

// A route k ≥ 1 names the per-run tables in its own schema and every
// other table in the engine's; route 0 is the schema itself.
func TestRouteRewritesOnlyThePerRunTables(t *testing.T) {
	t.Parallel()
	const sql = `SELECT 1 FROM pgdurable.workflow_runs r JOIN pgdurable.workflow_steps s USING (run_id), pgdurable.queues q, pgdurable.dead_jobs d, pgdurable.workflow_signals g WHERE kind = 'pgdurable.run'`
	r0, err := store.Default.Route(0)
	require.NoError(t, err)
	require.Same(t, store.Default, r0)
	r3, err := store.Default.Route(3)
	require.NoError(t, err)
	again, err := store.Default.Route(3)
	require.NoError(t, err)
	require.Same(t, r3, again)
	require.Equal(t, `SELECT 1 FROM pgdurable_r3.workflow_runs r JOIN pgdurable_r3.workflow_steps s USING (run_id), pgdurable.queues q, pgdurable_r3.dead_jobs d, pgdurable_r3.workflow_signals g WHERE kind = 'pgdurable.run'`, r3.SQL(sql))

	acme, err := store.NewSchema("acme")
	require.NoError(t, err)
	a2, err := acme.Route(2)
	require.NoError(t, err)
	require.Equal(t, `SELECT 1 FROM acme_r2.workflow_runs r JOIN acme_r2.workflow_steps s USING (run_id), acme.queues q, acme_r2.dead_jobs d, acme_r2.workflow_signals g WHERE kind = 'pgdurable.run'`, a2.SQL(sql))

	long, err := store.NewSchema(strings.Repeat("s", 62))
	require.NoError(t, err)
	_, err = long.Route(1)
	require.Error(t, err, "a route schema's name past 63 bytes")
	_, err = store.Default.Route(store.MaxRoutes)
	require.Error(t, err)
}

// Route pins send a workflow ID they hold to route 0, but never one that
// carries a route (a run ID made on a layout with routes, whose run is in
// that route); the rest go by their hash.
func TestPinnedWorkflowIDsGoToRouteZero(t *testing.T) {
	legacy := "legacy"
	for i := 0; store.RouteOf("w", legacy, 3) == 0; i++ {
		legacy = fmt.Sprint("legacy-", i)
	}
	routed, err := store.NewRunID(2)
	require.NoError(t, err)
	f, err := migrations.NewPins(10)
	require.NoError(t, err)
	f.Add(migrations.WorkflowKey("w", legacy))
	f.Add(migrations.WorkflowKey("w", routed.String()))
	require.Equal(t, 0, store.PinnedWorkflowRoute(f, "w", legacy, 3))
	require.Equal(t, 2, store.PinnedWorkflowRoute(f, "w", routed.String(), 3))
	require.Equal(t, store.RouteOf("w", "other", 3), store.PinnedWorkflowRoute(f, "w", "other", 3))
	require.Equal(t, store.RouteOf("w", legacy, 3), store.PinnedWorkflowRoute(nil, "w", legacy, 3), "no pins")
}
