package engine_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
)

// attack2Run runs a workflow "a then b" where a inserts "a" and b is given.
func attack2Run(t *testing.T, name string, b func(ctx *engine.Context, sctx context.Context, tx pgx.Tx) (int, error), ignoreB bool) (*bundle, *engine.Run, *atomic.Int64) {
	var aCalls atomic.Int64
	wf := engine.Define(name, func(ctx *engine.Context, in int) (int, error) {
		if _, err := engine.TxStep(ctx, "a", func(sctx context.Context, tx pgx.Tx) (int, error) {
			aCalls.Add(1)
			return 1, chainInsert(ctx, sctx, tx, "a")
		}, nil); err != nil {
			return 0, err
		}
		_, err := engine.TxStep(ctx, "b", func(sctx context.Context, tx pgx.Tx) (int, error) {
			return b(ctx, sctx, tx)
		}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: 10 * time.Millisecond, MaximumAttempts: 3}})
		if ignoreB {
			return 7, nil
		}
		return 7, err
	}, nil)
	bn := setup(t, nil, wf)
	createReservations(t, bn)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, bn.engine, 1, nil)
	require.NoError(t, err)
	_, werr := wf.Wait(ctx, bn.engine, res.RunID, 10*time.Millisecond)
	run, err := bn.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	for _, s := range run.Steps {
		t.Logf("step %d %s %s attempts %d", s.Seq, s.Name, s.Status, s.Attempts)
	}
	t.Logf("wait err %v; status %s; deliveries %d; a ran %d; rows %v", werr, run.Status, run.Deliveries, aCalls.Load(), reservations(t, bn, res.RunID))
	return bn, run, &aCalls
}

func attack2Count(rows []string, s string) int {
	n := 0
	for _, r := range rows {
		if r == s {
			n++
		}
	}
	return n
}

// ROLLBACK AND CHAIN through tx.Exec in a shared step is refused unsent:
// step a, before it, keeps its row and record.
func TestSharedTxStepAttack2RollbackAndChain(t *testing.T) {
	t.Parallel()
	bn, run, _ := attack2Run(t, "attack2-rb-chain", func(ctx *engine.Context, sctx context.Context, tx pgx.Tx) (int, error) {
		if err := chainInsert(ctx, sctx, tx, "b"); err != nil {
			return 0, err
		}
		_, err := tx.Exec(sctx, `ROLLBACK AND CHAIN`)
		return 1, err
	}, false)
	rows := reservations(t, bn, run.RunID)
	require.Equal(t, 1, attack2Count(rows, "a"), "step a is recorded completed; its row must be there once (status %s)", run.Status)
}

// COMMIT AND CHAIN in a shared step, then a failure: refused unsent, so
// step a is never committed without its record, nor run again.
func TestSharedTxStepAttack2CommitAndChainThenFail(t *testing.T) {
	t.Parallel()
	var b atomic.Int64
	bn, run, _ := attack2Run(t, "attack2-c-chain", func(ctx *engine.Context, sctx context.Context, tx pgx.Tx) (int, error) {
		if err := chainInsert(ctx, sctx, tx, "b"); err != nil {
			return 0, err
		}
		if _, err := tx.Exec(sctx, `COMMIT AND CHAIN`); err != nil {
			return 0, err
		}
		if b.Add(1) == 1 {
			return 0, errors.New("transient")
		}
		return 1, nil
	}, true)
	rows := reservations(t, bn, run.RunID)
	require.Equal(t, 1, attack2Count(rows, "a"), "status %s", run.Status)
}

// A multi-statement Exec that holds a COMMIT anywhere is refused too.
func TestSharedTxStepAttack2HiddenCommitTag(t *testing.T) {
	t.Parallel()
	bn, run, _ := attack2Run(t, "attack2-hidden-commit", func(ctx *engine.Context, sctx context.Context, tx pgx.Tx) (int, error) {
		if err := chainInsert(ctx, sctx, tx, "b"); err != nil {
			return 0, err
		}
		_, err := tx.Exec(sctx, `COMMIT; SELECT 1`)
		return 1, err
	}, true)
	rows := reservations(t, bn, run.RunID)
	require.Equal(t, 1, attack2Count(rows, "a"), "status %s", run.Status)
}

