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

// maxPositional is the most positional parameters ($1..$8) a statement
// may have: past that, it names them (see named).
const maxPositional = 8

var positionalParam = regexp.MustCompile(`\$(\d+)`)

// Every string literal in the package's Go source (its tests aside) is
// SQL or a part of it. A statement with more than maxPositional
// positional parameters uses $9 or higher in one of its parts, and a part
// that mixed $n with @name would have its $n bound to nothing.
func TestStatementsNameTheirParameters(t *testing.T) {
	t.Parallel()
	fset, files := packageSource(t)
	literals := 0
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			literals++
			sql, err := strconv.Unquote(lit.Value)
			require.NoError(t, err)
			where := fset.Position(lit.Pos())
			for _, m := range positionalParam.FindAllStringSubmatch(sql, -1) {
				n, err := strconv.Atoi(m[1])
				require.NoError(t, err)
				require.LessOrEqual(t, n, maxPositional, "%s: %s: name the parameters of a statement with more than %d", where, m[0], maxPositional)
			}
			if positionalParam.MatchString(sql) {
				require.False(t, namedParam.MatchString(sql), "%s: mixes $n and @name parameters", where)
			}
			return true
		})
	}
	require.Greater(t, literals, 100, "the package's statements were not found")
}

// The guard above sees what it should: the statements that had more than
// eight positional parameters before they were named would fail it.
func TestPositionalParamPatternFindsHighNumbers(t *testing.T) {
	t.Parallel()
	var found []string
	for _, m := range positionalParam.FindAllStringSubmatch(`WHERE a = $1 AND b = $12::int AND c = ANY($9)`, -1) {
		found = append(found, m[1])
	}
	require.Equal(t, []string{"1", "12", "9"}, found)
}

// A named statement is rewritten once, to the SQL pgx's own rewriter
// sends, and a call binds its values in that order; a name missing from
// the call, or one the statement does not use, fails the call as
// pgx.StrictNamedArgs does.
func TestNamedStatementsBindByName(t *testing.T) {
	t.Parallel()
	const sql = `SELECT @b::int, @a::text, @b::int + 1 -- a comment`
	s := named(sql)
	want, wantArgs, err := pgx.StrictNamedArgs{"a": "x", "b": 2}.RewriteQuery(context.Background(), nil, sql, nil)
	require.NoError(t, err)
	require.Equal(t, want, s.sql)
	require.Equal(t, []string{"b", "a"}, s.names)

	got, args, err := s.bind(pgx.StrictNamedArgs{"a": "x", "b": 2}).RewriteQuery(context.Background(), nil, s.sql, nil)
	require.NoError(t, err)
	require.Equal(t, want, got)
	require.Equal(t, wantArgs, args)

	_, _, err = s.bind(pgx.StrictNamedArgs{"a": "x"}).RewriteQuery(context.Background(), nil, s.sql, nil)
	require.ErrorContains(t, err, "argument b")
	_, _, err = s.bind(pgx.StrictNamedArgs{"a": "x", "b": 2, "c": 3}).RewriteQuery(context.Background(), nil, s.sql, nil)
	require.ErrorContains(t, err, "argument c")
	_, _, err = s.bind(pgx.StrictNamedArgs{"a": "x", "b": 2}).RewriteQuery(context.Background(), nil, "SELECT 1", nil)
	require.Error(t, err)
}

// An @name that pgx does not take for a parameter (in a literal) is a
// mistake named reports when the package initialises.
func TestNamedPanicsOnANameInALiteral(t *testing.T) {
	t.Parallel()
	require.Panics(t, func() { named(`SELECT '@a', @b`) })
}

// BenchmarkNamedArguments compares what a call of a large statement
// costs to bind its arguments by name (a step record's INSERT): pgx's StrictNamedArgs, which lexes
// the statement each call, against named's rewrite done once.
func BenchmarkNamedArguments(b *testing.B) {
	args := func() pgx.StrictNamedArgs {
		a := pgx.StrictNamedArgs{"run_id": 1, "token": 2}
		return stepArgs(a, Fence{}, &StepRecord{Seq: 1, Name: "s", Kind: "step", Status: StepCompleted})
	}
	source := recordForUpdate.source
	b.Run("pgx.StrictNamedArgs", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := args().RewriteQuery(context.Background(), nil, source, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("named", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := recordForUpdate.bind(args()).RewriteQuery(context.Background(), nil, recordForUpdate.sql, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
}
