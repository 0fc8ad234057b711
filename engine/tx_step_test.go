package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
)

func createReservations(t *testing.T, b *bundle) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(), `CREATE TABLE reservations (run_id uuid NOT NULL, note text)`)
	require.NoError(t, err)
}

func reservations(t *testing.T, b *bundle, runID any) []string {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT coalesce(note, '') FROM reservations WHERE run_id = $1`, runID)
	require.NoError(t, err)
	notes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return notes
}

func TestTxStepRollsBackFailedAttemptsAndReplaysRecord(t *testing.T) {
	t.Parallel()
	var calls, after atomic.Int64
	wf := engine.Define("tx-retry", func(ctx *engine.Context, in int) (string, error) {
		note, err := engine.TxStep(ctx, "reserve", func(sctx context.Context, tx pgx.Tx) (string, error) {
			n := calls.Add(1)
			if _, err := tx.Exec(sctx, `INSERT INTO reservations VALUES ($1, $2)`, ctx.RunID(), "attempt"); err != nil {
				return "", err
			}
			if n == 1 {
				return "", errors.New("deadlock detected") // rolled back, retried
			}
			return "reserved", nil
		}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: 10 * time.Millisecond}})
		if err != nil {
			return "", err
		}
		// Fails once with a long backoff: the next delivery replays "reserve".
		_, err = engine.Step(ctx, "later", func(context.Context) (int, error) {
			if after.Add(1) == 1 {
				return 0, engine.RetryAfter(errors.New("not yet"), 1200*time.Millisecond)
			}
			return 1, nil
		}, nil)
		return note, err
	}, nil)
	b := setup(t, nil, wf)
	createReservations(t, b)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 1, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "reserved", out)
	require.EqualValues(t, 2, calls.Load(), "one rolled-back attempt, one committed; not re-run on replay")
	require.Len(t, reservations(t, b, res.RunID), 1)
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, 2, run.Deliveries)
	require.Equal(t, 2, run.Steps[0].Attempts)
}

func TestTxStepPermanentErrorRollsBack(t *testing.T) {
	t.Parallel()
	wf := engine.Define("tx-perm", func(ctx *engine.Context, in int) (int, error) {
		return engine.TxStep(ctx, "reserve", func(sctx context.Context, tx pgx.Tx) (int, error) {
			if _, err := tx.Exec(sctx, `INSERT INTO reservations VALUES ($1, 'x')`, ctx.RunID()); err != nil {
				return 0, err
			}
			return 0, engine.Permanent(errors.New("out of stock"))
		}, nil)
	}, nil)
	b := setup(t, nil, wf)
	createReservations(t, b)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 1, nil)
	require.NoError(t, err)
	run := waitStatus(t, b.engine, res.RunID, engine.StatusFailed, 10*time.Second)
	require.Contains(t, run.Error.Message, "out of stock")
	require.Empty(t, reservations(t, b, res.RunID))
}

// A delivery that lost its lease while inside a tx step cannot commit it:
// its record's fenced write fails and the whole transaction rolls back.
func TestTxStepOfLeaseLoserRollsBack(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	inA := make(chan struct{})
	releaseA := make(chan struct{})
	wf := engine.Define("tx-race", func(ctx *engine.Context, in int) (string, error) {
		return engine.TxStep(ctx, "reserve", func(sctx context.Context, tx pgx.Tx) (string, error) {
			who := "B"
			if calls.Add(1) == 1 {
				who = "A"
			}
			if _, err := tx.Exec(sctx, `INSERT INTO reservations VALUES ($1, $2)`, ctx.RunID(), who); err != nil {
				return "", err
			}
			if who == "A" {
				close(inA)
				<-releaseA // stalls with its insert uncommitted
			}
			return who, nil
		}, nil)
	}, nil)
	b := setup(t, &engine.Config{LeaseDuration: time.Hour, SweepInterval: 50 * time.Millisecond}, wf)
	createReservations(t, b)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 1, nil)
	require.NoError(t, err)
	<-inA
	_, err = b.db.Pool.Exec(ctx, `UPDATE `+b.db.RunTable("workflow_runs", res.RunID)+` SET lease_expires_at = now() - interval '1 second' WHERE run_id = $1`, res.RunID)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "B", out)
	close(releaseA)
	eventually(t, 5*time.Second, "A's transaction to end", func() bool {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'`).Scan(&n))
		return n == 0
	})
	require.Equal(t, []string{"B"}, reservations(t, b, res.RunID))
}

