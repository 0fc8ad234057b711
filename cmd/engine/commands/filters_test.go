package commands_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/cmd/engine/commands"
	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// cli runs the CLI in-process with opts (its streams replaced) and the
// environment env.
func cli(opts commands.Options, env map[string]string, args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	opts.Stdout, opts.Stderr = &out, &errOut
	opts.Getenv = func(k string) string { return env[k] }
	code := commands.Execute(context.Background(), args, opts)
	return code, out.String(), errOut.String()
}

// family starts an "approval" run as its child, under workflow ID
// <its workflow ID>-kid.
var family = engine.Define("family", func(ctx *engine.Context, _ in) (string, error) {
	return engine.ChildWorkflow(ctx, engine.Define("approval", func(*engine.Context, in) (string, error) { return "", nil }, nil),
		in{}, &engine.ChildOpts{WorkflowID: ctx.WorkflowID() + "-kid"})
}, nil)

// runs list filters as GET /v1/runs and the web UI do: by workflow ID
// prefix and top-level runs only (children left out), on the database and
// over --address; its table and --json show the runs' tags; cancel-matching
// takes --top-level too.
func TestRunsListFiltersMatchTheAPI(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	wfs := append(workflows(), family)
	addr, _ := serveInProcess(t, db, commands.Options{Workflows: wfs}, nil)
	onDB := func(args ...string) (int, string, string) {
		return cli(commands.Options{Workflows: wfs}, nil, append([]string{"--database-url", db.URL}, args...)...)
	}
	overAPI := func(args ...string) (int, string, string) {
		return cli(commands.Options{}, nil, append([]string{"--address", addr}, args...)...)
	}
	code, _, errOut := onDB("start", "family", "--id", "fam-1", "--input", `{}`, "--tag", "customer=c_42", "--tag", "region=eu")
	require.Equal(t, 0, code, errOut)
	code, _, errOut = onDB("start", "approval", "--id", "fam-solo", "--input", `{}`)
	require.Equal(t, 0, code, errOut)
	code, _, errOut = onDB("start", "approval", "--id", "other-1", "--input", `{}`)
	require.Equal(t, 0, code, errOut)
	for deadline := time.Now().Add(30 * time.Second); ; {
		_, out, _ := onDB("runs", "list", "--workflow-id-prefix", "fam-1-kid", "--json")
		if bytes.Contains([]byte(out), []byte(`"workflow_id":"fam-1-kid"`)) {
			break
		}
		require.True(t, time.Now().Before(deadline), "the child never started: %s", out)
		time.Sleep(50 * time.Millisecond)
	}
	ids := func(out string) []string {
		t.Helper()
		var page struct{ Runs []engine.Run }
		require.NoError(t, json.Unmarshal([]byte(out), &page), out)
		var got []string
		for _, r := range page.Runs {
			got = append(got, r.WorkflowID)
		}
		return got
	}
	for name, cmd := range map[string]func(...string) (int, string, string){"database": onDB, "address": overAPI} {
		code, out, errOut := cmd("runs", "list", "--workflow-id-prefix", "fam-", "--json")
		require.Equal(t, 0, code, errOut)
		require.ElementsMatch(t, []string{"fam-1", "fam-1-kid", "fam-solo"}, ids(out), name)
		code, out, errOut = cmd("runs", "list", "--workflow-id-prefix", "fam-", "--top-level", "--json")
		require.Equal(t, 0, code, errOut)
		require.ElementsMatch(t, []string{"fam-1", "fam-solo"}, ids(out), name+": the child is left out")
		require.Contains(t, out, `"tags":{"customer":"c_42","region":"eu"}`, name)
		code, out, errOut = cmd("runs", "list", "--workflow-id-prefix", "fam-", "--unpatched", "fraud-check", "--json")
		require.Equal(t, 0, code, errOut)
		require.ElementsMatch(t, []string{"fam-1", "fam-1-kid", "fam-solo"}, ids(out), name+": no run took the change")
		code, out, errOut = cmd("runs", "list", "--workflow-id-prefix", "fam-", "--patched", "fraud-check", "--json")
		require.Equal(t, 0, code, errOut)
		require.Empty(t, ids(out), name)
		code, out, errOut = cmd("runs", "list", "--workflow-id-prefix", "fam-", "--workflow-version", "1", "--json")
		require.Equal(t, 0, code, errOut)
		require.ElementsMatch(t, []string{"fam-1", "fam-1-kid", "fam-solo"}, ids(out), name+": all on version 1")
		code, out, errOut = cmd("runs", "list", "--workflow-id-prefix", "fam-", "--workflow-version", "1", "--status", "open", "--json")
		require.Equal(t, 0, code, errOut)
		require.ElementsMatch(t, []string{"fam-1", "fam-1-kid", "fam-solo"}, ids(out), name+": all open")
		code, out, errOut = cmd("runs", "list", "--workflow-id-prefix", "fam-", "--workflow-version", "2", "--json")
		require.Equal(t, 0, code, errOut)
		require.Empty(t, ids(out), name)
		code, out, errOut = cmd("runs", "cancel-matching", "--workflow-id-prefix", "fam-", "--workflow-version", "2", "--dry-run")
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "0", name)
		// A run's history, for replay tests.
		code, out, errOut = cmd("runs", "export", "fam-solo")
		require.Equal(t, 0, code, errOut)
		var h engine.History
		require.NoError(t, json.Unmarshal([]byte(out), &h), out)
		require.Equal(t, engine.HistoryFormat, h.Format, name)
		require.Equal(t, "fam-solo", h.WorkflowID, name)
		require.Equal(t, "approval", h.Workflow, name)
		require.NotEmpty(t, h.Input, name)
		code, _, errOut = cmd("runs", "export", "no-such-run")
		require.Equal(t, 1, code, errOut)
		file := filepath.Join(t.TempDir(), "fam-solo.json")
		code, _, errOut = cmd("runs", "export", "fam-solo", "-o", file)
		require.Equal(t, 0, code, errOut)
		require.Contains(t, errOut, "wrote the history of run")
		written, err := os.ReadFile(file)
		require.NoError(t, err)
		require.JSONEq(t, out, string(written), name)
		code, out, errOut = cmd("runs", "list", "--workflow", "approval", "--top-level")
		require.Equal(t, 0, code, errOut)
		require.NotContains(t, out, "fam-1-kid", name)
		require.Contains(t, out, "fam-solo", name)
		code, out, errOut = cmd("runs", "list", "--workflow-id-prefix", "fam-1")
		require.Equal(t, 0, code, errOut)
		require.Regexp(t, `RUN ID +WORKFLOW +VERSION +WORKFLOW ID +STATUS +TAGS +DELIVERIES +CREATED +ERROR`, out, name)
		require.Regexp(t, `family +1 +fam-1 +waiting +customer=c_42 region=eu +\d+ `, out, name)
		require.Regexp(t, `approval +1 +fam-1-kid +\S+ +- +\d+ `, out, name+": no tags is -")
		code, out, errOut = cmd("runs", "cancel-matching", "--workflow-id-prefix", "fam-", "--top-level", "--dry-run")
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "2 runs match (dry run: nothing cancelled)", name)
	}
}

