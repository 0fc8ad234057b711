// Package steptx is the transaction a tx step's function runs in: a
// pgx.Tx whose BEGIN travels with the function's first statement, and
// which only its owner commits, together with the step's record.
//
// A tx step's transaction as pgx.BeginFunc runs it costs a round trip
// for BEGIN, one per statement, one for the record and one for COMMIT:
// four for a one-statement step, while a hand-written autocommit INSERT
// costs one. Tx sends BEGIN in one batch with the first statement
// (pgx.Batch.BeginTx), and its owner queues the record and COMMIT in one
// batch after the last: two round trips for the same step. Every other
// method begins the transaction on its own first, then behaves as
// pgx.Tx does.
//
// A step may also join a transaction that steps before it left open (see
// Join): it then runs under a savepoint of that transaction, sent in the
// same batch as its first statement, and the transaction commits once,
// with every joined step's record. A first statement the connection has
// not run before (its Parse could fail and would abort the open
// transaction before the savepoint exists) first commits the steps before
// it, and the step begins a transaction of its own.
package steptx

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// ErrNotYours is what Commit and Rollback return to the step's function:
// the transaction commits with the step's record, or rolls back when the
// function returns an error, and never at the function's word (a commit
// without the record would take effect again on the next attempt).
var ErrNotYours = errors.New("pgdurable: a tx step's transaction commits with the step's record; " +
	"return an error to roll it back, and use tx.Begin for a savepoint")

// Tx is a transaction on conn that has not begun until its first
// statement. It is not safe for concurrent use, as pgx.Tx is not.
type Tx struct {
	conn *pgx.Conn
	// ctx begins the transaction for the methods that take no context
	// (Conn, LargeObjects).
	ctx context.Context
	tx  pgx.Tx // the transaction once begun (closed if BEGIN failed)
	// err is a statement the server refused before the transaction's
	// BEGIN ran (one that does not prepare is refused before its batch
	// is sent), or a BEGIN that failed: in a transaction begun first it
	// would have aborted the transaction.
	err error
	// closed: the step's function returned; the transaction is the
	// owner's now (see Close).
	closed atomic.Bool

	// outer is the open transaction the step joins (nil: none); settle
	// commits it, with the records of the steps in it, when the step
	// cannot join it safely.
	outer   pgx.Tx
	settle  func(context.Context) error
	settled bool // settle ran: the step is in a transaction of its own
	// lost: the joined transaction failed before the step's savepoint
	// held (or its state is unknown): the steps before it rolled back.
	lost bool
	// xid is the joined transaction's ID (text), read when the function
	// took the connection inside it (Conn), where it may end it unseen.
	xid string
}

// Escaped returns the joined transaction's ID when the function took the
// connection inside it ("" otherwise): pg_xact_status of it tells whether
// the function committed it, rolled it back, or left it open.
func (t *Tx) Escaped() string { return t.xid }

// refuse keeps a statement that would end the transaction from being
// sent (see ErrEndsTransaction); the owner does not commit after it.
func (t *Tx) refuse(sql string) error {
	if !endsTransaction(sql) {
		return nil
	}
	t.err = ErrEndsTransaction
	return ErrEndsTransaction
}

// savepointSQL opens the savepoint a joined step runs under: a failed
// step rolls back to it alone.
const savepointSQL = "savepoint pgdurable_step"

// RollbackToSavepoint is the statement that undoes a joined step's writes
// and leaves the steps before it in the transaction.
const RollbackToSavepoint = "rollback to savepoint pgdurable_step"

// Join returns a transaction on conn for a step that joins outer, the
// transaction the steps before it left open on conn, under a savepoint.
// settle commits outer with those steps' records; Tx calls it (and the
// step begins a transaction of its own) when its first statement cannot
// join safely (see the package comment). ctx is for the methods that take
// none.
func Join(ctx context.Context, conn *pgx.Conn, outer pgx.Tx, settle func(context.Context) error) *Tx {
	return &Tx{conn: conn, ctx: ctx, outer: outer, settle: settle}
}

