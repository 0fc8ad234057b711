package store

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A store call takes at most three values besides its context and its
// querier, and returns at most two (an error among them): more go in a
// params or result struct, whose fields name them at the call site.
func TestStoreCallsTakeAndReturnFewValues(t *testing.T) {
	t.Parallel()
	fset, files := packageSource(t)
	funcs := 0
	for _, f := range files {
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !fn.Name.IsExported() {
				continue
			}
			funcs++
			var in []string
			for _, field := range fn.Type.Params.List {
				typ := types(field.Type)
				for range max(len(field.Names), 1) {
					in = append(in, typ)
				}
			}
			if len(in) > 0 && in[0] == "context.Context" {
				in = in[1:]
				if len(in) > 0 && (in[0] == "DBTX" || in[0] == "pgx.Tx") {
					in = in[1:]
				}
			}
			out := 0
			if fn.Type.Results != nil {
				for _, field := range fn.Type.Results.List {
					out += max(len(field.Names), 1)
				}
			}
			where := fset.Position(fn.Pos())
			require.LessOrEqual(t, len(in), 3, "%s: %s takes %d values: give it a params struct", where, fn.Name.Name, len(in))
			require.LessOrEqual(t, out, 2, "%s: %s returns %d values: give it a result struct", where, fn.Name.Name, out)
		}
	}
	require.Greater(t, funcs, 50, "the package's calls were not found")
}

// packageSource parses the package's Go source, its tests aside, for the
// tests that hold rules over all of it.
func packageSource(t *testing.T) (*token.FileSet, []*ast.File) {
	t.Helper()
	names, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		files = append(files, f)
	}
	return fset, files
}

// types renders a parameter's type as written, for the few the test
// compares.
func types(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return types(e.X) + "." + e.Sel.Name
	}
	return ""
}
