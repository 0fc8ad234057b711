package compensation_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgdurable/pgdurable/activities"
	"github.com/pgdurable/pgdurable/compensation"
	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/internal/crashtest"
)

const envBlockUndoB = "PGDURABLE_TEST_BLOCK_UNDO_B" // the worker hangs when undo B starts

func TestMain(m *testing.M) {
	crashtest.RunWorkerIfChild(workflows)
	goleak.VerifyTestMain(m)
}

type sagaIn struct {
	FailAt     string `json:"fail_at"`     // the forward step that fails permanently
	Transient  bool   `json:"transient"`   // ... or transiently, until its retries run out
	UndoBroken string `json:"undo_broken"` // an undo that fails until fixed
}

// events logs each step and undo invocation, in order, in the database.
func createEvents(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
		CREATE TABLE events (id bigserial PRIMARY KEY, run_id uuid NOT NULL, name text NOT NULL, key text);
		CREATE TABLE fixes (name text PRIMARY KEY)`)
	require.NoError(t, err)
}

func logEvent(ctx context.Context, pool *pgxpool.Pool, runID uuid.UUID, name, key string) error {
	_, err := pool.Exec(context.WithoutCancel(ctx), `INSERT INTO events (run_id, name, key) VALUES ($1, $2, $3)`, runID, name, key)
	return err
}

func events(t *testing.T, pool *pgxpool.Pool, runID uuid.UUID) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT name FROM events WHERE run_id = $1 ORDER BY id`, runID)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

// workflows: "trip" runs forward steps A, B, C, D, each with an undo; the
// step named by FailAt fails permanently.
func workflows(pool *pgxpool.Pool) []engine.Registration {
	undo := func(name string) compensation.Undo[string] {
		return compensation.Undo[string]{
			Name: "undo_" + name,
			Fn: func(ctx context.Context, call activities.Call, result string) error {
				if name == "B" && os.Getenv(envBlockUndoB) == "1" {
					select {} // the worker is killed here, after undo C was recorded
				}
				var fixed bool
				if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM fixes WHERE name = $1)`, "undo_"+name).Scan(&fixed); err != nil {
					return err
				}
				runID := uuid.MustParse(result)
				if err := logEvent(ctx, pool, runID, "undo_"+name, call.IdempotencyKey()); err != nil {
					return err
				}
				return nil
			},
			RetryPolicy: &engine.RetryPolicy{InitialInterval: 10 * time.Millisecond, MaximumAttempts: 2},
		}
	}
	trip := engine.Define("trip", func(ctx *engine.Context, in sagaIn) (string, error) {
		saga := compensation.New(ctx)
		for _, name := range []string{"A", "B", "C", "D"} {
			u := undo(name)
			if in.UndoBroken == u.Name {
				inner := u.Fn
				u.Fn = func(uctx context.Context, call activities.Call, result string) error {
					var fixed bool
					if err := pool.QueryRow(uctx, `SELECT EXISTS (SELECT 1 FROM fixes WHERE name = $1)`, u.Name).Scan(&fixed); err != nil {
						return err
					}
					if !fixed {
						_ = logEvent(uctx, pool, ctx.RunID(), u.Name+"_failed", call.IdempotencyKey())
						return engine.Permanent(errors.New("refund endpoint rejected the request"))
					}
					return inner(uctx, call, result)
				}
			}
			_, err := compensation.Step(saga, name, func(sctx context.Context) (string, error) {
				if err := logEvent(sctx, pool, ctx.RunID(), name, ""); err != nil {
					return "", err
				}
				if in.FailAt == name && in.Transient {
					return "", fmt.Errorf("step %s: gateway timeout", name)
				}
				if in.FailAt == name {
					return "", engine.Permanent(fmt.Errorf("step %s: card declined", name))
				}
				return ctx.RunID().String(), nil
			}, u, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: 5 * time.Millisecond, MaximumAttempts: 3}})
			if err != nil {
				return "", err
			}
		}
		return "booked", nil
	}, nil)
	return []engine.Registration{trip}
}

func newEngine(t *testing.T, db *enginetest.DB, cfg *engine.Config, start bool) *engine.Engine {
	t.Helper()
	return enginetest.NewEngine(t, db, cfg, start, workflows(db.Pool)...)
}

func waitStatus(t *testing.T, e *engine.Engine, runID uuid.UUID, status engine.RunStatus) *engine.Run {
	t.Helper()
	return enginetest.RequireRunStatus(context.Background(), t, e, runID, status, 30*time.Second)
}

func TestPermanentFailureUndoesCompletedStepsNewestFirst(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	createEvents(t, db.Pool)
	e := newEngine(t, db, nil, true)
	ctx := context.Background()
	res, err := e.StartJSON(ctx, "trip", []byte(`{"fail_at": "D"}`), nil)
	require.NoError(t, err)
	run := waitStatus(t, e, res.RunID, engine.StatusCompensated)
	require.Equal(t, []string{"A", "B", "C", "D", "undo_C", "undo_B", "undo_A"}, events(t, db.Pool, res.RunID))
	require.Contains(t, run.Error.Message, "card declined", "the original error is kept")
	require.Equal(t, engine.ClassPermanent, run.Error.Class)
	for i, want := range []struct {
		name string
		of   int
	}{{"undo_C", 2}, {"undo_B", 1}, {"undo_A", 0}} {
		s := run.Steps[4+i]
		require.Equal(t, want.name, s.Name)
		require.Equal(t, "compensation", string(s.Kind))
		require.Equal(t, "completed", string(s.Status))
		require.NotNil(t, s.RequestID, "an undo has its own request ID")
	}
	require.Equal(t, "undo_A", *run.Steps[0].Compensation, "the undo is stored with its forward step")
}

// The worker is killed after undo C is recorded; the next worker runs undo
// B and undo A, and undo C never again.
func TestCompensationResumesAfterACrash(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	createEvents(t, db.Pool)
	client := newEngine(t, db, nil, false)
	ctx := context.Background()
	res, err := client.StartJSON(ctx, "trip", []byte(`{"fail_at": "D"}`), nil)
	require.NoError(t, err)

	worker := crashtest.StartWorker(t, db, time.Second, envBlockUndoB+"=1")
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT count(*) FROM pgdurable.workflow_steps WHERE run_id = $1 AND name = 'undo_C' AND status = 'completed'`), res.RunID).Scan(&n))
		if n == 1 {
			break
		}
		require.True(t, time.Now().Before(deadline), "undo C was never recorded")
		time.Sleep(20 * time.Millisecond)
	}
	crashtest.Kill(t, worker)
	require.Equal(t, engine.StatusCompensating, waitStatusNow(t, client, res.RunID))

	e := newEngine(t, db, &engine.Config{LeaseDuration: time.Second}, true)
	waitStatus(t, e, res.RunID, engine.StatusCompensated)
	require.Equal(t, []string{"A", "B", "C", "D", "undo_C", "undo_B", "undo_A"}, events(t, db.Pool, res.RunID))
}