// Joined reports whether the step runs in the transaction it joined (Join,
// and that transaction was not settled first).
func (t *Tx) Joined() bool { return t.outer != nil && !t.settled }

// Settled reports whether the transaction the step joined was committed
// before the step's first statement (settle ran, with or without error).
func (t *Tx) Settled() bool { return t.settled }

// Lost reports whether the joined transaction failed before the step's
// savepoint held, or may have: the steps before it did not commit.
func (t *Tx) Lost() bool { return t.lost }

// Underlying is the transaction open on the connection (nil before the
// first statement): the one a later step may join.
func (t *Tx) Underlying() pgx.Tx {
	if _, ok := t.tx.(closedTx); ok {
		return nil
	}
	return t.tx
}

// settleFirst commits the transaction the step joined, once.
func (t *Tx) settleFirst(ctx context.Context) error {
	t.settled = true
	if err := t.settle(ctx); err != nil {
		t.tx, t.err = closedTx{err}, err
		return err
	}
	return nil
}

// firstOnly settles the joined transaction before sql when sql must be
// its transaction's first statement (SET TRANSACTION: isolation, read
// only, snapshot), which under a savepoint it is not: the step then
// begins a transaction of its own.
func (t *Tx) firstOnly(ctx context.Context, sql string) error {
	if t.tx != nil || !t.Joined() {
		return nil
	}
	f := strings.Fields(strings.ToLower(sql))
	if len(f) >= 2 && f[0] == "set" && (f[1] == "transaction" || f[1] == "session" && len(f) >= 3 && f[2] == "characteristics") {
		return t.settleFirst(ctx)
	}
	return nil
}

// knownKey names the set, in the connection's custom data, of statements
// that prepared on it: a joined step's first statement must be one.
const knownKey = "pgdurable.steptx.known"

// maxKnown bounds that set (pgx's statement cache holds 512).
const maxKnown = 512

func known(conn *pgx.Conn, sql string) bool {
	set, _ := conn.PgConn().CustomData()[knownKey].(map[string]struct{})
	_, ok := set[sql]
	return ok
}

func markKnown(conn *pgx.Conn, sql string) {
	data := conn.PgConn().CustomData()
	set, _ := data[knownKey].(map[string]struct{})
	if set == nil {
		set = map[string]struct{}{}
		data[knownKey] = set
	}
	if len(set) < maxKnown {
		set[sql] = struct{}{}
	}
}

func forget(conn *pgx.Conn, sql string) {
	if set, _ := conn.PgConn().CustomData()[knownKey].(map[string]struct{}); set != nil {
		delete(set, sql)
	}
}

// Close ends the function's use of the transaction: from then on its
// calls return pgx.ErrTxClosed, as pgx's do after a commit, so that a
// goroutine the function left behind cannot write outside the step (the
// owner commits, and the connection goes back to the pool).
func (t *Tx) Close() { t.closed.Store(true) }

// Err is the error that must keep the owner from committing the step even
// if the function swallowed it: a BEGIN that failed, or a first statement
// the server refused before BEGIN ran (pgx.BeginFunc does not commit a
// transaction a statement aborted, either).
func (t *Tx) Err() error { return t.err }

// New returns a transaction on conn that begins with its first statement.
// ctx is for the methods that take none.
func New(ctx context.Context, conn *pgx.Conn) *Tx { return &Tx{conn: conn, ctx: ctx} }

// Begun reports whether a statement has run (or was sent) in the
// transaction: if not, there is nothing to commit but the record.
func (t *Tx) Begun() bool { return t.tx != nil }

// Conn is the connection, in the transaction (begun now if it was not).
// A step that joined another's transaction and has not begun commits the
// steps before it first: what the function does on the raw connection
// cannot end their transaction.
//
// A joined step that has begun hands out the connection inside the joined
// transaction; its ID is read first (one round trip), so that the owner
// learns afterwards whether the function ended it (see Escaped). A failed
// commit of the steps before leaves the connection in a transaction of its
// own, which the owner then rolls back.
func (t *Tx) Conn() *pgx.Conn {
	if t.Joined() && t.tx == nil {
		if err := t.settleFirst(t.ctx); err != nil {
			if tx, berr := t.conn.Begin(t.ctx); berr == nil {
				t.tx = tx // t.err stays: never committed
			}
			return t.conn
		}
	}
	if err := t.begin(t.ctx); err == nil && t.Joined() && t.xid == "" {
		if err := t.conn.QueryRow(t.ctx, "select pg_current_xact_id()::text").Scan(&t.xid); err != nil {
			t.err = err
		}
	}
	return t.conn
}