// The record of the step before a tx step commits in the tx step's own
// transaction: both land, in order, and a rolled-back attempt of the tx
// step leaves the earlier record to its retry's write; the earlier step
// runs once and replays.
func TestTxStepCommitsThePreviousRecordWithItsOwn(t *testing.T) {
	t.Parallel()
	var before, attempts, after atomic.Int64
	wf := engine.Define("tx-carries", func(ctx *engine.Context, fail int) (string, error) {
		id, err := engine.Step(ctx, "pick", func(context.Context) (int64, error) { return before.Add(1), nil }, nil)
		if err != nil {
			return "", err
		}
		if _, err := engine.TxStep(ctx, "reserve", func(sctx context.Context, tx pgx.Tx) (bool, error) {
			if _, err := tx.Exec(sctx, `INSERT INTO reservations VALUES ($1, $2)`, ctx.RunID(), fmt.Sprint(id)); err != nil {
				return false, err
			}
			if attempts.Add(1) <= int64(fail) {
				return false, errors.New("serialization failure") // rolled back, retried
			}
			return true, nil
		}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: 10 * time.Millisecond}}); err != nil {
			return "", err
		}
		// A long backoff: the next delivery replays both steps.
		_, err = engine.Step(ctx, "later", func(context.Context) (int, error) {
			if after.Add(1)%2 == 1 {
				return 0, engine.RetryAfter(errors.New("not yet"), 1200*time.Millisecond)
			}
			return 1, nil
		}, nil)
		return fmt.Sprint(id), err
	}, nil)
	b := setup(t, nil, wf)
	createReservations(t, b)
	ctx := testCtx(t)
	for fail, want := range []string{"1", "2"} {
		res, err := wf.Start(ctx, b.engine, fail, nil)
		require.NoError(t, err)
		out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
		require.NoError(t, err)
		require.Equal(t, want, out, "pick ran once and replayed")
		require.Equal(t, []string{want}, reservations(t, b, res.RunID))
		run, err := b.engine.GetRun(ctx, res.RunID)
		require.NoError(t, err)
		require.Len(t, run.Steps, 3)
		require.Equal(t, "pick", run.Steps[0].Name)
		require.Equal(t, engine.StepCompleted, run.Steps[0].Status)
		require.Equal(t, fail+1, run.Steps[1].Attempts)
		attempts.Store(0)
	}
	require.EqualValues(t, 2, before.Load())
}

