package engine_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

func chainInsert(ctx *engine.Context, sctx context.Context, tx pgx.Tx, note string) error {
	_, err := tx.Exec(sctx, `INSERT INTO reservations VALUES ($1, $2)`, ctx.RunID(), note)
	return err
}

// A shared step whose function COMMITs through tx.Exec is refused before
// the COMMIT is sent (it would commit the steps before it without their
// records): the step fails for good, and the steps before it commit.
func TestSharedTxStepThatCommitsIsRefused(t *testing.T) {
	t.Parallel()
	var a, b atomic.Int64
	wf := engine.Define("chain-attack-commit", func(ctx *engine.Context, in int) (int, error) {
		if _, err := engine.TxStep(ctx, "a", func(sctx context.Context, tx pgx.Tx) (int, error) {
			a.Add(1)
			return 1, chainInsert(ctx, sctx, tx, "a")
		}, nil); err != nil {
			return 0, err
		}
		return engine.TxStep(ctx, "b", func(sctx context.Context, tx pgx.Tx) (int, error) {
			b.Add(1)
			if err := chainInsert(ctx, sctx, tx, "b"); err != nil {
				return 0, err
			}
			_, err := tx.Exec(sctx, `COMMIT`)
			return 1, err
		}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: 10 * time.Millisecond}})
	}, nil)
	bn := setup(t, nil, wf)
	createReservations(t, bn)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, bn.engine, 1, nil)
	require.NoError(t, err)
	_, err = wf.Wait(ctx, bn.engine, res.RunID, 10*time.Millisecond)
	require.ErrorContains(t, err, "may not end its transaction")
	run, err := bn.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	t.Logf("a ran %d, b ran %d, rows %v, steps %d", a.Load(), b.Load(), reservations(t, bn, res.RunID), len(run.Steps))
	require.Equal(t, []string{"a"}, reservations(t, bn, res.RunID),
		"step a (correct, recorded once) has its row once; b's rolled back")
	require.EqualValues(t, 1, a.Load())
	require.EqualValues(t, 1, b.Load(), "not retried")
}

