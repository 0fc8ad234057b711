package engine_test

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
)

// engineDoc reads the engine package's documentation from its source.
func engineDoc(t *testing.T) *doc.Package {
	t.Helper()
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	require.NoError(t, err)
	var files []*ast.File
	for _, e := range entries {
		if name := e.Name(); strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") {
			f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
			require.NoError(t, err)
			files = append(files, f)
		}
	}
	p, err := doc.NewFromFiles(fset, files, "github.com/pgdurable/pgdurable/engine")
	require.NoError(t, err)
	return p
}

func docType(t *testing.T, p *doc.Package, name string) *doc.Type {
	t.Helper()
	for _, typ := range p.Types {
		if typ.Name == name {
			return typ
		}
	}
	t.Fatalf("no type %s", name)
	return nil
}

func methodDoc(t *testing.T, typ *doc.Type, name string) string {
	t.Helper()
	for _, m := range typ.Methods {
		if m.Name == name {
			return strings.Join(strings.Fields(m.Doc), " ")
		}
	}
	t.Fatalf("no method %s.%s", typ.Name, name)
	return ""
}

func fieldDoc(t *testing.T, typ *doc.Type, name string) string {
	t.Helper()
	for _, spec := range typ.Decl.Specs {
		for _, f := range spec.(*ast.TypeSpec).Type.(*ast.StructType).Fields.List {
			for _, n := range f.Names {
				if n.Name == name {
					return strings.Join(strings.Fields(f.Doc.Text()), " ")
				}
			}
		}
	}
	t.Fatalf("no field %s.%s", typ.Name, name)
	return ""
}

// The docs that say which runs are closed to an operation name every
// closed status: before, Cancel's, Signal's and ErrRunClosed's left out
// terminated. The delayed-start docs say a signal does not start a run
// early (where Temporal's StartDelay does), and Config.Retention's when
// the first prune runs.
func TestDocsSayWhatTheCodeDoes(t *testing.T) {
	t.Parallel()
	p := engineDoc(t)
	all := []engine.RunStatus{engine.StatusPending, engine.StatusRunning, engine.StatusWaiting, engine.StatusCompleted,
		engine.StatusFailed, engine.StatusCompensating, engine.StatusCompensated, engine.StatusCancelled, engine.StatusDead,
		engine.StatusContinued, engine.StatusTerminated}
	var consts int
	for _, c := range docType(t, p, "RunStatus").Consts {
		consts += len(c.Names)
	}
	require.Equal(t, len(all), consts, "a new run status: add it to this list")
	var errRunClosed string
	for _, v := range p.Vars {
		if len(v.Names) == 1 && v.Names[0] == "ErrRunClosed" {
			errRunClosed = strings.Join(strings.Fields(v.Doc), " ")
		}
	}
	e := docType(t, p, "Engine")
	for what, text := range map[string]string{"Engine.Cancel": methodDoc(t, e, "Cancel"), "Engine.Signal": methodDoc(t, e, "Signal"),
		"ErrRunClosed": errRunClosed} {
		for _, s := range all {
			if s.Terminal() && s != engine.StatusDead { // closed: finished for good
				require.Contains(t, text, string(s), "%s's doc does not name status %s", what, s)
			}
		}
	}

	opts := docType(t, p, "StartOpts")
	require.Contains(t, fieldDoc(t, opts, "StartAt"), "signal", "StartOpts.StartAt says what a signal does to a delayed run")
	require.Contains(t, fieldDoc(t, opts, "StartAt"), "StartDelay")
	require.Contains(t, fieldDoc(t, opts, "Delay"), "signal")
	require.Contains(t, methodDoc(t, e, "Signal"), "delayed start")
	require.Contains(t, fieldDoc(t, docType(t, p, "Config"), "Retention"), "first sweep")
}