// tx.Conn() after a first statement, a nested BeginFunc that fails (it
// rolls back everything, a included), and the function swallows it: the
// transaction's status says aborted, and a runs again, its row once.
func TestSharedTxStepAttack2ConnRollbackSwallowed(t *testing.T) {
	t.Parallel()
	bn, run, _ := attack2Run(t, "attack2-conn-rb", func(ctx *engine.Context, sctx context.Context, tx pgx.Tx) (int, error) {
		if err := chainInsert(ctx, sctx, tx, "b"); err != nil {
			return 0, err
		}
		_ = pgx.BeginFunc(sctx, tx.Conn(), func(pgx.Tx) error { return errors.New("optional part failed") })
		return 1, nil
	}, true)
	rows := reservations(t, bn, run.RunID)
	var st engine.StepStatus
	for _, s := range run.Steps {
		if s.Name == "a" {
			st = s.Status
		}
	}
	t.Logf("a status %s", st)
	require.Equal(t, 1, attack2Count(rows, "a"), "a is recorded %s; status %s", st, run.Status)
}

// tx.Conn() after a first statement, a nested BeginFunc that commits
// (everything, a included), then the function fails: the transaction's
// status says committed, a's record is written then, and no row twice.
func TestSharedTxStepAttack2ConnCommitThenFail(t *testing.T) {
	t.Parallel()
	var b atomic.Int64
	bn, run, _ := attack2Run(t, "attack2-conn-c", func(ctx *engine.Context, sctx context.Context, tx pgx.Tx) (int, error) {
		if err := chainInsert(ctx, sctx, tx, "b"); err != nil {
			return 0, err
		}
		if err := pgx.BeginFunc(sctx, tx.Conn(), func(t2 pgx.Tx) error {
			_, err := t2.Exec(sctx, `INSERT INTO reservations VALUES ($1, 'audit')`, ctx.RunID())
			return err
		}); err != nil {
			return 0, err
		}
		if b.Add(1) == 1 {
			return 0, errors.New("later failure")
		}
		return 1, nil
	}, true)
	rows := reservations(t, bn, run.RunID)
	require.Equal(t, 1, attack2Count(rows, "a"), "status %s", run.Status)
}

// tx.Conn() as a joined step's first call, when committing the steps
// before it fails: the function's connection is in a transaction of its
// own, which rolls back, so nothing it wrote is written twice.
func TestSharedTxStepAttack2ConnAfterFailedSettle(t *testing.T) {
	t.Parallel()
	var aCalls, bCalls atomic.Int64
	wf := engine.Define("attack2-conn-settle", func(ctx *engine.Context, in int) (int, error) {
		if _, err := engine.TxStep(ctx, "a", func(sctx context.Context, tx pgx.Tx) (int, error) {
			if aCalls.Add(1) == 1 {
				if _, err := tx.Exec(sctx, `INSERT INTO uq VALUES ($1)`, 1); err != nil {
					return 0, err
				}
			}
			return 1, chainInsert(ctx, sctx, tx, "a")
		}, nil); err != nil {
			return 0, err
		}
		return engine.TxStep(ctx, "b", func(sctx context.Context, tx pgx.Tx) (int, error) {
			bCalls.Add(1)
			_, err := tx.Conn().Exec(sctx, `INSERT INTO reservations VALUES ($1, 'b')`, ctx.RunID())
			return 1, err
		}, nil)
	}, nil)
	bn := setup(t, nil, wf)
	createReservations(t, bn)
	ctx := testCtx(t)
	_, err := bn.db.Pool.Exec(ctx, `CREATE TABLE uq (k int, CONSTRAINT uq_k UNIQUE (k) DEFERRABLE INITIALLY DEFERRED); INSERT INTO uq VALUES (1)`)
	require.NoError(t, err)
	res, err := wf.Start(ctx, bn.engine, 1, nil)
	require.NoError(t, err)
	_, werr := wf.Wait(ctx, bn.engine, res.RunID, 10*time.Millisecond)
	rows := reservations(t, bn, res.RunID)
	t.Logf("wait err %v; a ran %d, b ran %d; rows %v", werr, aCalls.Load(), bCalls.Load(), rows)
	require.Equal(t, 1, attack2Count(rows, "b"))
	require.Equal(t, 1, attack2Count(rows, "a"))
}