// A tx step whose writes violate a deferred constraint fails at COMMIT.
// Shared, the commit's refusal hands the run back, and the next delivery
// runs each of those steps alone: the step fails its attempts and the run
// fails, instead of the shared transaction being made and refused again.
func TestSharedTxStepRefusedAtCommitFailsAlone(t *testing.T) {
	t.Parallel()
	var a atomic.Int64
	wf := engine.Define("chain-attack-deferred", func(ctx *engine.Context, in int) (int, error) {
		_, err := engine.TxStep(ctx, "a", func(sctx context.Context, tx pgx.Tx) (int, error) {
			a.Add(1)
			_, err := tx.Exec(sctx, `INSERT INTO uq VALUES ($1)`, 1)
			return 1, err
		}, &engine.StepOpts{ReturnExhausted: true, RetryPolicy: &engine.RetryPolicy{MaximumAttempts: 2, InitialInterval: 10 * time.Millisecond}})
		if err != nil {
			return 0, engine.Permanent(err)
		}
		return engine.Step(ctx, "after", func(context.Context) (int, error) { return 2, nil }, nil)
	}, nil)
	bn := setup(t, nil, wf)
	ctx := testCtx(t)
	_, err := bn.db.Pool.Exec(ctx, `CREATE TABLE uq (k int, CONSTRAINT uq_k UNIQUE (k) DEFERRABLE INITIALLY DEFERRED); INSERT INTO uq VALUES (1)`)
	require.NoError(t, err)
	res, err := wf.Start(ctx, bn.engine, 1, nil)
	require.NoError(t, err)
	deadline := time.Now().Add(5 * time.Second)
	var run *engine.Run
	for time.Now().Before(deadline) {
		run, err = bn.engine.GetRun(ctx, res.RunID)
		require.NoError(t, err)
		if run.Status == engine.StatusFailed || run.Status == engine.StatusDead {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("after 5s: status %s, deliveries %d, fn ran %d times, error %+v", run.Status, run.Deliveries, a.Load(), run.Error)
	require.Equal(t, engine.StatusFailed, run.Status, "a deferred violation should fail the step after its 2 attempts")
	// Its first try shared the transaction that the commit refused: not
	// an attempt (as a crash is not); then 2 attempts alone.
	require.LessOrEqual(t, a.Load(), int64(3))
}

// A tx step whose first statement is SET TRANSACTION (it must come first
// in its transaction) commits the steps before it and begins its own.
func TestSharedTxStepMaySetItsIsolationLevel(t *testing.T) {
	t.Parallel()
	wf := engine.Define("chain-attack-iso", func(ctx *engine.Context, in int) (int, error) {
		if _, err := engine.TxStep(ctx, "a", func(sctx context.Context, tx pgx.Tx) (int, error) {
			return 1, chainInsert(ctx, sctx, tx, "a")
		}, nil); err != nil {
			return 0, err
		}
		return engine.TxStep(ctx, "b", func(sctx context.Context, tx pgx.Tx) (int, error) {
			if _, err := tx.Exec(sctx, `SET TRANSACTION ISOLATION LEVEL SERIALIZABLE`); err != nil {
				return 0, engine.Permanent(err)
			}
			return 1, chainInsert(ctx, sctx, tx, "b")
		}, nil)
	}, nil)
	bn := setup(t, nil, wf)
	createReservations(t, bn)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, bn.engine, 1, nil)
	require.NoError(t, err)
	_, err = wf.Wait(ctx, bn.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err, "b sets its own isolation level, as the first statement of its transaction")
}

// A shared step that panics rolls back to its savepoint alone: the steps
// before it commit with their records.
func TestSharedTxStepPanicFailsAlone(t *testing.T) {
	t.Parallel()
	wf := engine.Define("chain-attack-panic", func(ctx *engine.Context, in int) (int, error) {
		if _, err := engine.TxStep(ctx, "a", func(sctx context.Context, tx pgx.Tx) (int, error) {
			return 1, chainInsert(ctx, sctx, tx, "a")
		}, nil); err != nil {
			return 0, err
		}
		return engine.TxStep(ctx, "b", func(sctx context.Context, tx pgx.Tx) (int, error) {
			if err := chainInsert(ctx, sctx, tx, "b"); err != nil {
				return 0, err
			}
			panic("boom")
		}, nil)
	}, nil)
	bn := setup(t, nil, wf)
	createReservations(t, bn)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, bn.engine, 1, nil)
	require.NoError(t, err)
	run := waitStatus(t, bn.engine, res.RunID, engine.StatusDead, 10*time.Second)
	for _, s := range run.Steps {
		t.Logf("step %d %s %s attempts %d", s.Seq, s.Name, s.Status, s.Attempts)
	}
	t.Logf("rows %v", reservations(t, bn, res.RunID))
	require.Equal(t, []string{"a"}, reservations(t, bn, res.RunID), "a succeeded before b panicked")
	require.Equal(t, "a", run.Steps[0].Name)
}

func idleInTx(t *testing.T, bn *bundle) int {
	// A transaction of the engine's or River's own work is idle in
	// transaction between its round trips for a moment; a leaked one stays
	// so. Count the sessions idle in the same transaction for 2 s.
	const q = `SELECT pid, xact_start FROM pg_stat_activity
		WHERE datname = current_database() AND state LIKE 'idle in transaction%'`
	type session struct {
		pid   int32
		start time.Time
	}
	sessions := func() map[session]bool {
		rows, err := bn.db.Pool.Query(context.Background(), q)
		require.NoError(t, err)
		seen := map[session]bool{}
		for rows.Next() {
			var s session
			require.NoError(t, rows.Scan(&s.pid, &s.start))
			seen[s] = true
		}
		require.NoError(t, rows.Err())
		return seen
	}
	stuck := sessions()
	for deadline := time.Now().Add(2 * time.Second); len(stuck) > 0 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		now := sessions()
		for s := range stuck {
			if !now[s] {
				delete(stuck, s)
			}
		}
	}
	return len(stuck)
}