// runs prune without --older-than prunes for the retention serve resolves
// without flags: ENGINE_RETENTION, else Options.Config.Retention, else 7
// days; a retention of forever needs --older-than.
func TestRunsPruneDefaultsToTheRetention(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	insertEnded(t, db, "ended-2d", 2*24*time.Hour)
	insertEnded(t, db, "ended-8d", 8*24*time.Hour)
	prune := func(cfg *engine.Config, env map[string]string, args ...string) (int, string, string) {
		return cli(commands.Options{Workflows: workflows(), Config: cfg}, env, append([]string{"--database-url", db.URL, "runs", "prune", "--dry-run"}, args...)...)
	}
	code, out, errOut := prune(nil, nil)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "would delete 1 runs (0 steps, 0 signals, 0 dead jobs) and 0 schedule fires that ended over 168h0m0s ago (the retention: the engine's default)")
	code, out, errOut = prune(&engine.Config{Retention: 36 * time.Hour}, nil)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "would delete 2 runs (0 steps, 0 signals, 0 dead jobs) and 0 schedule fires that ended over 36h0m0s ago (the retention: this binary's Options.Config)")
	code, out, errOut = prune(&engine.Config{Retention: 36 * time.Hour}, map[string]string{"ENGINE_RETENTION": "200h"})
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "would delete 0 runs (0 steps, 0 signals, 0 dead jobs) and 0 schedule fires that ended over 200h0m0s ago (the retention: ENGINE_RETENTION)")
	code, out, errOut = prune(nil, map[string]string{"ENGINE_RETENTION": "200h"}, "--older-than", "24h")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "would delete 2 runs (0 steps, 0 signals, 0 dead jobs) and 0 schedule fires that ended over 24h0m0s ago\n", "--older-than wins")
	code, _, errOut = prune(nil, map[string]string{"ENGINE_RETENTION": "forever"})
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "the retention is forever (ENGINE_RETENTION): give --older-than, such as 720h")
	code, _, errOut = prune(nil, map[string]string{"ENGINE_RETENTION": "7 days"})
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `ENGINE_RETENTION: "7 days" is neither a duration above 0`)
	code, _, errOut = prune(nil, nil, "--older-than", "1ns")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--older-than 1ns is below the 1m0s minimum")

	addr, _ := serveInProcess(t, db, commands.Options{Workflows: workflows(), Config: &engine.Config{Retention: -1}}, nil)
	code, out, errOut = cli(commands.Options{Config: &engine.Config{Retention: 36 * time.Hour}}, nil, "--address", addr, "runs", "prune", "--dry-run")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "would delete 2 runs", "over --address too")
	code, out, errOut = prune(nil, nil)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "would delete 1 runs", "a dry run deleted nothing")
}