// begin begins the transaction on its own round trip, for the methods
// that do not pipeline BEGIN.
func (t *Tx) begin(ctx context.Context) error {
	if t.tx != nil {
		return nil
	}
	if t.Joined() {
		if _, err := t.outer.Exec(ctx, savepointSQL); err != nil {
			t.tx, t.err, t.lost = closedTx{err}, err, true
			return err
		}
		t.tx = t.outer
		return nil
	}
	tx, err := t.conn.Begin(ctx)
	if err != nil {
		t.tx, t.err = closedTx{err}, err
		return err
	}
	t.tx = tx
	return nil
}

// pipelined reports whether a statement with args can go in a batch
// behind BEGIN: pgx batches take no per-query execution mode or result
// formats, so a statement that names one begins the transaction first.
func pipelined(args []any) bool {
	if len(args) == 0 {
		return true
	}
	switch args[0].(type) {
	case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
		return false
	}
	return true
}

// beginWith sends BEGIN and sql in one batch and returns the batch, its
// BEGIN's result read.
//
// A batch that fails before the server runs its BEGIN (sql does not
// prepare, or an argument does not encode) leaves no transaction: the
// transaction then begins on its own, as it would have before sql, so
// that what the function does next (on Conn too) is inside it, as with
// pgx. A statement the server refused would have aborted that
// transaction: Err reports it, and the owner does not commit.
func (t *Tx) beginWith(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	if t.Joined() {
		if known(t.conn, sql) {
			return t.joinWith(ctx, sql, args)
		}
		if err := t.settleFirst(ctx); err != nil {
			return nil, err
		}
	}
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(sql, args...)
	br := t.conn.SendBatch(ctx, b)
	t.tx = br.Tx()
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		if t.conn.PgConn().TxStatus() == 'I' {
			t.tx = nil
			if berr := t.begin(ctx); berr != nil {
				return nil, berr
			}
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) {
				t.err = err
			}
		}
		return nil, err
	}
	markKnown(t.conn, sql)
	return br, nil
}

// joinWith sends the savepoint and sql in one batch and returns the
// batch, the savepoint's result read. A savepoint that did not take (the
// batch failed before the server ran it, or the transaction was aborted)
// leaves the joined transaction lost.
func (t *Tx) joinWith(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	b := &pgx.Batch{}
	b.Queue(savepointSQL)
	b.Queue(sql, args...)
	br := t.conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		forget(t.conn, sql)
		t.tx, t.err, t.lost = closedTx{err}, err, true
		return nil, err
	}
	t.tx = t.outer
	return br, nil
}