// Waiting for a child run that has not ended hands the run back: the tx
// steps before the wait commit first, and do not run again.
func TestSharedTxStepsCommitBeforeAChildWait(t *testing.T) {
	t.Parallel()
	var a atomic.Int64
	child := engine.Define("chain-attack-child", func(ctx *engine.Context, in int) (int, error) {
		if err := engine.Sleep(ctx, 1500*time.Millisecond); err != nil {
			return 0, err
		}
		return in, nil
	}, nil)
	parent := engine.Define("chain-attack-parent", func(ctx *engine.Context, in int) (int, error) {
		h, err := engine.StartChild(ctx, child, 7, nil)
		if err != nil {
			return 0, err
		}
		for _, n := range []string{"a", "b"} {
			if _, err := engine.TxStep(ctx, n, func(sctx context.Context, tx pgx.Tx) (int, error) {
				if n == "a" {
					a.Add(1)
				}
				return 1, chainInsert(ctx, sctx, tx, n)
			}, nil); err != nil {
				return 0, err
			}
		}
		return h.Get(ctx)
	}, nil)
	bn := setup(t, nil, parent, child)
	createReservations(t, bn)
	ctx := testCtx(t)
	res, err := parent.Start(ctx, bn.engine, 1, nil)
	require.NoError(t, err)
	out, err := parent.Wait(ctx, bn.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 7, out)
	require.ElementsMatch(t, []string{"a", "b"}, reservations(t, bn, res.RunID))
	require.EqualValues(t, 1, a.Load(), "a tx step that succeeded before a wait is not run again")
}

// Lease lost while a chained step runs: another delivery takes the run
// over and completes it; the old chain's commit is refused.
func TestSharedTxStepsOfALeaseLoserRollBack(t *testing.T) {
	t.Parallel()
	var b atomic.Int64
	inB := make(chan struct{})
	releaseB := make(chan struct{})
	wf := engine.Define("chain-attack-lease", func(ctx *engine.Context, in int) (int, error) {
		if _, err := engine.TxStep(ctx, "a", func(sctx context.Context, tx pgx.Tx) (int, error) {
			return 1, chainInsert(ctx, sctx, tx, "a")
		}, nil); err != nil {
			return 0, err
		}
		if _, err := engine.TxStep(ctx, "b", func(sctx context.Context, tx pgx.Tx) (int, error) {
			if err := chainInsert(ctx, sctx, tx, "b"); err != nil {
				return 0, err
			}
			if b.Add(1) == 1 {
				close(inB)
				<-releaseB
			}
			return 1, nil
		}, nil); err != nil {
			return 0, err
		}
		if _, err := engine.TxStep(ctx, "c", func(sctx context.Context, tx pgx.Tx) (int, error) {
			return 1, chainInsert(ctx, sctx, tx, "c")
		}, nil); err != nil {
			return 0, err
		}
		return 1, nil
	}, nil)
	bn := setup(t, &engine.Config{LeaseDuration: time.Hour, SweepInterval: 50 * time.Millisecond}, wf)
	createReservations(t, bn)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, bn.engine, 1, nil)
	require.NoError(t, err)
	<-inB
	_, err = bn.db.Pool.Exec(ctx, `UPDATE `+bn.db.RunTable("workflow_runs", res.RunID)+` SET lease_expires_at = now() - interval '1 second' WHERE run_id = $1`, res.RunID)
	require.NoError(t, err)
	_, err = wf.Wait(ctx, bn.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	close(releaseB)
	eventually(t, 5*time.Second, "old chain to end", func() bool { return idleInTx(t, bn) == 0 })
	time.Sleep(300 * time.Millisecond)
	require.ElementsMatch(t, []string{"a", "b", "c"}, reservations(t, bn, res.RunID))
}

