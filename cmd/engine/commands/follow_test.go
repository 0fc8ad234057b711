package commands_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/cmd/engine/commands"
	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// start --wait and runs show --follow over --address wait for a server
// that has not answered yet, as they do for one that stops answering
// after its first answer: started before the server is up, they end with
// the run's outcome once it comes up.
func TestWaitAndFollowWaitForAServerNotUpYet(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	client := enginetest.NewEngine(t, db, nil, false, workflows()...)
	_, err := client.StartJSON(context.Background(), "double", []byte(`{"n": 5}`), &engine.StartOpts{WorkflowID: "early-1"})
	require.NoError(t, err)
	addr := freePort(t)
	type result struct {
		code        int
		out, errOut string
	}
	over := func(args ...string) chan result {
		done := make(chan result, 1)
		go func() {
			code, out, errOut := cli(commands.Options{}, nil, append([]string{"--address", addr}, args...)...)
			done <- result{code, out, errOut}
		}()
		return done
	}
	wait := over("start", "double", "--input", `{"n": 21}`, "--wait")
	withID := over("start", "double", "--id", "late-1", "--input", `{"n": 4}`, "--wait")
	follow := over("runs", "show", "early-1", "--follow")
	time.Sleep(3 * time.Second) // the server comes up later
	serveOn(t, addr, db, commands.Options{Workflows: workflows()}, nil)
	for name, c := range map[string]struct {
		done chan result
		want string
	}{
		"start --wait":       {wait, "completed: output 42"},
		"start --id --wait":  {withID, "completed: output 8"},
		"runs show --follow": {follow, "completed: output 10"},
	} {
		select {
		case r := <-c.done:
			require.Equal(t, 0, r.code, "%s: %s %s", name, r.out, r.errOut)
			require.Contains(t, r.out, c.want, name)
			require.Contains(t, r.errOut, "no answer from the engine at http://"+addr, name)
			require.Contains(t, r.errOut, "retrying for 1m0s", name)
			require.Contains(t, r.errOut, "the engine answers", name)
		case <-time.After(60 * time.Second):
			t.Fatalf("%s never ended", name)
		}
	}
	runs, _, err := client.ListRuns(context.Background(), engine.ListRunsParams{Workflow: "double"})
	require.NoError(t, err)
	require.Len(t, runs, 3, "each start made one run")
}