// A joined step whose output is too large / unserializable fails alone.
func TestSharedTxStepAttack2OutputTooLarge(t *testing.T) {
	t.Parallel()
	for _, big := range []bool{true, false} {
		var aCalls atomic.Int64
		wf := engine.Define("attack2-big-"+map[bool]string{true: "big", false: "chan"}[big], func(ctx *engine.Context, in int) (int, error) {
			if _, err := engine.TxStep(ctx, "a", func(sctx context.Context, tx pgx.Tx) (int, error) {
				aCalls.Add(1)
				return 1, chainInsert(ctx, sctx, tx, "a")
			}, nil); err != nil {
				return 0, err
			}
			_, err := engine.TxStep(ctx, "b", func(sctx context.Context, tx pgx.Tx) (any, error) {
				if err := chainInsert(ctx, sctx, tx, "b"); err != nil {
					return nil, err
				}
				if big {
					return strings.Repeat("x", 4096), nil
				}
				return make(chan int), nil
			}, nil)
			t.Logf("b: %v", err)
			return 3, nil
		}, nil)
		bn := setup(t, &engine.Config{MaxPayloadBytes: 2048}, wf)
		createReservations(t, bn)
		ctx := testCtx(t)
		res, err := wf.Start(ctx, bn.engine, 1, nil)
		require.NoError(t, err)
		_, err = wf.Wait(ctx, bn.engine, res.RunID, 10*time.Millisecond)
		require.NoError(t, err)
		rows := reservations(t, bn, res.RunID)
		t.Logf("rows %v a ran %d", rows, aCalls.Load())
		require.Equal(t, []string{"a"}, rows)
		require.Zero(t, idleInTx(t, bn))
	}
}

// Two runs lock two rows in opposite orders across shared steps.
func TestSharedTxStepAttack2DeadlockAcrossRuns(t *testing.T) {
	t.Parallel()
	const n = 12
	upd := func(ctx *engine.Context, sctx context.Context, tx pgx.Tx, id int, note string) error {
		if _, err := tx.Exec(sctx, `UPDATE ctr SET v = v + 1 WHERE id = $1`, id); err != nil {
			return err
		}
		time.Sleep(30 * time.Millisecond)
		return chainInsert(ctx, sctx, tx, note)
	}
	wf := engine.Define("attack2-deadlock", func(ctx *engine.Context, in int) (int, error) {
		first, second := 1, 2
		if in%2 == 1 {
			first, second = 2, 1
		}
		if _, err := engine.TxStep(ctx, "a", func(sctx context.Context, tx pgx.Tx) (int, error) {
			return 1, upd(ctx, sctx, tx, first, "a")
		}, nil); err != nil {
			return 0, err
		}
		if _, err := engine.TxStep(ctx, "b", func(sctx context.Context, tx pgx.Tx) (int, error) {
			return 1, upd(ctx, sctx, tx, second, "b")
		}, nil); err != nil {
			return 0, err
		}
		return engine.Step(ctx, "end", func(context.Context) (int, error) { return 1, nil }, nil)
	}, nil)
	bn := setup(t, &engine.Config{MaxWorkers: 8}, wf)
	createReservations(t, bn)
	ctx := testCtx(t)
	_, err := bn.db.Pool.Exec(ctx, `CREATE TABLE ctr (id int primary key, v int); INSERT INTO ctr VALUES (1,0),(2,0)`)
	require.NoError(t, err)
	var ids []uuid.UUID
	for i := 0; i < n; i++ {
		res, err := wf.Start(ctx, bn.engine, i, nil)
		require.NoError(t, err)
		ids = append(ids, res.RunID)
	}
	for _, id := range ids {
		run := waitStatus(t, bn.engine, id, engine.StatusCompleted, 30*time.Second)
		rows := reservations(t, bn, id)
		require.ElementsMatch(t, []string{"a", "b"}, rows, "run %s deliveries %d", id, run.Deliveries)
	}
	var v1, v2 int
	require.NoError(t, bn.db.Pool.QueryRow(ctx, `SELECT (SELECT v FROM ctr WHERE id=1), (SELECT v FROM ctr WHERE id=2)`).Scan(&v1, &v2))
	require.Equal(t, n, v1)
	require.Equal(t, n, v2)
	require.Zero(t, idleInTx(t, bn))
}

