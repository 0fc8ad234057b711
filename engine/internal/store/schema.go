package store

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgdurable/pgdurable/storage/migrations"
)

// DefaultSchema is the PostgreSQL schema that holds the engine's tables
// (and River's) unless the engine is told otherwise. The statements of
// this package are written against it.
const DefaultSchema = "pgdurable"

// Tables are the engine's own tables, as the statements of this package
// name them (DefaultSchema + "." + table): the tables the migrations
// create. River's tables sit in the same schema but only River's own code
// reads them.
var Tables = migrations.Tables

// Querier is what a statement runs on: a pool, a connection or a
// transaction.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// DBTX is the store's one seam: a pool, a connection or a transaction
// bound to the schema the engine's tables are in (Schema.On). Only this
// package makes one, so no statement can run on a handle that was not
// told where the tables are: with two installations in one database, a
// statement that fell back to the default schema would write another
// installation's rows.
type DBTX interface {
	Querier
	// Begin begins a transaction (a savepoint on a transaction); bind it
	// with Bind before a statement runs on it.
	Begin(ctx context.Context) (pgx.Tx, error)
	schema() *Schema
}

// Schema is where one engine's tables are, and rewrites the package's
// statements for it. The statements name DefaultSchema; for another
// schema each distinct statement is rewritten once and the result kept,
// so a call costs a map lookup (River's sqlctemplate does the same for
// its Config.Schema). Safe for concurrent use.
type Schema struct {
	name      string
	runs      string   // the schema of the per-run tables, for a route k ≥ 1 (see Route); "" is name
	base      *Schema  // for a route k ≥ 1, route 0's Schema; nil for route 0
	rewritten sync.Map // statement as written -> statement for this schema
	routes    sync.Map // k -> *Schema, Route's
}

// Default is the Schema of DefaultSchema: its statements run as written.
var Default = &Schema{name: DefaultSchema}

// NewSchema returns the Schema named name ("" is DefaultSchema), or an
// error when migrations.ValidSchemaName refuses the name.
func NewSchema(name string) (*Schema, error) {
	if name == "" || name == DefaultSchema {
		return Default, nil
	}
	if err := migrations.ValidSchemaName(name); err != nil {
		return nil, err
	}
	return &Schema{name: name}, nil
}

// Name is the schema's name.
func (s *Schema) Name() string { return s.name }

// On binds q to s: statements run on the result name s's tables. What the
// store learns of q's server (see server) is kept with the result, and
// with every handle Bind makes like it.
func (s *Schema) On(q Querier) DBTX {
	if b, ok := q.(bound); ok {
		if b.s != s {
			panic(fmt.Sprintf("store: a handle bound to schema %s bound again to %s", b.s.name, s.name))
		}
		return b
	}
	return bound{q: q, s: s, srv: &server{}}
}

// server is what the store learns of a database server when it first
// needs to, once per handle On made (a failed look is tried again), and
// the flow-controlled queues' virtual times it has seen lately.
type server struct {
	citus  atomic.Int32                    // 0: not known yet, 1: plain PostgreSQL, 2: a Citus coordinator
	routes atomic.Int32                    // the installation's routes (see Routes); 0: not known yet
	pins   atomic.Pointer[migrations.Pins] // the installation's route pins (see workflowRoute), read with routes

	mu     sync.Mutex
	vtimes map[string]vtimeSeen // by queue
}

// vtimeSeen is a queue's virtual time as read, or written by an
// admission, at a time.
type vtimeSeen struct {
	v  float64
	at time.Time
}

// serverOf is what db's handle learned of its server; nil for a handle
// the store did not bind.
func serverOf(db DBTX) *server {
	if b, ok := db.(bound); ok {
		return b.srv
	}
	return nil
}

