package store_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// A tx step's record and COMMIT go in one round trip, and a record the
// store refuses never lets that COMMIT commit the step's other writes:
// not a stale fence, not a record that exists already. A COMMIT that
// fails on the step's own writes (a deferred constraint) is the step's
// error, not a refusal.
func TestCommitStepNeverCommitsWritesWithoutTheirRecord(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := context.Background()
	pool := store.Default.On(db.Pool)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE biz (note text PRIMARY KEY);
		CREATE TABLE later (n int, CONSTRAINT later_n UNIQUE (n) DEFERRABLE INITIALLY DEFERRED)`)
	require.NoError(t, err)
	f := claimed(t, pool, "commit-step")
	count := func(note string) int {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM biz WHERE note = $1`, note).Scan(&n))
		return n
	}
	// commit writes note and rec in one transaction on a connection of
	// its own, as a tx step does.
	commit := func(fence store.Fence, note string, rec *store.StepRecord, multi bool, more ...string) error {
		conn, err := db.Pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		_, err = conn.Exec(ctx, "begin")
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `INSERT INTO biz VALUES ($1)`, note)
		require.NoError(t, err)
		for _, sql := range more {
			_, err = conn.Exec(ctx, sql)
			require.NoError(t, err)
		}
		on := store.Default.On(conn.Conn())
		if multi {
			_, err = store.CommitSteps(ctx, on, fence, true, rec)
		} else {
			_, err = store.CommitStep(ctx, on, store.StepCommit{Fence: fence, Begun: true, Record: rec})
		}
		if conn.Conn().PgConn().TxStatus() != 'I' {
			_, rerr := conn.Exec(ctx, "rollback")
			require.NoError(t, rerr)
		}
		return err
	}

	fresh := completedStep(0, "s0")
	fresh.Fresh = true
	require.NoError(t, commit(f, "first", fresh, false))
	require.Equal(t, 1, count("first"))

	// The same position again, as fresh: the insert finds the record.
	require.ErrorIs(t, commit(f, "again", fresh, false), store.ErrStepsNotCommitted)
	require.Zero(t, count("again"))
	// And as an upsert: a completed record is not overwritten.
	require.ErrorIs(t, commit(f, "upsert", completedStep(0, "s0"), true), store.ErrStepsNotCommitted)
	require.Zero(t, count("upsert"))

	// A stale fence, both ways.
	stale := f
	stale.Token = uuid.New()
	next := completedStep(1, "s1")
	next.Fresh = true
	require.ErrorIs(t, commit(stale, "stale", next, false), store.ErrStepsNotCommitted)
	require.ErrorIs(t, commit(stale, "stale", next, true), store.ErrStepsNotCommitted)
	require.Zero(t, count("stale"))

	// The step's own deferred constraint fails the COMMIT: an error, not a
	// refusal, and nothing committed.
	err = commit(f, "deferred", next, false, `INSERT INTO later VALUES (1), (1)`)
	require.Error(t, err)
	require.NotErrorIs(t, err, store.ErrStepsNotCommitted)
	require.Zero(t, count("deferred"))
	_, err = store.GetStep(ctx, pool, f.RunID, 1)
	require.ErrorIs(t, err, store.ErrNotFound)

	// Without a transaction (a step whose function ran no statement) the
	// record commits on its own.
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	_, err = store.CommitStep(ctx, store.Default.On(conn.Conn()), store.StepCommit{Fence: f, Keep: true, Record: next})
	conn.Release()
	require.NoError(t, err)
	rec, err := store.GetStep(ctx, pool, f.RunID, 1)
	require.NoError(t, err)
	require.Equal(t, store.StepCompleted, rec.Status)
}