// Serializable write skew: step a sets SERIALIZABLE, reads the sum and
// inserts; b joins and inserts. Concurrent runs: serialization failures.
func TestSharedTxStepAttack2SerializableAtSharedCommit(t *testing.T) {
	t.Parallel()
	const n = 8
	var aCalls atomic.Int64
	wf := engine.Define("attack2-serial", func(ctx *engine.Context, in int) (int, error) {
		if _, err := engine.TxStep(ctx, "a", func(sctx context.Context, tx pgx.Tx) (int, error) {
			aCalls.Add(1)
			if _, err := tx.Exec(sctx, `SET TRANSACTION ISOLATION LEVEL SERIALIZABLE`); err != nil {
				return 0, err
			}
			var c int
			if err := tx.QueryRow(sctx, `SELECT count(*) FROM reservations`).Scan(&c); err != nil {
				return 0, err
			}
			time.Sleep(20 * time.Millisecond)
			return c, chainInsert(ctx, sctx, tx, "a")
		}, nil); err != nil {
			return 0, err
		}
		if _, err := engine.TxStep(ctx, "b", func(sctx context.Context, tx pgx.Tx) (int, error) {
			var c int
			if err := tx.QueryRow(sctx, `SELECT count(*) FROM reservations`).Scan(&c); err != nil {
				return 0, err
			}
			return c, chainInsert(ctx, sctx, tx, "b")
		}, nil); err != nil {
			return 0, err
		}
		return engine.Step(ctx, "end", func(context.Context) (int, error) { return 1, nil }, nil)
	}, nil)
	bn := setup(t, &engine.Config{MaxWorkers: 8}, wf)
	createReservations(t, bn)
	ctx := testCtx(t)
	var ids []uuid.UUID
	for i := 0; i < n; i++ {
		res, err := wf.Start(ctx, bn.engine, i, nil)
		require.NoError(t, err)
		ids = append(ids, res.RunID)
	}
	for _, id := range ids {
		run := waitStatus(t, bn.engine, id, engine.StatusCompleted, 30*time.Second)
		rows := reservations(t, bn, id)
		require.ElementsMatch(t, []string{"a", "b"}, rows, "run %s deliveries %d", id, run.Deliveries)
	}
	t.Logf("a ran %d times for %d runs", aCalls.Load(), n)
	require.Zero(t, idleInTx(t, bn))
}

