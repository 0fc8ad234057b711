package engine_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/storage/migrations"
)

// routedDB is a test database whose runs spread over routes routes (the
// layout of a Citus cluster, here on one PostgreSQL).
func routedDB(t *testing.T, routes int) *enginetest.DB {
	t.Helper()
	if n := enginetest.Routes(); n > 1 && n != routes {
		t.Skipf("the test databases have %d routes (%s); this test makes %d", n, enginetest.EnvRoutes, routes)
	}
	db := enginetest.NewDB(t)
	res, err := migrations.Migrate(context.Background(), db.Pool, migrations.Up, &migrations.Opts{Routes: routes})
	require.NoError(t, err)
	require.Equal(t, routes, res.Routes)
	return db
}

// runsByRoute counts the runs each route's table holds.
func runsByRoute(t *testing.T, db *enginetest.DB, routes int) []int {
	t.Helper()
	out := make([]int, routes)
	for k := range routes {
		require.NoError(t, db.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM `+migrations.RouteSchema(migrations.DefaultSchema, k)+`.workflow_runs`).Scan(&out[k]))
	}
	return out
}

// Runs started with and without workflow IDs spread over the routes and
// complete; a workflow ID keeps to one route, so a second start finds its
// run; lists, filters and the overview read every route.
func TestRoutesSpreadRunsAndListsReadThemAll(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	const routes = 3
	db := routedDB(t, routes)
	wf := engine.Define("routed-steps", func(ctx *engine.Context, in int) (int, error) {
		for i := range 3 {
			if _, err := engine.Step(ctx, fmt.Sprint("s", i), func(context.Context) (int, error) { return i, nil }, nil); err != nil {
				return 0, err
			}
		}
		return in * 2, nil
	}, nil)
	e := newEngine(t, db, nil, true, wf)
	const n = 60
	ids := make([]uuid.UUID, 0, 2*n)
	for i := range n {
		res, err := wf.Start(ctx, e, i, nil)
		require.NoError(t, err)
		ids = append(ids, res.RunID)
		res, err = wf.Start(ctx, e, i, &engine.StartOpts{WorkflowID: fmt.Sprint("order-", i)})
		require.NoError(t, err)
		ids = append(ids, res.RunID)
	}
	for _, id := range ids {
		waitStatus(t, e, id, engine.StatusCompleted, 30*time.Second)
	}
	for k, c := range runsByRoute(t, db, routes) {
		require.Greater(t, c, 2*n/routes/2, "route %d's share of %d runs", k, 2*n)
	}
	again, err := wf.Start(ctx, e, 7, &engine.StartOpts{WorkflowID: "order-7"})
	require.NoError(t, err)
	require.True(t, again.Existing)
	require.Equal(t, ids[15], again.RunID)
	_, err = wf.Start(ctx, e, 8, &engine.StartOpts{WorkflowID: "order-7"})
	require.ErrorIs(t, err, engine.ErrWorkflowIDConflict)

	// Pages of 50 newest first, across the routes, with nothing twice.
	seen := map[uuid.UUID]bool{}
	var last *uuid.UUID
	cursor := ""
	for {
		page, next, err := e.ListRuns(ctx, engine.ListRunsParams{Limit: 50, Cursor: cursor})
		require.NoError(t, err)
		for _, r := range page {
			require.False(t, seen[r.RunID], "run %s listed twice", r.RunID)
			seen[r.RunID] = true
			if last != nil {
				require.Negative(t, compareIDs(r.RunID, *last), "newest first")
			}
			id := r.RunID
			last = &id
		}
		if next == "" {
			break
		}
		cursor = next
	}
	require.Len(t, seen, 2*n)
	filtered, _, err := e.ListRuns(ctx, engine.ListRunsParams{Limit: 500, WorkflowIDPrefix: "order-1"})
	require.NoError(t, err)
	require.Len(t, filtered, 11) // order-1, order-10 to order-19
	st, err := e.Stats(ctx)
	require.NoError(t, err)
	require.Zero(t, st.PendingRuns+st.RunningRuns+st.WaitingRuns)
}

func compareIDs(a, b uuid.UUID) int {
	for i := range a {
		if a[i] != b[i] {
			return int(a[i]) - int(b[i])
		}
	}
	return 0
}

// Signals by workflow ID and by run ID reach runs in any route; children
// live in their own workflow IDs' routes, and their parent collects their
// results and cancels them across routes; a continue-as-new chain keeps
// its workflow ID's route.
func TestRoutesCarrySignalsChildrenAndChains(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	const routes = 3
	db := routedDB(t, routes)
	child := engine.Define("routed-child", func(ctx *engine.Context, in int) (int, error) {
		n, err := engine.AwaitSignal[int](ctx, "go", 0)
		if err != nil {
			return 0, err
		}
		return in*10 + n, nil
	}, nil)
	parent := engine.Define("routed-parent", func(ctx *engine.Context, kids int) ([]int, error) {
		var runs []*engine.ChildRun[int]
		for i := range kids {
			c, err := engine.StartChild(ctx, child, i, &engine.ChildOpts{WorkflowID: fmt.Sprint("kid-", ctx.RunID(), "-", i)})
			if err != nil {
				return nil, err
			}
			runs = append(runs, c)
		}
		var out []int
		for _, c := range runs {
			v, err := c.Get(ctx)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	}, nil)
	loop := engine.Define("routed-loop", func(ctx *engine.Context, in int) (int, error) {
		if in < 5 {
			return 0, engine.ContinueAsNew(ctx, in+1)
		}
		return in, nil
	}, nil)
	e := newEngine(t, db, nil, true, child, parent, loop)

	res, err := parent.Start(ctx, e, 6, nil)
	require.NoError(t, err)
	eventually(t, 20*time.Second, "six children waiting", func() bool {
		d, err := e.GetRun(ctx, res.RunID)
		require.NoError(t, err)
		waiting := 0
		for _, c := range d.Children {
			if c.Status == engine.StatusWaiting {
				waiting++
			}
		}
		return waiting == 6
	})
	d, err := e.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Len(t, d.Children, 6, "the run's children, from every route")
	for i, c := range d.Children {
		target := c.WorkflowID // by workflow ID, whose route is not known up front
		if i%2 == 1 {
			target = c.RunID.String()
		}
		require.NoError(t, e.Signal(ctx, target, "go", i, nil))
	}
	out, err := parent.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, []int{0, 11, 22, 33, 44, 55}, out)

	// Cancelling a parent cancels its children wherever they are.
	res, err = parent.Start(ctx, e, 4, nil)
	require.NoError(t, err)
	eventually(t, 20*time.Second, "four children waiting", func() bool {
		d, err := e.GetRun(ctx, res.RunID)
		require.NoError(t, err)
		return len(d.Children) == 4 && d.Children[3].Status == engine.StatusWaiting
	})
	require.NoError(t, e.Cancel(ctx, res.RunID))
	waitStatus(t, e, res.RunID, engine.StatusCancelled, 20*time.Second)
	d, err = e.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	for _, c := range d.Children {
		waitStatus(t, e, c.RunID, engine.StatusCancelled, 20*time.Second)
	}

	chain, err := loop.Start(ctx, e, 0, &engine.StartOpts{WorkflowID: "chain"})
	require.NoError(t, err)
	got, err := loop.Wait(ctx, e, chain.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 5, got)
}

// A dead run's dead job is found by its ID and replayed in its route; a
// flow-controlled queue admits runs of every route, and its deduplication
// IDs and debounce keys hold across them; a prune deletes children whose
// parent is in another route only once the parent closed.
func TestRoutesKeepDeadJobsQueuesAndPrunes(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	const routes = 3
	db := routedDB(t, routes)
	var fail atomic.Bool
	fail.Store(true)
	flaky := engine.Define("routed-flaky", func(ctx *engine.Context, in int) (int, error) {
		return engine.Step(ctx, "once", func(context.Context) (int, error) {
			if fail.Load() {
				panic("broken") // a panic parks the run as a dead job
			}
			return in, nil
		}, nil)
	}, nil)
	queued := engine.Define("routed-queued", func(ctx *engine.Context, in int) (int, error) {
		return engine.Step(ctx, "work", func(context.Context) (int, error) { return in, nil }, nil)
	}, &engine.WorkflowOpts{Queue: "routed"})
	release := make(chan struct{})
	held := engine.Define("routed-held", func(ctx *engine.Context, in int) (int, error) {
		return engine.Step(ctx, "wait", func(context.Context) (int, error) { <-release; return in, nil }, nil)
	}, &engine.WorkflowOpts{Queue: "routed"})
	sleeper := engine.Define("routed-sleeper", func(ctx *engine.Context, in int) (int, error) {
		if err := engine.Sleep(ctx, 50*time.Millisecond); err != nil {
			return 0, err
		}
		return in, nil
	}, nil)
	e := queueEngine(t, db, &engine.Config{SweepInterval: 20 * time.Millisecond},
		map[string]engine.QueueOpts{"routed": {Concurrency: 2}}, flaky, queued, held, sleeper)

	var dead []uuid.UUID
	for i := range 6 {
		res, err := flaky.Start(ctx, e, i, nil)
		require.NoError(t, err)
		dead = append(dead, res.RunID)
	}
	for _, id := range dead {
		waitStatus(t, e, id, engine.StatusDead, 20*time.Second)
	}
	jobs, _, err := e.ListDeadJobs(ctx, engine.ListDeadJobsParams{OpenOnly: true, Limit: 100})
	require.NoError(t, err)
	require.Len(t, jobs, 6)
	fail.Store(false)
	for _, j := range jobs {
		_, err := e.ReplayDeadJob(ctx, j.ID, nil)
		require.NoError(t, err)
	}
	for _, id := range dead {
		waitStatus(t, e, id, engine.StatusCompleted, 20*time.Second)
	}

	var admitted []uuid.UUID
	for i := range 30 {
		res, err := queued.Start(ctx, e, i, nil)
		require.NoError(t, err)
		admitted = append(admitted, res.RunID)
	}
	first, err := held.Start(ctx, e, 100, &engine.StartOpts{DeduplicationID: "once"})
	require.NoError(t, err)
	for i := range 5 {
		again, err := held.Start(ctx, e, 101+i, &engine.StartOpts{DeduplicationID: "once", ReturnDuplicate: true})
		require.NoError(t, err)
		require.Equal(t, first.RunID, again.RunID, "the open run holding the deduplication ID")
	}
	close(release)
	_, err = queued.Start(ctx, e, 1, &engine.StartOpts{DeduplicationID: "x", WorkflowID: "y"})
	require.ErrorIs(t, err, engine.ErrInvalidArgument, "a deduplication ID with a workflow ID cannot hold across routes")
	for _, id := range append(admitted, first.RunID) {
		waitStatus(t, e, id, engine.StatusCompleted, 30*time.Second)
	}

	d1, err := sleeper.Start(ctx, e, 1, &engine.StartOpts{Debounce: &engine.Debounce{Key: "k", Window: 200 * time.Millisecond}})
	require.NoError(t, err)
	d2, err := sleeper.Start(ctx, e, 2, &engine.StartOpts{Debounce: &engine.Debounce{Key: "k", Window: 200 * time.Millisecond}})
	require.NoError(t, err)
	require.Equal(t, d1.RunID, d2.RunID, "one run per debounce key")
	got, err := sleeper.Wait(ctx, e, d1.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 2, got)

	pruned, err := e.Prune(ctx, engine.PruneParams{OlderThan: time.Nanosecond})
	require.NoError(t, err)
	require.EqualValues(t, 6+31+1, pruned.Runs)
	require.Equal(t, []int{0, 0, 0}, runsByRoute(t, db, routes))
}

// A run ID that names a route the installation does not have is a run not
// found, as any unknown ID; a prune finds the children whose parent, in
// another route, has closed, past any number of children of a parent
// still open.
func TestRoutesUnknownIDsAndPrunesPastOpenParents(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := routedDB(t, 2)
	e := newEngine(t, db, &engine.Config{Retention: -1}, true)
	made := uuid.MustParse("01a24a48-7402-863d-8724-32a2352a9f09") // version 8, route 9
	_, err := e.GetRun(ctx, made)
	require.ErrorIs(t, err, engine.ErrNotFound)
	require.ErrorIs(t, e.Cancel(ctx, made), engine.ErrNotFound)

	// In route 0 an open parent and a closed one; in route 1, 600
	// children of the open one, then 5 of the closed one.
	_, err = db.Pool.Exec(ctx, `
INSERT INTO pgdurable.workflow_runs (run_id, workflow_name, workflow_id, status, input, completed_at)
VALUES ('00000000-0000-7000-8000-000000000001', 'p', 'open-parent', 'waiting', '1', NULL),
       ('00000000-0000-7000-8000-000000000002', 'p', 'closed-parent', 'completed', '1', now() - interval '2 hours');
INSERT INTO pgdurable_r1.workflow_runs (run_id, workflow_name, workflow_id, status, input, completed_at,
                                         parent_run_id, parent_seq, parent_close_policy)
SELECT format('00000000-0000-8000-8000-%s01', lpad(to_hex(g), 10, '0'))::uuid, 'c', 'child-' || g, 'completed', '1',
       now() - interval '2 hours', CASE WHEN g <= 600 THEN '00000000-0000-7000-8000-000000000001' ELSE '00000000-0000-7000-8000-000000000002' END::uuid,
       g, 'abandon'
FROM generate_series(1, 605) g`)
	require.NoError(t, err)
	dry, err := e.Prune(ctx, engine.PruneParams{OlderThan: time.Hour, DryRun: true})
	require.NoError(t, err)
	require.EqualValues(t, 6, dry.Runs, "the closed parent and its 5 children")
	pruned, err := e.Prune(ctx, engine.PruneParams{OlderThan: time.Hour})
	require.NoError(t, err)
	require.EqualValues(t, 6, pruned.Runs)
	require.Equal(t, []int{1, 600}, runsByRoute(t, db, 2))
}

// A parent waiting for a child that is woken before the child ends (as
// the recheck on a Citus cluster wakes it, store.ChildRecheck) looks,
// waits again, and completes once the child ends.
func TestRoutesParentWokenEarlyWaitsAgain(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := routedDB(t, 3)
	child := engine.Define("early-child", func(ctx *engine.Context, in int) (int, error) {
		return engine.AwaitSignal[int](ctx, "go", 0)
	}, nil)
	parent := engine.Define("early-parent", func(ctx *engine.Context, in int) (int, error) {
		c, err := engine.StartChild(ctx, child, in, &engine.ChildOpts{WorkflowID: fmt.Sprint("early-kid-", ctx.RunID())})
		if err != nil {
			return 0, err
		}
		return c.Get(ctx)
	}, nil)
	e := newEngine(t, db, &engine.Config{SweepInterval: 20 * time.Millisecond}, true, child, parent)
	res, err := parent.Start(ctx, e, 1, nil)
	require.NoError(t, err)
	var kid uuid.UUID
	eventually(t, 10*time.Second, "the parent waiting for its child", func() bool {
		d, err := e.GetRun(ctx, res.RunID)
		require.NoError(t, err)
		if len(d.Children) == 1 {
			kid = d.Children[0].RunID
		}
		return d.Status == engine.StatusWaiting && len(d.Children) == 1 && d.Children[0].Status == engine.StatusWaiting
	})
	before, err := e.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	tag, err := db.Pool.Exec(ctx, `UPDATE `+db.RunTable("workflow_runs", res.RunID)+` SET wake_at = now() WHERE run_id = $1`, res.RunID)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
	eventually(t, 10*time.Second, "the parent woken, and waiting again", func() bool {
		d, err := e.GetRun(ctx, res.RunID)
		require.NoError(t, err)
		return d.Deliveries > before.Deliveries && d.Status == engine.StatusWaiting
	})
	require.NoError(t, e.Signal(ctx, kid.String(), "go", 41, nil))
	out, err := parent.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 41, out)
}

// A schema that held runs when it was given routes keeps them in route 0,
// where their run IDs say they are: its open runs, stopped with their
// engine, finish under an engine of the new layout; a start of one of
// their workflow IDs finds its run, a signal by workflow ID reaches it, a
// chain continues in route 0, and a deduplication ID and a debounce key of
// one of its open runs still hold; new workflow IDs spread over every
// route.
func TestRoutesGivenToASchemaWithRuns(t *testing.T) {
	t.Parallel()
	if enginetest.Routes() > 1 {
		t.Skip("the test database has its routes already")
	}
	ctx := testCtx(t)
	db := enginetest.NewDB(t)
	waiter := engine.Define("pinned-waiter", func(ctx *engine.Context, in int) (int, error) {
		n, err := engine.AwaitSignal[int](ctx, "go", 0)
		if err != nil {
			return 0, err
		}
		return in + n, nil
	}, nil)
	chain := engine.Define("pinned-chain", func(ctx *engine.Context, in int) (int, error) {
		if _, err := engine.AwaitSignal[int](ctx, "go", 0); err != nil {
			return 0, err
		}
		if in < 2 {
			return 0, engine.ContinueAsNew(ctx, in+1)
		}
		return in, nil
	}, nil)
	queued := engine.Define("pinned-queued", func(ctx *engine.Context, in int) (int, error) {
		return engine.AwaitSignal[int](ctx, "go", 0)
	}, &engine.WorkflowOpts{Queue: "pinned"})
	queues := map[string]engine.QueueOpts{"pinned": {Concurrency: 4}}
	regs := []engine.Registration{waiter, chain, queued}

	before := queueEngine(t, db, nil, queues, regs...)
	const legacy = 40
	var waiting []uuid.UUID
	for i := range legacy {
		res, err := waiter.Start(ctx, before, i, &engine.StartOpts{WorkflowID: fmt.Sprint("legacy-", i)})
		require.NoError(t, err)
		waiting = append(waiting, res.RunID)
	}
	chained, err := chain.Start(ctx, before, 0, &engine.StartOpts{WorkflowID: "legacy-chain"})
	require.NoError(t, err)
	deduped, err := queued.Start(ctx, before, 7, &engine.StartOpts{DeduplicationID: "legacy-once"})
	require.NoError(t, err)
	debounced, err := waiter.Start(ctx, before, 1, &engine.StartOpts{Debounce: &engine.Debounce{Key: "legacy-k", Window: 4 * time.Second}})
	require.NoError(t, err)
	for _, id := range append(waiting, chained.RunID, deduped.RunID) {
		waitStatus(t, before, id, engine.StatusWaiting, 20*time.Second)
	}
	require.NoError(t, before.Stop(ctx))

	res, err := migrations.Migrate(ctx, db.Pool, migrations.Up, &migrations.Opts{Routes: 3})
	require.NoError(t, err)
	require.Equal(t, 3, res.Routes)
	require.Equal(t, []int{legacy + 3, 0, 0}, runsByRoute(t, db, 3), "the runs stay in route 0")

	after := queueEngine(t, db, nil, queues, regs...)
	// The debounce key still holds its run: this start joins it.
	again, err := waiter.Start(ctx, after, 2, &engine.StartOpts{Debounce: &engine.Debounce{Key: "legacy-k", Window: 4 * time.Second}})
	require.NoError(t, err)
	require.Equal(t, debounced.RunID, again.RunID, "the open run holding the debounce key")
	dup, err := queued.Start(ctx, after, 8, &engine.StartOpts{DeduplicationID: "legacy-once", ReturnDuplicate: true})
	require.NoError(t, err)
	require.Equal(t, deduped.RunID, dup.RunID, "the open run holding the deduplication ID")
	for i, id := range waiting {
		res, err := waiter.Start(ctx, after, i, &engine.StartOpts{WorkflowID: fmt.Sprint("legacy-", i)})
		require.NoError(t, err)
		require.Equal(t, id, res.RunID, "a start of a workflow ID finds its run")
		require.NoError(t, after.Signal(ctx, fmt.Sprint("legacy-", i), "go", 100, nil))
	}
	for i, id := range waiting {
		got, err := waiter.Wait(ctx, after, id, 10*time.Millisecond)
		require.NoError(t, err)
		require.Equal(t, i+100, got)
	}
	for range 3 {
		require.NoError(t, after.Signal(ctx, "legacy-chain", "go", 1, nil))
		time.Sleep(100 * time.Millisecond) // the next run of the chain to wait
	}
	require.NoError(t, after.Signal(ctx, deduped.RunID.String(), "go", 7, nil))
	got, err := queued.Wait(ctx, after, deduped.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 7, got)
	require.NoError(t, after.Signal(ctx, debounced.RunID.String(), "go", 0, nil))
	got, err = waiter.Wait(ctx, after, debounced.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 2, got, "the debounced run took the last start's input")

	// New workflow IDs spread over every route; the chain's runs, and
	// the runs of the earlier workflow IDs, are all in route 0.
	for i := range 60 {
		res, err := waiter.Start(ctx, after, i, &engine.StartOpts{WorkflowID: fmt.Sprint("new-", i)})
		require.NoError(t, err)
		require.NoError(t, after.Signal(ctx, res.RunID.String(), "go", 0, nil))
	}
	latest := chained.RunID
	eventually(t, 20*time.Second, "the chain to end", func() bool {
		r, err := after.GetRun(ctx, latest)
		require.NoError(t, err)
		if r.ContinuedRunID != nil {
			latest = *r.ContinuedRunID
		}
		return r.Status == engine.StatusCompleted
	})
	require.Equal(t, migrations.DefaultSchema+".workflow_runs", db.RunTable("workflow_runs", latest), "a chain continues in its route")
	counts := runsByRoute(t, db, 3)
	require.GreaterOrEqual(t, counts[0], legacy+3+2, "the chain's runs join route 0")
	require.Positive(t, counts[1])
	require.Positive(t, counts[2])
}

// An engine that starts while a migration is under way waits for it, and
// reads the routes it leaves; a migration after the start finds the
// engine registered, and refuses more routes. Without the wait, an engine
// started beside migrate up --routes 3 kept the 1 route it had read and
// started second runs of workflow IDs that the other engines put in
// another route.
func TestEngineStartWaitsForAMigrationUnderWay(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := enginetest.NewDB(t)
	migration, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer migration.Close(context.Background())
	_, err = migration.Exec(ctx, `SELECT pg_advisory_lock(hashtext('pgdurable: migrate'))`)
	require.NoError(t, err)

	e := newEngine(t, db, nil, false, echoWorkflow("started-after"))
	started := make(chan error, 1)
	go func() { started <- e.Start(ctx) }()
	select {
	case err := <-started:
		t.Fatalf("started during a migration (%v)", err)
	case <-time.After(500 * time.Millisecond):
	}
	_, err = migration.Exec(ctx, `SELECT pg_advisory_unlock(hashtext('pgdurable: migrate'))`)
	require.NoError(t, err)
	require.NoError(t, <-started)
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, e.StopAndCancel(stopCtx))
	})

	routes, err := migrations.Routes(ctx, db.Pool, "pgdurable")
	require.NoError(t, err)
	_, err = migrations.Migrate(ctx, db.Pool, migrations.Up, &migrations.Opts{Routes: routes + 1})
	require.ErrorIs(t, err, migrations.ErrEnginesRunning)
}