func waitStatusNow(t *testing.T, e *engine.Engine, runID uuid.UUID) engine.RunStatus {
	t.Helper()
	run, err := e.GetRun(context.Background(), runID)
	require.NoError(t, err)
	return run.Status
}

// An undo that keeps failing parks the run (compensation_failed, naming
// the undo); the operator's replay after the fix runs the remaining undos
// only, and the fixed undo keeps its request ID.
func TestFailingUndoParksAndReplayFinishesTheRest(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	createEvents(t, db.Pool)
	e := newEngine(t, db, nil, true)
	ctx := context.Background()
	res, err := e.StartJSON(ctx, "trip", []byte(`{"fail_at": "D", "undo_broken": "undo_B"}`), nil)
	require.NoError(t, err)
	waitStatus(t, e, res.RunID, engine.StatusDead)
	jobs, _, err := e.ListDeadJobs(ctx, engine.ListDeadJobsParams{RunID: res.RunID})
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	require.Equal(t, engine.ReasonCompensationFailed, jobs[0].Reason)
	require.Equal(t, "undo_B", jobs[0].StepName)
	require.Contains(t, jobs[0].ErrorMessage, "refund endpoint rejected")
	require.Equal(t, []string{"A", "B", "C", "D", "undo_C", "undo_B_failed"}, events(t, db.Pool, res.RunID))

	_, err = db.Pool.Exec(ctx, `INSERT INTO fixes VALUES ('undo_B')`)
	require.NoError(t, err)
	_, err = e.ReplayDeadJob(ctx, jobs[0].ID, &engine.ResolveOpts{By: "ops"})
	require.NoError(t, err)
	waitStatus(t, e, res.RunID, engine.StatusCompensated)
	require.Equal(t, []string{"A", "B", "C", "D", "undo_C", "undo_B_failed", "undo_B", "undo_A"}, events(t, db.Pool, res.RunID))

	var keys []string
	rows, err := db.Pool.Query(ctx, `SELECT key FROM events WHERE run_id = $1 AND name LIKE 'undo_B%' ORDER BY id`, res.RunID)
	require.NoError(t, err)
	keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, keys, 2)
	require.Equal(t, keys[0], keys[1], "the replayed undo sends its stored request ID again")
}

func TestFailureWithNothingToUndoFails(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	createEvents(t, db.Pool)
	e := newEngine(t, db, nil, true)
	res, err := e.StartJSON(context.Background(), "trip", []byte(`{"fail_at": "A"}`), nil)
	require.NoError(t, err)
	waitStatus(t, e, res.RunID, engine.StatusFailed)
	require.Equal(t, []string{"A"}, events(t, db.Pool, res.RunID))
}

// Exhausted retries with undos registered compensate instead of parking.
func TestExhaustedRetriesCompensate(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	createEvents(t, db.Pool)
	e := newEngine(t, db, nil, true)
	res, err := e.StartJSON(context.Background(), "trip", []byte(`{"fail_at": "C", "transient": true}`), nil)
	require.NoError(t, err)
	run := waitStatus(t, e, res.RunID, engine.StatusCompensated)
	require.Equal(t, []string{"A", "B", "C", "C", "C", "undo_B", "undo_A"}, events(t, db.Pool, res.RunID))
	require.Equal(t, engine.ClassTransient, run.Error.Class)
	require.Contains(t, run.Error.Message, "gateway timeout")
	require.Equal(t, 3, run.Steps[2].Attempts)
	jobs, _, err := e.ListDeadJobs(context.Background(), engine.ListDeadJobsParams{RunID: res.RunID})
	require.NoError(t, err)
	require.Empty(t, jobs)
}