// Cancel while a run holds a shared transaction; the first step's undo
// must see its row.
func TestSharedTxStepAttack2CancelMidChainCompensates(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	var undone atomic.Int64
	wf := engine.Define("attack2-cancel", func(ctx *engine.Context, in int) (int, error) {
		if _, err := engine.TxStep(ctx, "a", func(sctx context.Context, tx pgx.Tx) (int, error) {
			return 1, chainInsert(ctx, sctx, tx, "a")
		}, nil); err != nil {
			return 0, err
		}
		if err := ctx.Compensate(engine.Undo{Name: "undo_a", Tx: func(sctx context.Context, tx pgx.Tx) error {
			tag, err := tx.Exec(sctx, `DELETE FROM reservations WHERE run_id = $1 AND note = 'a'`, ctx.RunID())
			undone.Add(tag.RowsAffected())
			return err
		}}); err != nil {
			return 0, err
		}
		if _, err := engine.TxStep(ctx, "b", func(sctx context.Context, tx pgx.Tx) (int, error) {
			if err := chainInsert(ctx, sctx, tx, "b"); err != nil {
				return 0, err
			}
			select {
			case <-gate:
			case <-time.After(5 * time.Second):
			}
			return 1, nil
		}, nil); err != nil {
			return 0, err
		}
		if err := ctx.Compensate(engine.Undo{Name: "undo_b", Tx: func(sctx context.Context, tx pgx.Tx) error {
			tag, err := tx.Exec(sctx, `DELETE FROM reservations WHERE run_id = $1 AND note = 'b'`, ctx.RunID())
			undone.Add(tag.RowsAffected())
			return err
		}}); err != nil {
			return 0, err
		}
		return engine.TxStep(ctx, "c", func(sctx context.Context, tx pgx.Tx) (int, error) {
			return 1, chainInsert(ctx, sctx, tx, "c")
		}, nil)
	}, nil)
	bn := setup(t, nil, wf)
	createReservations(t, bn)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, bn.engine, 1, nil)
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, bn.engine.Cancel(ctx, res.RunID))
	time.Sleep(200 * time.Millisecond)
	close(gate)
	run := waitStatus(t, bn.engine, res.RunID, engine.StatusCancelled, 15*time.Second)
	for _, s := range run.Steps {
		t.Logf("step %d %s %s attempts %d", s.Seq, s.Name, s.Status, s.Attempts)
	}
	rows := reservations(t, bn, res.RunID)
	t.Logf("rows %v undone %d", rows, undone.Load())
	require.Empty(t, rows)
	require.Equal(t, int64(2), undone.Load())
	require.Zero(t, idleInTx(t, bn))
}

// A lone step's COMMIT AND CHAIN (which leaves a transaction open, so it
// went unseen) is refused as well.
func TestSharedTxStepAttack2LoneCommitAndChainThenFail(t *testing.T) {
	t.Parallel()
	var b atomic.Int64
	wf := engine.Define("attack2-lone-cc", func(ctx *engine.Context, in int) (int, error) {
		return engine.TxStep(ctx, "b", func(sctx context.Context, tx pgx.Tx) (int, error) {
			if err := chainInsert(ctx, sctx, tx, "b"); err != nil {
				return 0, err
			}
			if _, err := tx.Exec(sctx, `COMMIT AND CHAIN`); err != nil {
				return 0, err
			}
			if b.Add(1) == 1 {
				return 0, errors.New("transient")
			}
			return 1, nil
		}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: 10 * time.Millisecond}})
	}, nil)
	bn := setup(t, nil, wf)
	createReservations(t, bn)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, bn.engine, 1, nil)
	require.NoError(t, err)
	_, err = wf.Wait(ctx, bn.engine, res.RunID, 10*time.Millisecond)
	t.Logf("wait %v rows %v", err, reservations(t, bn, res.RunID))
	// COMMIT AND CHAIN is refused unsent: the step fails for good, and
	// what it wrote rolls back (it used to commit, then run again).
	require.ErrorContains(t, err, "may not end its transaction")
	require.ErrorIs(t, err, engine.ErrEndsTransaction, "recorded, it still answers errors.Is")
	require.LessOrEqual(t, attack2Count(reservations(t, bn, res.RunID), "b"), 1)
}