// A chained step whose statement passes its StartToCloseTimeout (the
// connection is cut by pgx).
func TestSharedTxStepTimeoutFailsTheStepAlone(t *testing.T) {
	t.Parallel()
	var a, b atomic.Int64
	wf := engine.Define("chain-attack-timeout", func(ctx *engine.Context, in int) (int, error) {
		if _, err := engine.TxStep(ctx, "a", func(sctx context.Context, tx pgx.Tx) (int, error) {
			a.Add(1)
			if _, err := tx.Exec(sctx, `SELECT pg_sleep($1::float8)`, 0.0); err != nil {
				return 0, err
			}
			return 1, chainInsert(ctx, sctx, tx, "a")
		}, nil); err != nil {
			return 0, err
		}
		_, err := engine.TxStep(ctx, "b", func(sctx context.Context, tx pgx.Tx) (int, error) {
			b.Add(1)
			if _, err := tx.Exec(sctx, `SELECT pg_sleep($1::float8)`, 2.0); err != nil {
				return 0, err
			}
			return 1, chainInsert(ctx, sctx, tx, "b")
		}, &engine.StepOpts{StartToCloseTimeout: 200 * time.Millisecond, ReturnExhausted: true,
			RetryPolicy: &engine.RetryPolicy{MaximumAttempts: 2, InitialInterval: 10 * time.Millisecond}})
		if err != nil {
			return 0, engine.Permanent(err)
		}
		return 1, nil
	}, nil)
	bn := setup(t, nil, wf)
	createReservations(t, bn)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, bn.engine, 1, nil)
	require.NoError(t, err)
	run := waitStatus(t, bn.engine, res.RunID, engine.StatusFailed, 20*time.Second)
	for _, s := range run.Steps {
		t.Logf("step %d %s %s attempts %d", s.Seq, s.Name, s.Status, s.Attempts)
	}
	t.Logf("a ran %d, b ran %d, deliveries %d", a.Load(), b.Load(), run.Deliveries)
	require.Equal(t, []string{"a"}, reservations(t, bn, res.RunID))
	// The first try's timeout cut the shared transaction: not an attempt
	// (as a crash is not), and a ran again; then 2 attempts alone.
	require.LessOrEqual(t, b.Load(), int64(3))
	require.Equal(t, 2, run.Steps[1].Attempts)
}

// Stop in the middle of a chain, then a new engine finishes the run.
func TestSharedTxStepsAcrossAStop(t *testing.T) {
	t.Parallel()
	var a, b atomic.Int64
	inB := make(chan struct{})
	releaseB := make(chan struct{})
	mk := func() *engine.Workflow[int, int] {
		return engine.Define("chain-attack-stop", func(ctx *engine.Context, in int) (int, error) {
			if _, err := engine.TxStep(ctx, "a", func(sctx context.Context, tx pgx.Tx) (int, error) {
				a.Add(1)
				return 1, chainInsert(ctx, sctx, tx, "a")
			}, nil); err != nil {
				return 0, err
			}
			if _, err := engine.TxStep(ctx, "b", func(sctx context.Context, tx pgx.Tx) (int, error) {
				if err := chainInsert(ctx, sctx, tx, "b"); err != nil {
					return 0, err
				}
				if b.Add(1) == 1 {
					close(inB)
					<-releaseB
				}
				return 1, nil
			}, nil); err != nil {
				return 0, err
			}
			if _, err := engine.TxStep(ctx, "c", func(sctx context.Context, tx pgx.Tx) (int, error) {
				return 1, chainInsert(ctx, sctx, tx, "c")
			}, nil); err != nil {
				return 0, err
			}
			return 1, nil
		}, nil)
	}
	wf := mk()
	bn := setup(t, nil, wf)
	createReservations(t, bn)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, bn.engine, 1, nil)
	require.NoError(t, err)
	<-inB
	stopped := make(chan error, 1)
	go func() { stopped <- bn.engine.Stop(ctx) }()
	time.Sleep(200 * time.Millisecond)
	close(releaseB)
	require.NoError(t, <-stopped)
	require.Equal(t, 0, idleInTx(t, bn))
	e2 := newEngine(t, bn.db, nil, true, mk())
	_, err = wf.Wait(ctx, e2, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	t.Logf("a ran %d b ran %d", a.Load(), b.Load())
	require.ElementsMatch(t, []string{"a", "b", "c"}, reservations(t, bn, res.RunID))
}

