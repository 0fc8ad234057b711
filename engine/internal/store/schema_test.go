package store

import (
	"context"
	"go/ast"
	"go/token"
	"regexp"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// tableUse finds a table named after a keyword that takes one.
var tableUse = regexp.MustCompile(`(?i)\b(?:FROM|JOIN|INTO|UPDATE|TABLE|USING)\s+([a-z_][a-z0-9_]*)(\.[a-z_]+)?`)

// TestStatementsNameTheirSchema: every table a statement of the package
// names is DefaultSchema's, which Schema.SQL rewrites for another schema.
// A bare table name would be resolved through the connection's
// search_path: against the application's own table of that name, or
// against another installation's.
func TestStatementsNameTheirSchema(t *testing.T) {
	_, files := packageSource(t)
	var checked int
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			for _, m := range tableUse.FindAllStringSubmatch(s, -1) {
				name, rest := m[1], m[2]
				if name == DefaultSchema && rest != "" {
					checked++
					require.Contains(t, Tables, rest[1:], "a statement names %s, which is not in Tables: Schema.SQL would not rewrite it", m[0])
					continue
				}
				for _, table := range Tables {
					require.NotEqual(t, table, name, "a statement names table %s without its schema:\n%s", table, s)
				}
			}
			return true
		})
	}
	require.Greater(t, checked, 100, "the pattern stopped finding the statements' tables")
}

func TestSchemaRewritesOnlyTheEngineTables(t *testing.T) {
	s, err := NewSchema("acme_flows")
	require.NoError(t, err)
	in := `SELECT r.run_id FROM pgdurable.workflow_runs r JOIN pgdurable.workflow_steps s USING (run_id)
WHERE kind = 'pgdurable.run' AND r.status = 'pgdurable.workflow_runs_x'`
	require.Equal(t, `SELECT r.run_id FROM acme_flows.workflow_runs r JOIN acme_flows.workflow_steps s USING (run_id)
WHERE kind = 'pgdurable.run' AND r.status = 'pgdurable.workflow_runs_x'`, s.SQL(in))
	require.Equal(t, in, Default.SQL(in))
	again, err := NewSchema("")
	require.NoError(t, err)
	require.Same(t, Default, again)
}

// rewriterFunc is a pgx.QueryRewriter as a func.
type rewriterFunc func(sql string) string

func (f rewriterFunc) RewriteQuery(_ context.Context, _ *pgx.Conn, sql string, args []any) (string, []any, error) {
	return f(sql), args, nil
}

// A named statement's arguments check the statement they were bound for,
// so the schema rewrite runs after them, not before.
func TestBoundHandleRewritesAfterNamedArguments(t *testing.T) {
	s, err := NewSchema("acme_flows")
	require.NoError(t, err)
	b := s.On(nil).(bound)
	var seen string
	sql, args := b.args("SELECT 1 FROM pgdurable.dead_jobs", []any{rewriterFunc(func(sql string) string { seen = sql; return sql })})
	require.Equal(t, "SELECT 1 FROM pgdurable.dead_jobs", sql)
	out, _, err := args[0].(pgx.QueryRewriter).RewriteQuery(context.Background(), nil, sql, nil)
	require.NoError(t, err)
	require.Equal(t, "SELECT 1 FROM pgdurable.dead_jobs", seen)
	require.Equal(t, "SELECT 1 FROM acme_flows.dead_jobs", out)

	sql, _ = b.args("DELETE FROM pgdurable.ui_sessions WHERE id = $1", []any{1})
	require.Equal(t, "DELETE FROM acme_flows.ui_sessions WHERE id = $1", sql)

	require.Same(t, b.s, Bind(b, nil).schema())
	require.Panics(t, func() { Default.On(b) }, "a handle bound to one schema must not be taken for another's")
}
