package commands_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
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

// runs show --follow over --address reads only what may have changed: a
// run that holds a megabyte of signals costs about one full read (at its
// end), not one per poll (ten followers took a server to 600 MB: found by
// an attack pass).
func TestFollowReadsOnlyWhatChanged(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	addr, _ := serveInProcess(t, db, commands.Options{Workflows: workflows()}, nil)
	client := enginetest.NewEngine(t, db, nil, false, workflows()...)
	ctx := context.Background()
	_, err := client.StartJSON(ctx, "approval", []byte(`{}`), &engine.StartOpts{WorkflowID: "big-follow"})
	require.NoError(t, err)
	noise := `"` + strings.Repeat("x", 16<<10) + `"`
	for range 60 {
		require.NoError(t, client.SignalJSON(ctx, "big-follow", "noise", []byte(noise), nil))
	}
	full, err := http.Get("http://" + addr + "/v1/runs/big-follow")
	require.NoError(t, err)
	fullRun, err := io.ReadAll(full.Body)
	full.Body.Close()
	require.NoError(t, err)
	require.Greater(t, len(fullRun), 60*16<<10, "the whole run holds the signals")

	var read atomic.Int64 // bytes of run views the follower read
	target, err := url.Parse("http://" + addr)
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(r *http.Response) error {
		if strings.HasPrefix(r.Request.URL.Path, "/v1/runs/") {
			body, err := io.ReadAll(r.Body)
			r.Body.Close()
			if err != nil {
				return err
			}
			read.Add(int64(len(body)))
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		return nil
	}
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)

	done := make(chan string, 1)
	go func() {
		code, out, errOut := cli(commands.Options{}, nil, "--address", srv.URL, "runs", "show", "big-follow", "--follow")
		done <- fmt.Sprint(code, out, errOut)
	}()
	time.Sleep(3 * time.Second) // about a dozen polls at 200 ms, fewer with the back-off
	require.NoError(t, client.SignalJSON(ctx, "big-follow", "approve", []byte(`{"by": "ann"}`), nil))
	select {
	case out := <-done:
		require.Contains(t, out, "completed")
	case <-time.After(30 * time.Second):
		t.Fatal("the follow never ended")
	}
	require.Less(t, read.Load(), int64(2*len(fullRun)), "about one full read of the run, at its end")
}
