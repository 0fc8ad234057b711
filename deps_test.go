package pgdurable_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestDependencyRule enforces DESIGN §2: imports only point down, only
// engine/internal/queue and storage/migrations import River, and the
// public engine package never mentions River.
func TestDependencyRule(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}:{{join .Imports " "}}`, "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const mod = "github.com/pgdurable/pgdurable/"
	// rank: a package may import only module packages of a lower rank.
	rank := func(pkg string) int {
		p := strings.TrimPrefix(pkg, mod)
		switch {
		case strings.HasPrefix(p, "storage/"):
			return 0
		case strings.HasPrefix(p, "engine/internal/"), strings.HasPrefix(p, "internal/roundtrips"):
			return 1
		case p == "engine":
			return 2
		case strings.HasPrefix(p, "engine/"), strings.HasPrefix(p, "internal/crashtest"): // enginetest and friends
			return 3
		case strings.HasPrefix(p, "activities"):
			return 4
		case strings.HasPrefix(p, "compensation"):
			return 5
		default: // cmd, examples
			return 6
		}
	}
	// riverref is the bench's hand-written River reference, a harness.
	riverAllowed := map[string]bool{mod + "engine/internal/queue": true, mod + "storage/migrations": true,
		mod + "cmd/engine/internal/enginebench/internal/riverref": true}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, ":")
		for _, imp := range strings.Fields(imports) {
			if strings.HasPrefix(imp, "github.com/riverqueue/") && !riverAllowed[pkg] {
				t.Errorf("%s imports %s; only engine/internal/queue and storage/migrations may import River", pkg, imp)
			}
			if strings.HasPrefix(imp, "github.com/robfig/cron") && pkg != mod+"engine/internal/cronspec" {
				t.Errorf("%s imports %s; only engine/internal/cronspec may import robfig/cron (one file)", pkg, imp)
			}
			if strings.HasPrefix(imp, mod) && rank(imp) >= rank(pkg) && !strings.HasPrefix(imp, pkg) {
				if !(rank(imp) == rank(pkg) && rank(pkg) != 2) {
					t.Errorf("%s imports %s: imports must point down the layers of DESIGN §2", pkg, imp)
				}
			}
		}
	}
}

// TestInternalImports enforces the layering inside engine/internal (issue
// 23): the machinery imports none of the API, and each package imports
// only the packages of this module listed for it here, so that the store
// stays a leaf (it reads the schema's names and rules from the migrations
// that create the schema, its one source), River stays in queue (the
// maintenance services reach it through an interface), and a new internal
// package states its rules.
func TestInternalImports(t *testing.T) {
	t.Parallel()
	const mod = "github.com/pgdurable/pgdurable/"
	allowed := map[string][]string{
		"engine/internal/store":       {"storage/migrations"},
		"engine/internal/cronspec":    nil,
		"engine/internal/queue":       nil,
		"engine/internal/groupcommit": {"engine/internal/store"},
		"engine/internal/maintenance": {"engine/internal/store", "engine/internal/cronspec"},
		"engine/internal/flow":        {"engine/internal/store"},
		"engine/internal/steptx":      nil,
	}
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}:{{join .Imports " "}}`, "./engine/internal/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, ":")
		pkg = strings.TrimPrefix(pkg, mod)
		ok, known := allowed[pkg]
		if !known {
			t.Errorf("%s has no import rules: add it to TestInternalImports", pkg)
			continue
		}
		for _, imp := range strings.Fields(imports) {
			if !strings.HasPrefix(imp, mod) {
				continue
			}
			if imp = strings.TrimPrefix(imp, mod); !slices.Contains(ok, imp) {
				t.Errorf("%s imports %s; it may import only %v of this module", pkg, imp, ok)
			}
		}
	}
}

// TestCommandsLeaveOutTheExample enforces issue 11: a binary built on
// cmd/engine/commands (Execute with its own workflows) does not link the
// payment example; the shipped cmd/engine adds it from paymentcmd.
func TestCommandsLeaveOutTheExample(t *testing.T) {
	t.Parallel()
	const mod = "github.com/pgdurable/pgdurable/"
	for _, pkg := range []string{mod + "cmd/engine/commands", mod + "cmd/engine/internal/enginebench"} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasPrefix(dep, mod+"examples/") || dep == mod+"cmd/engine/internal/paymentcmd" {
				t.Errorf("%s depends on %s; the payment example's commands belong in cmd/engine/internal/paymentcmd", pkg, dep)
			}
		}
	}
	out, err := exec.Command("go", "list", "-deps", mod+"cmd/engine").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps cmd/engine: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), mod+"examples/payment\n") {
		t.Errorf("the shipped cmd/engine no longer links the payment example: its demo, gateway and chaos commands are gone")
	}
}
