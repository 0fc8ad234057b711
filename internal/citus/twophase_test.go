package citus_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/internal/citus/citustest"
	"github.com/pgdurable/pgdurable/storage/migrations"
)

// A tx step that writes a coordinator table commits its writes and its
// record (on a worker node) in two phases: Citus would otherwise commit
// the worker node's part first and the coordinator's after it, and a
// crash or a failed commit between the two would keep the record without
// the writes. Each such step shows as a PREPARE TRANSACTION on the worker
// node of its run; steps that write the worker node alone commit in one.
func TestTxStepsWritingTheCoordinatorCommitInTwoPhases(t *testing.T) {
	t.Parallel()
	c := citustest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := coordinatorPool(ctx, t, c)
	_, err := migrations.Migrate(ctx, pool, migrations.Up, &migrations.Opts{Routes: 2})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE TABLE reservations (run text PRIMARY KEY)`)
	require.NoError(t, err)

	reserve := engine.Define("two-phase-reserve", func(ctx *engine.Context, in int) (int, error) {
		return engine.TxStep(ctx, "reserve", func(sctx context.Context, tx pgx.Tx) (int, error) {
			_, err := tx.Exec(sctx, `INSERT INTO reservations (run) VALUES ($1)`, ctx.RunID().String())
			return in, err
		}, nil)
	}, nil)
	plain := engine.Define("two-phase-plain", func(ctx *engine.Context, in int) (int, error) {
		for i := range 3 {
			if _, err := engine.Step(ctx, fmt.Sprint("s", i), func(context.Context) (int, error) { return i, nil }, nil); err != nil {
				return 0, err
			}
		}
		return in, nil
	}, nil)
	e, err := engine.New(pool, &engine.Config{MaxWorkers: 20})
	require.NoError(t, err)
	require.NoError(t, e.Register(reserve, plain))
	require.NoError(t, e.Start(ctx))
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		require.NoError(t, e.Stop(sctx))
	}()

	// preparedBy runs n runs of wf one after another and returns the
	// PREPARE TRANSACTIONs they took on the worker nodes.
	const n = 40
	preparedBy := func(wf *engine.Workflow[int, int]) int64 {
		require.NoError(t, c.ResetStatements(ctx))
		for i := range n {
			res, err := wf.Start(ctx, e, i, nil)
			require.NoError(t, err)
			_, err = wf.Wait(ctx, e, res.RunID, 10*time.Millisecond)
			require.NoError(t, err)
		}
		work, err := c.Work(ctx)
		require.NoError(t, err)
		var prepared int64
		for _, w := range work[1:] {
			prepared += w.Prepared
		}
		return prepared
	}
	plainPrepared := preparedBy(plain)
	t.Logf("%d runs of 3 plain steps: %d two-phase commits on the worker nodes", n, plainPrepared)
	require.Less(t, plainPrepared, int64(n), "plain steps' records commit in one phase")

	txPrepared := preparedBy(reserve)
	t.Logf("%d runs of one tx step writing a coordinator table: %d two-phase commits on the worker nodes", n, txPrepared)
	require.GreaterOrEqual(t, txPrepared, int64(n), "each tx step's transaction commits in two phases")
	var rows int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM reservations`).Scan(&rows))
	require.Equal(t, n, rows)
}