// 40 tx steps in a row, several runs at once on a small pool.
func TestSharedTxStepsLongChainsOnASmallPool(t *testing.T) {
	t.Parallel()
	wf := engine.Define("chain-attack-long", func(ctx *engine.Context, in int) (int, error) {
		for i := range 40 {
			if _, err := engine.TxStep(ctx, "s", func(sctx context.Context, tx pgx.Tx) (int, error) {
				return i, chainInsert(ctx, sctx, tx, "x")
			}, nil); err != nil {
				return 0, err
			}
		}
		return 1, nil
	}, nil)
	bn := setup(t, &engine.Config{MaxWorkers: 8}, wf)
	createReservations(t, bn)
	ctx := testCtx(t)
	var ids []uuid.UUID
	for range 16 {
		res, err := wf.Start(ctx, bn.engine, 1, nil)
		require.NoError(t, err)
		ids = append(ids, res.RunID)
	}
	for _, id := range ids {
		run := waitStatus(t, bn.engine, id, engine.StatusCompleted, 30*time.Second)
		require.Len(t, run.Steps, 40)
		require.Len(t, reservations(t, bn, id), 40)
	}
	require.Equal(t, 0, idleInTx(t, bn))
}

// A shared step that passes its StartToCloseTimeout inside a statement
// loses the connection, and with it the steps before it: the delivery
// ends (a timeout must not hide the lost outcome), and the next one runs
// them again; the run completes with each row and record once.
func TestSharedTxStepTimeoutRunsTheStepsBeforeAgain(t *testing.T) {
	t.Parallel()
	var a, b atomic.Int64
	wf := engine.Define("chain-attack-timeout-lost", func(ctx *engine.Context, in int) (int, error) {
		if _, err := engine.TxStep(ctx, "a", func(sctx context.Context, tx pgx.Tx) (int, error) {
			a.Add(1)
			if _, err := tx.Exec(sctx, `SELECT pg_sleep($1::float8)`, 0.0); err != nil {
				return 0, err
			}
			return 1, chainInsert(ctx, sctx, tx, "a")
		}, nil); err != nil {
			return 0, err
		}
		if _, err := engine.TxStep(ctx, "b", func(sctx context.Context, tx pgx.Tx) (int, error) {
			secs := 0.0
			if b.Add(1) == 1 {
				secs = 2.0 // first attempt passes its 200ms timeout
			}
			if _, err := tx.Exec(sctx, `SELECT pg_sleep($1::float8)`, secs); err != nil {
				return 0, err
			}
			return 1, chainInsert(ctx, sctx, tx, "b")
		}, &engine.StepOpts{StartToCloseTimeout: 200 * time.Millisecond,
			RetryPolicy: &engine.RetryPolicy{InitialInterval: 10 * time.Millisecond}}); err != nil {
			return 0, err
		}
		return 1, nil
	}, nil)
	bn := setup(t, nil, wf)
	createReservations(t, bn)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, bn.engine, 1, nil)
	require.NoError(t, err)
	_, err = wf.Wait(ctx, bn.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	run, err := bn.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	for _, s := range run.Steps {
		t.Logf("step %d %s %s attempts %d", s.Seq, s.Name, s.Status, s.Attempts)
	}
	t.Logf("status %s, a ran %d, b ran %d, deliveries %d, rows %v", run.Status, a.Load(), b.Load(), run.Deliveries, reservations(t, bn, res.RunID))
	require.ElementsMatch(t, []string{"a", "b"}, reservations(t, bn, res.RunID), "tx step a completed: its row must be there")
	require.Len(t, run.Steps, 2, "and its record")
}