// onCitus reports whether db's server is a Citus coordinator (the
// citus extension is installed in its database). A handle the store did
// not bind is taken for plain PostgreSQL.
func onCitus(ctx context.Context, db DBTX) (bool, error) {
	b, ok := db.(bound)
	if !ok || b.srv == nil {
		return false, nil
	}
	if known := b.srv.citus.Load(); known != 0 {
		return known == 2, nil
	}
	var citus bool
	if err := b.q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`).Scan(&citus); err != nil {
		return false, fmt.Errorf("reading whether the database is a Citus cluster: %w", err)
	}
	known := int32(1)
	if citus {
		known = 2
	}
	b.srv.citus.Store(known)
	return citus, nil
}

// qualified finds the package's references to its tables.
var qualified = regexp.MustCompile(`\b` + DefaultSchema + `\.(` + strings.Join(Tables, "|") + `)\b`)

// SQL is sql as it runs in s: every DefaultSchema.table of the engine's
// tables names s's table instead (the per-run tables the route's schema,
// for a route k ≥ 1: see Route). Text that is not such a reference (a
// River job kind such as 'pgdurable.run', a column) is left alone.
func (s *Schema) SQL(sql string) string {
	if s == Default {
		return sql
	}
	if v, ok := s.rewritten.Load(sql); ok {
		return v.(string)
	}
	out := sql
	if s.runs != "" {
		out = runTable.ReplaceAllString(out, s.runs+".$1")
	}
	out = qualified.ReplaceAllString(out, s.name+".$1")
	s.rewritten.Store(sql, out)
	return out
}

type bound struct {
	q   Querier
	s   *Schema
	srv *server
}

func (b bound) schema() *Schema { return b.s }

// args rewrites a statement whose only argument is a pgx.QueryRewriter
// (a named statement's bound arguments) after that rewriter has run,
// since the rewriter checks the statement it was bound for.
func (b bound) args(sql string, args []any) (string, []any) {
	if b.s == Default {
		return sql, args
	}
	if len(args) == 1 {
		if r, ok := args[0].(pgx.QueryRewriter); ok {
			return sql, []any{schemaRewriter{r, b.s}}
		}
	}
	return b.s.SQL(sql), args
}

func (b bound) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	sql, args = b.args(sql, args)
	return b.q.Exec(ctx, sql, args...)
}

func (b bound) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	sql, args = b.args(sql, args)
	return b.q.Query(ctx, sql, args...)
}

func (b bound) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	sql, args = b.args(sql, args)
	return b.q.QueryRow(ctx, sql, args...)
}

func (b bound) SendBatch(ctx context.Context, batch *pgx.Batch) pgx.BatchResults {
	if b.s != Default {
		for _, qq := range batch.QueuedQueries {
			qq.SQL, qq.Arguments = b.args(qq.SQL, qq.Arguments)
		}
	}
	return b.q.SendBatch(ctx, batch)
}

type schemaRewriter struct {
	r pgx.QueryRewriter
	s *Schema
}

// RewriteQuery implements pgx.QueryRewriter.
func (w schemaRewriter) RewriteQuery(ctx context.Context, conn *pgx.Conn, sql string, args []any) (string, []any, error) {
	sql, args, err := w.r.RewriteQuery(ctx, conn, sql, args)
	return w.s.SQL(sql), args, err
}

// Bind is q bound to like's schema: a transaction begun on a bound pool
// runs its statements where the pool's do.
func Bind(like DBTX, q Querier) DBTX {
	if b, ok := like.(bound); ok {
		if _, already := q.(bound); !already {
			return bound{q: q, s: b.s, srv: b.srv}
		}
	}
	return like.schema().On(q)
}

// Begin implements DBTX.
func (b bound) Begin(ctx context.Context) (pgx.Tx, error) {
	beginner, ok := b.q.(interface {
		Begin(context.Context) (pgx.Tx, error)
	})
	if !ok {
		return nil, fmt.Errorf("store: %T cannot begin a transaction", b.q)
	}
	return beginner.Begin(ctx)
}