// runs show lists each step's failed attempts, as the web UI's attempt
// history does.
func TestRunsShowFailedAttempts(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	e := enginetest.NewEngine(t, db, nil, true, workflows()...)
	res, err := e.StartJSON(context.Background(), "double", []byte(`{"n": -1}`), &engine.StartOpts{WorkflowID: "neg-1"})
	require.NoError(t, err)
	for deadline := time.Now().Add(30 * time.Second); ; {
		run, err := e.GetRun(context.Background(), res.RunID)
		require.NoError(t, err)
		if run.Status == engine.StatusDead {
			break
		}
		require.True(t, time.Now().Before(deadline), "the run never parked")
		time.Sleep(20 * time.Millisecond)
	}
	code, out, errOut := run(t, db, "runs", "show", "neg-1")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `FAILED ATTEMPT OF STEP +NAME +ATTEMPT +OUTCOME +RECORDED +ERROR`, out)
	require.Regexp(t, `\n0 +double +1 +retrying +\d{4}-\d\d-\d\dT\S+ +transient: negative: upstream refused\n`, out)
	require.Regexp(t, `\n0 +double +2 +parked +\S+ +transient: retries exhausted after 2 attempts: negative: upstream refused\n`, out)
}

// dead replay --version moves the dead job's run to another version of its
// workflow before it runs again, on the database and over --address, where
// a live process registers that version; it refuses one none does, and a
// second replay that asks for another version.
func TestDeadReplayOntoAVersion(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	wfs := workflows()
	addr, _ := serveInProcess(t, db, commands.Options{Workflows: wfs}, nil)
	// The fix, deployed: a process that registers double v2.
	enginetest.NewEngine(t, db, nil, true, engine.Define("double", func(ctx *engine.Context, n in) (int, error) {
		return engine.Step(ctx, "double", func(context.Context) (int, error) { return 2 * -n.N, nil }, nil)
	}, &engine.WorkflowOpts{Version: 2}))
	onDB := func(args ...string) (int, string, string) {
		return cli(commands.Options{Workflows: wfs}, nil, append([]string{"--database-url", db.URL}, args...)...)
	}
	overAPI := func(args ...string) (int, string, string) {
		return cli(commands.Options{}, nil, append([]string{"--address", addr}, args...)...)
	}
	for name, cmd := range map[string]func(...string) (int, string, string){"database": onDB, "address": overAPI} {
		id := "refused-" + name
		code, _, errOut := onDB("start", "double", "--id", id, "--input", `{"n": -1}`)
		require.Equal(t, 0, code, errOut)
		var jobID string
		for deadline := time.Now().Add(30 * time.Second); jobID == ""; {
			_, out, _ := onDB("dead", "list", "--workflow", "double", "--open", "--json")
			var page struct {
				DeadJobs []struct {
					ID         string `json:"id"`
					WorkflowID string `json:"workflow_id"`
				} `json:"dead_jobs"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &page), out)
			for _, j := range page.DeadJobs {
				if j.WorkflowID == id {
					jobID = j.ID
				}
			}
			require.True(t, time.Now().Before(deadline), "the run never died: %s", out)
			time.Sleep(50 * time.Millisecond)
		}
		code, _, errOut = cmd("dead", "replay", jobID, "--version", "0")
		require.Equal(t, 2, code, name)
		require.Contains(t, errOut, "--version: 0 is not a workflow version (1 or more)", name)
		code, _, errOut = cmd("dead", "replay", jobID, "--version", "9")
		require.Equal(t, 1, code, name)
		require.Contains(t, errOut, `no live engine process on queue "pgdurable" registers workflow "double" version 9 (they register [1 2])`, name)
		code, out, errOut := cmd("dead", "replay", jobID, "--version", "2", "--note", "onto the fix", "--json")
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, `"note":"replayed onto version 2 (was 1). onto the fix"`, name)
		for deadline := time.Now().Add(30 * time.Second); ; {
			_, out, _ = cmd("runs", "show", id, "--json")
			if strings.Contains(out, `"status":"completed"`) {
				break
			}
			require.True(t, time.Now().Before(deadline), "%s: the run never completed on v2: %s", name, out)
			time.Sleep(50 * time.Millisecond)
		}
		require.Contains(t, out, `"workflow_version":2`, name)
		require.Contains(t, out, `"output":2`, name)
		code, _, errOut = cmd("dead", "replay", jobID, "--version", "1")
		require.Equal(t, 1, code, name)
		require.Contains(t, errOut, "was replayed already, and its run is on version 2: a replay does not move it again", name)
		code, _, errOut = cmd("dead", "replay", jobID, "--version", "2")
		require.Equal(t, 0, code, "%s: the same replay again changes nothing: %s", name, errOut)
	}
}