// After a shared step's panic parks the run, replaying the dead job (with
// the step fixed) gives each row once.
func TestSharedTxStepPanicThenReplay(t *testing.T) {
	t.Parallel()
	var fixed atomic.Bool
	wf := engine.Define("chain-attack-panic-replay", func(ctx *engine.Context, in int) (int, error) {
		if _, err := engine.TxStep(ctx, "a", func(sctx context.Context, tx pgx.Tx) (int, error) {
			return 1, chainInsert(ctx, sctx, tx, "a")
		}, nil); err != nil {
			return 0, err
		}
		return engine.TxStep(ctx, "b", func(sctx context.Context, tx pgx.Tx) (int, error) {
			if err := chainInsert(ctx, sctx, tx, "b"); err != nil {
				return 0, err
			}
			if !fixed.Load() {
				panic("boom")
			}
			return 1, nil
		}, nil)
	}, nil)
	bn := setup(t, nil, wf)
	createReservations(t, bn)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, bn.engine, 1, nil)
	require.NoError(t, err)
	run := waitStatus(t, bn.engine, res.RunID, engine.StatusDead, 10*time.Second)
	_ = run
	jobs, _, err := bn.engine.ListDeadJobs(ctx, engine.ListDeadJobsParams{})
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	fixed.Store(true)
	_, err = bn.engine.ReplayDeadJob(ctx, jobs[0].ID, nil)
	require.NoError(t, err)
	_, err = wf.Wait(ctx, bn.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"a", "b"}, reservations(t, bn, res.RunID))
	require.Equal(t, 0, idleInTx(t, bn))
}

// Small pool: 3 connections, 6 workers, runs chaining tx steps with a
// plain step (which reads through another connection) in between.
func TestSharedTxStepsOnATinyPool(t *testing.T) {
	t.Parallel()
	var pool atomic.Pointer[pgxpool.Pool]
	wf := engine.Define("chain-attack-tiny", func(ctx *engine.Context, in int) (int, error) {
		for i := range 30 {
			if _, err := engine.TxStep(ctx, "s", func(sctx context.Context, tx pgx.Tx) (int, error) {
				return i, chainInsert(ctx, sctx, tx, "x")
			}, nil); err != nil {
				return 0, err
			}
			if i == 10 {
				if _, err := engine.Step(ctx, "count", func(sctx context.Context) (int, error) {
					var n int
					err := pool.Load().QueryRow(sctx, `SELECT count(*) FROM reservations WHERE run_id = $1`, ctx.RunID()).Scan(&n)
					if n != 11 {
						return n, engine.Permanent(errors.New("plain step does not see the chained rows"))
					}
					return n, err
				}, nil); err != nil {
					return 0, err
				}
			}
		}
		return 1, nil
	}, nil)
	db := enginetest.NewDB(t)
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.MaxConns = 3
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	pool.Store(p)
	_, err = p.Exec(context.Background(), `CREATE TABLE reservations (run_id uuid NOT NULL, note text)`)
	require.NoError(t, err)
	e, err := engine.New(p, &engine.Config{MaxWorkers: 6})
	require.NoError(t, err)
	require.NoError(t, e.Register(wf))
	require.NoError(t, e.Start(context.Background()))
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.StopAndCancel(c)
	})
	ctx := testCtx(t)
	var ids []uuid.UUID
	for range 12 {
		res, err := wf.Start(ctx, e, 1, nil)
		require.NoError(t, err)
		ids = append(ids, res.RunID)
	}
	for _, id := range ids {
		waitStatus(t, e, id, engine.StatusCompleted, 40*time.Second)
		var n int
		require.NoError(t, p.QueryRow(ctx, `SELECT count(*) FROM reservations WHERE run_id = $1`, id).Scan(&n))
		require.Equal(t, 30, n)
	}
}
