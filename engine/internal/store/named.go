package store

import (
	"context"
	"fmt"
	"regexp"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Statements with more than a few parameters, and those assembled from
// fragments that bind parameters or hold conditions, name their
// parameters (@run_id), as River's sqlc queries do: a fragment's comment
// saying which numbered parameters it binds went stale ($4..$15 for a
// fragment that bound $4..$17), and a thirty-parameter CTE cannot be
// checked by eye. Short statements whose only fragment is a column list
// keep $1..$n (TestStatementsNameTheirParameters allows at most $8). sqlc would do the naming at build time, but it cannot
// compose a statement from fragments (recordInsert, plusMS,
// nowIfElse): each copy would be spelled out again.
//
// pgx names arguments itself (pgx.StrictNamedArgs) by lexing the statement
// on every call: for the record writes (2 to 4 KiB) that cost 10 to 38 µs
// a call, against the few µs the rest of the call costs the engine. So a
// named statement is rewritten once, when the package initialises, by that
// same rewriter, and each call only orders its values as the rewrite
// numbered them. The SQL PostgreSQL receives, and so its prepared
// statement and plans, is what pgx would have sent.

// namedStmt is a statement written with @name parameters, as rewritten
// to $n once.
type namedStmt struct {
	source string   // the statement as written, with @name parameters
	sql    string   // the statement with $n placeholders, as sent
	names  []string // names[n-1] is the name of $n
}

// namedParam finds the names a statement may use; pgx's rewriter, which
// skips quoted text and comments, then checks that it uses exactly those.
var namedParam = regexp.MustCompile(`@([A-Za-z_][A-Za-z0-9_]*)`)

// named rewrites sql's @name parameters to $n (in the order of their
// first use) with pgx's own rewriter. It panics when pgx does not find
// every name the pattern found (an @name inside a literal or a comment),
// as regexp.MustCompile does on a bad pattern: the statements are
// package-level variables, so any test of the package catches it.
func named(sql string) *namedStmt {
	probe := pgx.StrictNamedArgs{}
	for _, m := range namedParam.FindAllStringSubmatch(sql, -1) {
		probe[m[1]] = m[1]
	}
	rewritten, order, err := probe.RewriteQuery(context.Background(), nil, sql, nil)
	if err != nil {
		panic(fmt.Sprintf("store: statement with named parameters: %v\n%s", err, sql))
	}
	names := make([]string, len(order))
	for i, name := range order {
		names[i] = name.(string)
	}
	return &namedStmt{source: sql, sql: rewritten, names: names}
}

// bind is the argument list of a call of s with args: a
// pgx.QueryRewriter that hands pgx args' values in s's $n order. A name s
// uses that args lacks, or one args holds that s does not use, fails the
// call, as pgx.StrictNamedArgs would.
func (s *namedStmt) bind(args pgx.StrictNamedArgs) pgx.QueryRewriter { return boundArgs{s, args} }

type boundArgs struct {
	stmt *namedStmt
	args pgx.StrictNamedArgs
}

// RewriteQuery implements pgx.QueryRewriter.
func (b boundArgs) RewriteQuery(_ context.Context, _ *pgx.Conn, sql string, _ []any) (string, []any, error) {
	if sql != b.stmt.sql {
		return "", nil, fmt.Errorf("arguments bound for another statement")
	}
	values := make([]any, len(b.stmt.names))
	for i, name := range b.stmt.names {
		v, ok := b.args[name]
		if !ok {
			return "", nil, fmt.Errorf("argument %s found in sql query but not bound", name)
		}
		values[i] = v
	}
	if len(b.args) != len(b.stmt.names) {
		for name := range b.args {
			if !slices.Contains(b.stmt.names, name) {
				return "", nil, fmt.Errorf("bound argument %s not found in sql query", name)
			}
		}
	}
	return sql, values, nil
}

func (s *namedStmt) queryRow(ctx context.Context, db DBTX, args pgx.StrictNamedArgs) pgx.Row {
	return db.QueryRow(ctx, s.sql, s.bind(args))
}

func (s *namedStmt) query(ctx context.Context, db DBTX, args pgx.StrictNamedArgs) (pgx.Rows, error) {
	return db.Query(ctx, s.sql, s.bind(args))
}

func (s *namedStmt) exec(ctx context.Context, db DBTX, args pgx.StrictNamedArgs) (pgconn.CommandTag, error) {
	return db.Exec(ctx, s.sql, s.bind(args))
}

// queue adds a call of s to b: pgx.Batch takes a QueryRewriter as a
// query's only argument, and calls it when the batch is sent.
func (s *namedStmt) queue(b *pgx.Batch, args pgx.StrictNamedArgs) {
	b.Queue(s.sql, s.bind(args))
}