// A tx step whose connection is killed between its statement and its
// commit rolls back, and its retry writes the row once.
func TestTxStepSurvivesItsConnectionKilledMidTransaction(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	inTx := make(chan struct{})
	release := make(chan struct{})
	wf := engine.Define("tx-killed-conn", func(ctx *engine.Context, in int) (int64, error) {
		return engine.TxStep(ctx, "reserve", func(sctx context.Context, tx pgx.Tx) (int64, error) {
			n := calls.Add(1)
			if _, err := tx.Exec(sctx, `INSERT INTO reservations VALUES ($1, 'killed-conn')`, ctx.RunID()); err != nil {
				return 0, err
			}
			if n == 1 {
				close(inTx)
				<-release // its backend is terminated meanwhile
			}
			return n, nil
		}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: 10 * time.Millisecond}})
	}, nil)
	b := setup(t, nil, wf)
	createReservations(t, b)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 1, nil)
	require.NoError(t, err)
	<-inTx
	var killed int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND state LIKE 'idle in transaction%' AND query LIKE '%killed-conn%'`).Scan(&killed))
	require.Equal(t, 1, killed)
	close(release)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.EqualValues(t, 2, out, "the second attempt committed")
	require.Len(t, reservations(t, b, res.RunID), 1)
}

// A tx step's function cannot commit or roll back the step's transaction
// (a commit without the record would take effect again on the retry):
// Commit fails, and the transaction commits once, with the record.
func TestTxStepFunctionCannotCommit(t *testing.T) {
	t.Parallel()
	var commitErr, rollbackErr atomic.Pointer[error]
	wf := engine.Define("tx-own-commit", func(ctx *engine.Context, in int) (int, error) {
		return engine.TxStep(ctx, "reserve", func(sctx context.Context, tx pgx.Tx) (int, error) {
			var n int
			// A first statement that returns rows, read to the end without Close.
			rows, err := tx.Query(sctx, `INSERT INTO reservations VALUES ($1, 'own-commit') RETURNING 1`, ctx.RunID())
			if err != nil {
				return 0, err
			}
			for rows.Next() {
				if err := rows.Scan(&n); err != nil {
					return 0, err
				}
			}
			if err := rows.Err(); err != nil {
				return 0, err
			}
			err = tx.Commit(sctx)
			commitErr.Store(&err)
			err = tx.Rollback(sctx)
			rollbackErr.Store(&err)
			return n, nil
		}, nil)
	}, nil)
	b := setup(t, nil, wf)
	createReservations(t, b)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 1, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 1, out)
	require.ErrorContains(t, *commitErr.Load(), "commits with the step's record")
	require.ErrorContains(t, *rollbackErr.Load(), "commits with the step's record")
	require.Equal(t, []string{"own-commit"}, reservations(t, b, res.RunID))
}

// A tx step's function that ends the step's transaction itself (a COMMIT
// through Exec, or pgx.BeginFunc on tx.Conn()) fails the step for good:
// its writes are not the step's, and a retry could write them again.
func TestTxStepFunctionThatEndsItsTransactionFails(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	wf := engine.Define("tx-ends-itself", func(ctx *engine.Context, how int) (int, error) {
		return engine.TxStep(ctx, "reserve", func(sctx context.Context, tx pgx.Tx) (int, error) {
			calls.Add(1)
			if how == 0 {
				if _, err := tx.Exec(sctx, `INSERT INTO reservations VALUES ($1, 'exec-commit')`, ctx.RunID()); err != nil {
					return 0, err
				}
				_, err := tx.Exec(sctx, `COMMIT`)
				return 1, err
			}
			err := pgx.BeginFunc(sctx, tx.Conn(), func(inner pgx.Tx) error {
				_, err := inner.Exec(sctx, `INSERT INTO reservations VALUES ($1, 'conn-beginfunc')`, ctx.RunID())
				return err
			})
			if err == nil {
				err = errors.New("transient") // would be retried, and write again
			}
			return 0, err
		}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: 10 * time.Millisecond}})
	}, nil)
	b := setup(t, nil, wf)
	createReservations(t, b)
	ctx := testCtx(t)
	for how := range 2 {
		calls.Store(0)
		res, err := wf.Start(ctx, b.engine, how, nil)
		require.NoError(t, err)
		_, err = wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
		require.EqualValues(t, 1, calls.Load(), "not retried")
		if how == 0 {
			// A COMMIT through tx.Exec is refused unsent: nothing commits.
			require.ErrorContains(t, err, "may not end its transaction")
			require.Empty(t, reservations(t, b, res.RunID))
			continue
		}
		require.ErrorContains(t, err, "ended its transaction itself")
		require.Len(t, reservations(t, b, res.RunID), 1, "written once, by the function's own commit")
	}
}

// Parallel tx steps whose commits are all refused, holding every
// connection of the pool at once, do not stall it: each releases its
// connection before it reads how its commit ended.
func TestParallelTxStepsRefusedTogetherDoNotStallThePool(t *testing.T) {
	t.Parallel()
	const n = 30 // more than the test pool's 20 connections
	var entered atomic.Int64
	var first [n]atomic.Bool
	allIn := make(chan struct{})
	var once sync.Once
	wf := engine.Define("tx-pool-wave", func(ctx *engine.Context, _ int) (int, error) {
		fs := make([]*engine.Future[int], n)
		for i := range n {
			fs[i] = engine.GoTx(ctx, fmt.Sprint("b", i), func(sctx context.Context, tx pgx.Tx) (int, error) {
				if _, err := tx.Exec(sctx, `INSERT INTO reservations VALUES ($1, $2)`, ctx.RunID(), fmt.Sprint(i)); err != nil {
					return 0, err
				}
				if first[i].CompareAndSwap(false, true) {
					if entered.Add(1) >= 15 {
						once.Do(func() { close(allIn) })
					}
					select {
					case <-allIn:
					case <-time.After(time.Second):
					}
					_, _ = tx.Exec(sctx, `SELECT 1/0`) // swallowed: the transaction is aborted
				}
				return 1, nil
			}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: 10 * time.Millisecond, MaximumAttempts: 5}})
		}
		sum := 0
		for _, f := range fs {
			v, err := f.Get(ctx)
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	}, &engine.WorkflowOpts{MaxParallelSteps: n})
	b := setup(t, &engine.Config{LeaseDuration: 4 * time.Second}, wf)
	createReservations(t, b)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 1, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, n, out)
	require.Len(t, reservations(t, b, res.RunID), n)
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, 1, run.Deliveries, "finished in its first delivery: no stall past the lease")
}

// The tx a step's function got refuses calls once the function returned:
// a goroutine it left behind cannot write outside the step.
func TestTxStepTransactionClosesWhenItsFunctionReturns(t *testing.T) {
	t.Parallel()
	returned := make(chan struct{})
	late := make(chan error, 1)
	wf := engine.Define("tx-leaked", func(ctx *engine.Context, _ int) (int, error) {
		return engine.TxStep(ctx, "reserve", func(sctx context.Context, tx pgx.Tx) (int, error) {
			go func() {
				<-returned
				_, err := tx.Exec(context.Background(), `INSERT INTO reservations VALUES ($1, 'leaked')`, ctx.RunID())
				late <- err
			}()
			_, err := tx.Exec(sctx, `INSERT INTO reservations VALUES ($1, 'step')`, ctx.RunID())
			return 1, err
		}, nil)
	}, nil)
	b := setup(t, nil, wf)
	createReservations(t, b)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 1, nil)
	require.NoError(t, err)
	_, err = wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	close(returned)
	require.ErrorIs(t, <-late, pgx.ErrTxClosed)
	require.Equal(t, []string{"step"}, reservations(t, b, res.RunID))
}