// The ...Tx calls write the engine's part (a run, a signal, a cancel) on a
// worker node in the caller's transaction, whose own rows are on the
// coordinator and may come before or after the call: when the caller's
// commit fails at the coordinator (a serialization failure, which
// PostgreSQL finds after Citus has committed or prepared the worker
// node's part), the engine's part is rolled back with the caller's rows,
// and when it succeeds both stay. Without a two-phase commit, a delayed
// run was left for an order never written.
func TestTxCallsCommitWithTheCallersRows(t *testing.T) {
	t.Parallel()
	c := citustest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := coordinatorPool(ctx, t, c)
	_, err := migrations.Migrate(ctx, pool, migrations.Up, &migrations.Opts{Routes: 2})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY); CREATE TABLE other (id int)`)
	require.NoError(t, err)
	release := make(chan struct{})
	ship := engine.Define("two-phase-ship", func(ctx *engine.Context, id string) (string, error) {
		return engine.Step(ctx, "long", func(sctx context.Context) (string, error) {
			select {
			case <-release:
			case <-sctx.Done():
			}
			return id, nil
		}, nil)
	}, nil)
	e, err := engine.New(pool, &engine.Config{MaxWorkers: 8})
	require.NoError(t, err)
	require.NoError(t, e.Register(ship, engine.DefineQueue("two-phase-fq", engine.QueueOpts{Concurrency: 1})))
	require.NoError(t, e.Start(ctx))
	defer func() {
		close(release)
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		require.NoError(t, e.Stop(sctx))
	}()
	// Runs held running by their step, for the signals and the cancels.
	running := func(id string) uuid.UUID {
		res, err := ship.Start(ctx, e, id, &engine.StartOpts{WorkflowID: id})
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			r, err := e.GetRun(ctx, res.RunID)
			require.NoError(t, err)
			return r.Status == engine.StatusRunning
		}, 30*time.Second, 20*time.Millisecond)
		return res.RunID
	}
	// count sums a count over both routes' tables.
	count := func(q string, args ...any) int {
		n := 0
		for k := range 2 {
			var m int
			require.NoError(t, pool.QueryRow(ctx, strings.ReplaceAll(q, "$routes", migrations.RouteSchema(migrations.DefaultSchema, k)), args...).Scan(&m))
			n += m
		}
		return n
	}
	type call struct {
		name  string
		first bool // the caller's row before the call, else after
		do    func(tx pgx.Tx, id string) error
		part  func(id string) int // the engine's part, counted
	}
	runs := func(id string) int {
		return count(`SELECT count(*) FROM $routes.workflow_runs WHERE workflow_id = $1`, id)
	}
	calls := []call{
		{"a start with a ticket", true, func(tx pgx.Tx, id string) error {
			_, err := ship.StartTx(ctx, e, tx, id, &engine.StartOpts{WorkflowID: id})
			return err
		}, runs},
		{"a delayed start", true, func(tx pgx.Tx, id string) error {
			_, err := ship.StartTx(ctx, e, tx, id, &engine.StartOpts{WorkflowID: id, Delay: time.Hour})
			return err
		}, runs},
		{"a delayed start before the row", false, func(tx pgx.Tx, id string) error {
			_, err := ship.StartTx(ctx, e, tx, id, &engine.StartOpts{WorkflowID: id, Delay: time.Hour})
			return err
		}, runs},
		{"a start into a flow-controlled queue", true, func(tx pgx.Tx, id string) error {
			_, err := ship.StartTx(ctx, e, tx, id, &engine.StartOpts{WorkflowID: id, Queue: "two-phase-fq"})
			return err
		}, runs},
		{"a signal before the row", false, func(tx pgx.Tx, id string) error {
			return e.SignalTx(ctx, tx, running("target-"+id).String(), id, 1, nil)
		}, func(id string) int { return count(`SELECT count(*) FROM $routes.workflow_signals WHERE name = $1`, id) }},
		{"a cancel before the row", false, func(tx pgx.Tx, id string) error {
			return e.CancelTx(ctx, tx, running("target-"+id))
		}, func(id string) int {
			return count(`SELECT count(*) FROM $routes.workflow_runs WHERE workflow_id = $1 AND cancel_requested_at IS NOT NULL`, "target-"+id)
		}},
	}
	for i, cl := range calls {
		for _, fail := range []bool{true, false} {
			id := fmt.Sprintf("order-%d-%v", i, fail)
			tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
			require.NoError(t, err)
			var partner pgx.Tx
			if fail {
				// A read-write cycle with a partner that commits first:
				// the caller's commit fails its serialization check.
				partner, err = pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
				require.NoError(t, err)
				_, err = partner.Exec(ctx, `SELECT count(*) FROM other`)
				require.NoError(t, err)
				_, err = tx.Exec(ctx, `SELECT count(*) FROM orders`)
				require.NoError(t, err)
				_, err = partner.Exec(ctx, `INSERT INTO orders VALUES ('partner-' || $1::text)`, id)
				require.NoError(t, err)
			}
			row := func() {
				_, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1)`, id)
				require.NoError(t, err)
			}
			if cl.first {
				row()
			}
			require.NoError(t, cl.do(tx, id), cl.name)
			if !cl.first {
				row()
			}
			if fail {
				_, err = tx.Exec(ctx, `INSERT INTO other VALUES (1)`)
				require.NoError(t, err)
				require.NoError(t, partner.Commit(ctx))
				require.Error(t, tx.Commit(ctx), "%s: the caller's commit fails its serialization check", cl.name)
			} else {
				require.NoError(t, tx.Commit(ctx), cl.name)
			}
			var orders int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE id = $1`, id).Scan(&orders))
			want := 1
			if fail {
				want = 0
			}
			require.Equal(t, want, orders, cl.name)
			require.Equal(t, want, cl.part(id), "%s: the engine's part commits with the caller's row (failed commit: %v)", cl.name, fail)
		}
	}
}
