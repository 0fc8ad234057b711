package steptx_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/engine/internal/steptx"
	"github.com/pgdurable/pgdurable/internal/roundtrips"
)

// fixture is a connection of its own that counts its round trips, on a
// database with a table t, and a pool to look from outside the
// transaction.
type fixture struct {
	ctx  context.Context
	db   *enginetest.DB
	conn *pgx.Conn
	rt   *roundtrips.Counter
}

func setup(t *testing.T) *fixture {
	t.Helper()
	db := enginetest.NewDB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE t (n int PRIMARY KEY)`)
	require.NoError(t, err)
	cfg, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	rt := &roundtrips.Counter{}
	cfg.Tracer = rt
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return &fixture{ctx: ctx, db: db, conn: conn, rt: rt}
}

// outside counts t's rows as another connection sees them.
func (f *fixture) outside(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, f.db.Pool.QueryRow(f.ctx, `SELECT count(*) FROM t`).Scan(&n))
	return n
}

func TestFirstStatementCarriesBegin(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tx := steptx.New(f.ctx, f.conn)
	require.False(t, tx.Begun())
	rt0 := f.rt.Count()
	tag, err := tx.Exec(f.ctx, `INSERT INTO t VALUES ($1)`, 1)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
	require.True(t, tx.Begun())
	require.EqualValues(t, 1, f.rt.Count()-rt0, "BEGIN and the INSERT in one round trip")
	require.Equal(t, byte('T'), f.conn.PgConn().TxStatus())
	_, err = tx.Exec(f.ctx, `INSERT INTO t VALUES ($1)`, 2)
	require.NoError(t, err)
	require.EqualValues(t, 2, f.rt.Count()-rt0)
	require.Zero(t, f.outside(t), "nothing is visible before the owner commits")
	_, err = f.conn.Exec(f.ctx, "commit")
	require.NoError(t, err)
	require.Equal(t, 2, f.outside(t))
}

func TestQueryRowsFreeTheConnectionWhenReadToTheEnd(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tx := steptx.New(f.ctx, f.conn)
	rows, err := tx.Query(f.ctx, `SELECT g FROM generate_series(1, 3) g`)
	require.NoError(t, err)
	var sum int
	for rows.Next() { // no Close: pgx closes rows that Next read to the end
		var n int
		require.NoError(t, rows.Scan(&n))
		sum += n
	}
	require.NoError(t, rows.Err())
	require.Equal(t, 6, sum)
	_, err = tx.Exec(f.ctx, `INSERT INTO t VALUES (1)`)
	require.NoError(t, err, "the connection is free for the next statement")

	// Closed early, after one row.
	tx2 := steptx.New(f.ctx, f.conn)
	_, err = f.conn.Exec(f.ctx, "rollback")
	require.NoError(t, err)
	rows, err = tx2.Query(f.ctx, `SELECT g FROM generate_series(1, 3) g`)
	require.NoError(t, err)
	require.True(t, rows.Next())
	rows.Close()
	require.NoError(t, rows.Err())
	_, err = tx2.Exec(f.ctx, `INSERT INTO t VALUES (2)`)
	require.NoError(t, err)
}

func TestQueryRow(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tx := steptx.New(f.ctx, f.conn)
	var n int
	require.NoError(t, tx.QueryRow(f.ctx, `INSERT INTO t VALUES ($1) RETURNING n * 10`, 4).Scan(&n))
	require.Equal(t, 40, n)
	_, err := f.conn.Exec(f.ctx, "rollback")
	require.NoError(t, err)
	tx = steptx.New(f.ctx, f.conn)
	require.ErrorIs(t, tx.QueryRow(f.ctx, `SELECT n FROM t WHERE n = 5`).Scan(&n), pgx.ErrNoRows)
	require.NoError(t, tx.QueryRow(f.ctx, `SELECT 7`).Scan(&n), "the connection is free after an empty QueryRow")
	require.Equal(t, 7, n)
}

func TestFailedFirstStatementAbortsTheTransaction(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tx := steptx.New(f.ctx, f.conn)
	_, err := tx.Exec(f.ctx, `INSERT INTO t VALUES (1), (1)`)
	require.ErrorContains(t, err, "duplicate key")
	require.Equal(t, byte('E'), f.conn.PgConn().TxStatus(), "BEGIN ran: the transaction is open and aborted")
	require.NoError(t, tx.Err(), "it began")
	_, err = tx.Exec(f.ctx, `INSERT INTO t VALUES (2)`)
	require.ErrorContains(t, err, "aborted")
	_, err = f.conn.Exec(f.ctx, "rollback")
	require.NoError(t, err)
	require.Zero(t, f.outside(t))
}

// A first statement that does not prepare is refused before its batch,
// BEGIN included, is sent: the transaction then begins on its own, so
// what follows (on Conn too) is inside it, and Err keeps the owner from
// committing, as the aborted transaction of pgx would.
func TestUnpreparableFirstStatementBeginsAndIsReported(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tx := steptx.New(f.ctx, f.conn)
	_, err := tx.Exec(f.ctx, `INSERT INTO missing VALUES ($1)`, 1)
	require.ErrorContains(t, err, "missing")
	require.Equal(t, byte('T'), f.conn.PgConn().TxStatus())
	require.ErrorContains(t, tx.Err(), "missing")
	_, err = tx.Conn().Exec(f.ctx, `INSERT INTO t VALUES (1)`)
	require.NoError(t, err)
	require.Zero(t, f.outside(t), "inside the transaction, which the owner will not commit")
}

// An argument that does not encode fails the batch with BEGIN in it, and
// pgx closes the connection over a batch it could not build: unlike a
// pgx.Tx, the transaction is over, Err says so (the owner does not
// commit), and nothing is written.
func TestUnencodableFirstArgumentEndsTheTransaction(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tx := steptx.New(f.ctx, f.conn)
	_, err := tx.Exec(f.ctx, `INSERT INTO t VALUES ($1)`, make(chan int))
	require.Error(t, err)
	require.Error(t, tx.Err())
	_, err = tx.Exec(f.ctx, `INSERT INTO t VALUES ($1)`, 1)
	require.Error(t, err)
	require.Zero(t, f.outside(t))
}

// An Exec without arguments may hold several statements (pgx runs it
// with the simple protocol): it begins the transaction first.
func TestMultiStatementExecFirst(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tx := steptx.New(f.ctx, f.conn)
	_, err := tx.Exec(f.ctx, `SET LOCAL lock_timeout = '5s'; INSERT INTO t VALUES (1)`)
	require.NoError(t, err)
	require.Equal(t, byte('T'), f.conn.PgConn().TxStatus())
	require.Zero(t, f.outside(t))
}

func TestExecModeArgumentsBeginFirst(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tx := steptx.New(f.ctx, f.conn)
	_, err := tx.Exec(f.ctx, `INSERT INTO t VALUES ($1)`, pgx.QueryExecModeSimpleProtocol, 1)
	require.NoError(t, err)
	require.Equal(t, byte('T'), f.conn.PgConn().TxStatus())
	var n int
	require.NoError(t, tx.QueryRow(f.ctx, `SELECT count(*) FROM t`, pgx.QueryExecModeExec).Scan(&n))
	require.Equal(t, 1, n)
	require.Zero(t, f.outside(t))
}

func TestOnlyTheOwnerCommits(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tx := steptx.New(f.ctx, f.conn)
	_, err := tx.Exec(f.ctx, `INSERT INTO t VALUES (1)`)
	require.NoError(t, err)
	require.ErrorIs(t, tx.Commit(f.ctx), steptx.ErrNotYours)
	require.ErrorIs(t, tx.Rollback(f.ctx), steptx.ErrNotYours)
	require.Equal(t, byte('T'), f.conn.PgConn().TxStatus(), "still open")
	require.Zero(t, f.outside(t))
}

func TestSavepoints(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tx := steptx.New(f.ctx, f.conn)
	sp, err := tx.Begin(f.ctx)
	require.NoError(t, err)
	_, err = sp.Exec(f.ctx, `INSERT INTO t VALUES (1)`)
	require.NoError(t, err)
	require.NoError(t, sp.Rollback(f.ctx))
	err = pgx.BeginFunc(f.ctx, tx, func(sp pgx.Tx) error {
		_, err := sp.Exec(f.ctx, `INSERT INTO t VALUES (2)`)
		return err
	})
	require.NoError(t, err)
	_, err = f.conn.Exec(f.ctx, "commit")
	require.NoError(t, err)
	var ns []int
	rows, err := f.db.Pool.Query(f.ctx, `SELECT n FROM t`)
	require.NoError(t, err)
	ns, err = pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	require.Equal(t, []int{2}, ns)
}

func TestOtherMethodsBeginFirst(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tx := steptx.New(f.ctx, f.conn)
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO t VALUES (1)`)
	b.Queue(`INSERT INTO t VALUES (2)`)
	require.NoError(t, tx.SendBatch(f.ctx, b).Close())
	require.True(t, tx.Begun())
	n, err := tx.CopyFrom(f.ctx, pgx.Identifier{"t"}, []string{"n"}, pgx.CopyFromRows([][]any{{3}}))
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Zero(t, f.outside(t))
	_, err = f.conn.Exec(f.ctx, "commit")
	require.NoError(t, err)
	require.Equal(t, 3, f.outside(t))

	tx = steptx.New(f.ctx, f.conn)
	require.Same(t, f.conn, tx.Conn())
	require.True(t, tx.Begun(), "Conn begins: statements on it are in the transaction")
	require.Equal(t, byte('T'), f.conn.PgConn().TxStatus())
}

// Once its owner closes it, the transaction refuses the function's
// calls, as pgx's does after a commit.
func TestClosedRefusesTheFunction(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tx := steptx.New(f.ctx, f.conn)
	_, err := tx.Exec(f.ctx, `INSERT INTO t VALUES ($1)`, 1)
	require.NoError(t, err)
	tx.Close()
	_, err = tx.Exec(f.ctx, `INSERT INTO t VALUES ($1)`, 2)
	require.ErrorIs(t, err, pgx.ErrTxClosed)
	_, err = tx.Query(f.ctx, `SELECT 1`)
	require.ErrorIs(t, err, pgx.ErrTxClosed)
	var n int
	require.ErrorIs(t, tx.QueryRow(f.ctx, `SELECT 1`).Scan(&n), pgx.ErrTxClosed)
	_, err = tx.Begin(f.ctx)
	require.ErrorIs(t, err, pgx.ErrTxClosed)
	require.ErrorIs(t, tx.SendBatch(f.ctx, &pgx.Batch{}).Close(), pgx.ErrTxClosed)
}