// Exec implements pgx.Tx. pgx runs an Exec without arguments with the
// simple protocol, where one string may hold several statements, which a
// batch cannot: such an Exec begins the transaction first.
func (t *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.closed.Load() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	if err := t.refuse(sql); err != nil {
		return pgconn.CommandTag{}, err
	}
	if err := t.firstOnly(ctx, sql); err != nil {
		return pgconn.CommandTag{}, err
	}
	if t.tx != nil || len(args) == 0 || !pipelined(args) {
		if err := t.begin(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
		return t.tx.Exec(ctx, sql, args...)
	}
	br, err := t.beginWith(ctx, sql, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// Query implements pgx.Tx. The rows hold the connection until they are
// closed or read to the end, as pgx's do.
func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	if err := t.refuse(sql); err != nil {
		return nil, err
	}
	if err := t.firstOnly(ctx, sql); err != nil {
		return nil, err
	}
	if t.tx != nil || !pipelined(args) {
		if err := t.begin(ctx); err != nil {
			return nil, err
		}
		return t.tx.Query(ctx, sql, args...)
	}
	br, err := t.beginWith(ctx, sql, args)
	if err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// QueryRow implements pgx.Tx.
func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.closed.Load() {
		return errRow{pgx.ErrTxClosed}
	}
	if err := t.refuse(sql); err != nil {
		return errRow{err}
	}
	if err := t.firstOnly(ctx, sql); err != nil {
		return errRow{err}
	}
	if t.tx != nil || !pipelined(args) {
		if err := t.begin(ctx); err != nil {
			return errRow{err}
		}
		return t.tx.QueryRow(ctx, sql, args...)
	}
	rows, err := t.Query(ctx, sql, args...)
	if err != nil {
		return errRow{err}
	}
	return row{rows}
}

// Begin implements pgx.Tx: a savepoint, as pgx's is.
func (t *Tx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	return t.tx.Begin(ctx)
}

// Commit implements pgx.Tx: ErrNotYours.
func (t *Tx) Commit(context.Context) error { return ErrNotYours }

// Rollback implements pgx.Tx: ErrNotYours.
func (t *Tx) Rollback(context.Context) error { return ErrNotYours }

// CopyFrom implements pgx.Tx.
func (t *Tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if t.closed.Load() {
		return 0, pgx.ErrTxClosed
	}
	if err := t.begin(ctx); err != nil {
		return 0, err
	}
	return t.tx.CopyFrom(ctx, table, columns, src)
}

// SendBatch implements pgx.Tx.
func (t *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.closed.Load() {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	for _, q := range b.QueuedQueries {
		if err := t.refuse(q.SQL); err != nil {
			return pgx.FailedBatchResults(b, err)
		}
	}
	if err := t.begin(ctx); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return t.tx.SendBatch(ctx, b)
}

// LargeObjects implements pgx.Tx.
func (t *Tx) LargeObjects() pgx.LargeObjects {
	_ = t.begin(t.ctx) // a failed BEGIN fails the large object calls
	return t.tx.LargeObjects()
}

// Prepare implements pgx.Tx.
func (t *Tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	return t.tx.Prepare(ctx, name, sql)
}

// batchRows are a batch's rows that close the batch when they close, or
// when Next reads past the last row (pgx closes rows then too), so the
// connection is free for the next statement.
type batchRows struct {
	pgx.Rows
	br     pgx.BatchResults
	closed bool
	err    error
}

func (r *batchRows) finish() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	r.err = r.br.Close()
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.finish()
	return false
}

func (r *batchRows) Close() { r.finish() }

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

// row is QueryRow's result over batch rows, as pgx's own.
type row struct{ rows pgx.Rows }

func (r row) Scan(dest ...any) error {
	defer r.rows.Close()
	if err := r.rows.Err(); err != nil {
		return err
	}
	for _, d := range dest {
		if _, ok := d.(*pgtype.DriverBytes); ok {
			return errors.New("cannot scan into *pgtype.DriverBytes from QueryRow")
		}
	}
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// closedTx is the transaction whose BEGIN failed: every call returns
// that error.
type closedTx struct{ err error }

func (c closedTx) Begin(context.Context) (pgx.Tx, error) { return nil, c.err }
func (c closedTx) Commit(context.Context) error          { return c.err }
func (c closedTx) Rollback(context.Context) error        { return c.err }
func (c closedTx) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	return 0, c.err
}
func (c closedTx) SendBatch(_ context.Context, b *pgx.Batch) pgx.BatchResults {
	return pgx.FailedBatchResults(b, c.err)
}
func (c closedTx) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }
func (c closedTx) Prepare(context.Context, string, string) (*pgconn.StatementDescription, error) {
	return nil, c.err
}
func (c closedTx) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, c.err
}
func (c closedTx) Query(context.Context, string, ...any) (pgx.Rows, error) { return nil, c.err }
func (c closedTx) QueryRow(context.Context, string, ...any) pgx.Row        { return errRow(c) }
func (c closedTx) Conn() *pgx.Conn                                         { return nil }
