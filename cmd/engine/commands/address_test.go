package commands_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// The CLI follows no redirect over --address: Go's client resends the
// Authorization header to another port of the same host (and from https
// to http on the same name), so a server answering 307 elsewhere would
// collect the API token (found by an attack pass). A redirect is an error
// naming the status and the Location, never the token, and nothing
// reaches the other server.
func TestCLIFollowsNoRedirectWithItsToken(t *testing.T) {
	t.Parallel()
	const token = "redirect-test-token-0123456789"
	runID := uuid.New()
	var reached, withToken atomic.Int64
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		if r.Header.Get("Authorization") != "" {
			withToken.Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/runs" {
			_, _ = w.Write([]byte(`{"runs": []}`))
			return
		}
		fmt.Fprintf(w, `{"run_id": %q, "workflow": "double", "workflow_id": "r-1", "status": "terminated"}`, runID)
	}))
	t.Cleanup(elsewhere.Close)
	for _, status := range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect, http.StatusFound} {
		// It answers a run's GET itself, so that cancel and terminate send
		// their POST, and redirects the rest.
		redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && r.URL.Path == "/v1/runs/r-1" {
				fmt.Fprintf(w, `{"run_id": %q, "workflow": "double", "workflow_id": "r-1", "status": "waiting"}`, runID)
				return
			}
			http.Redirect(w, r, elsewhere.URL+r.URL.RequestURI(), status)
		}))
		t.Cleanup(redirector.Close)
		for _, c := range []struct {
			args     []string
			request  string
			location string
		}{
			{[]string{"runs", "list"}, "GET /v1/runs", elsewhere.URL + "/v1/runs?limit=50"},
			{[]string{"cancel", "r-1"}, "POST /v1/runs/" + runID.String() + "/cancel", elsewhere.URL + "/v1/runs/" + runID.String() + "/cancel"},
			{[]string{"terminate", "r-1", "--reason", "test"}, "POST /v1/runs/" + runID.String() + "/terminate",
				elsewhere.URL + "/v1/runs/" + runID.String() + "/terminate"},
		} {
			args := c.args
			code, out, errOut := overHTTP(t, redirector.URL, token, args...)
			require.Equal(t, 1, code, "%d %v: %s%s", status, args, out, errOut)
			require.Contains(t, errOut, fmt.Sprintf("answered %d %s (Location %q) to %s", status, http.StatusText(status), c.location, c.request), args)
			require.Contains(t, errOut, "follows no redirect")
			require.NotContains(t, out+errOut, token)

			code, out, _ = overHTTP(t, redirector.URL, token, append([]string{"--json"}, args...)...)
			require.Equal(t, 1, code)
			require.Contains(t, out, `"code":"redirect"`)
			require.NotContains(t, out, token)
		}
	}
	require.Zero(t, withToken.Load(), "the token went to the server the redirect named")
	require.Zero(t, reached.Load(), "a request followed the redirect")
}

// hostile is text a server controls, with what a terminal obeys: an erase
// of the screen, a window title, a bell, a raw newline that forges a line
// of output, and a bidi override that reverses what follows it.
const hostile = "x\x1b[2J\x1b]0;owned\x07\nforged: line\u202eevil"

// fakeEngine answers the API's routes the CLI calls with hostile text in
// every string the CLI prints: cursors, statuses, kinds, reasons, IDs and
// error messages (the server may be a compromised or impersonated one).
func fakeEngine(t *testing.T) *httptest.Server {
	t.Helper()
	runID, shownID, parentID, jobID := uuid.New(), uuid.New(), uuid.New(), uuid.New()
	js := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	run := func(id uuid.UUID, status string) string {
		return fmt.Sprintf(`{"run_id": %q, "workflow": "double", "workflow_id": "w-1", "status": %s, "deliveries": 1,
			"created_at": "2026-12-01T00:00:00Z", "input": {"n": 1},
			"error": {"class": %s, "message": %s},
			"parent_run_id": %q, "parent_seq": 2, "parent_close_policy": %s,
			"steps": [{"seq": 0, "name": "charge", "kind": %s, "status": %s, "attempts": 1, "started_at": "2026-12-01T00:00:00Z",
				"error": {"class": %s, "message": %s}}]}`,
			id, js(status), js("class"+hostile), js(hostile), parentID, js(hostile), js("activity"+hostile), js("started"+hostile),
			js(hostile), js(hostile))
	}
	apiError := func(w http.ResponseWriter, status int) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"error": {"code": "not_found", "message": %s}}`, js("not found: "+hostile))
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/runs", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"runs": [%s], "next_cursor": %s}`, run(runID, "running"+hostile), js(hostile))
	})
	shown := func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(run(shownID, "completed"+hostile)))
	}
	mux.HandleFunc("GET /v1/runs/shown", shown)
	mux.HandleFunc("GET /v1/runs/"+shownID.String(), shown)
	ended := func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(run(runID, "failed"))) }
	mux.HandleFunc("GET /v1/runs/ended", ended)
	mux.HandleFunc("GET /v1/runs/"+runID.String(), ended)
	mux.HandleFunc("GET /v1/runs/missing", func(w http.ResponseWriter, r *http.Request) { apiError(w, http.StatusNotFound) })
	mux.HandleFunc("POST /v1/runs/{id}/cancel", func(w http.ResponseWriter, r *http.Request) { apiError(w, http.StatusConflict) })
	mux.HandleFunc("GET /v1/runs/garbled", func(w http.ResponseWriter, r *http.Request) {
		// Not the API's error shape, and a reason phrase of its own.
		conn, buf, err := w.(http.Hijacker).Hijack()
		require.NoError(t, err)
		defer conn.Close()
		_, _ = buf.WriteString("HTTP/1.1 502 Bad\x1b[2J Gateway\u202e\r\nContent-Length: 5\r\nConnection: close\r\n\r\noops\n")
		_ = buf.Flush()
	})
	mux.HandleFunc("POST /v1/workflows/double/runs", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"run_id": %q, "workflow": "double", "workflow_id": %s, "status": %s}`, runID, js("w"+hostile), js("pending"+hostile))
	})
	mux.HandleFunc("POST /v1/schedules/nightly/trigger", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"run_id": %q, "workflow_id": %s, "status": "pending"}`, runID, js("schedule:"+hostile))
	})
	deadJob := fmt.Sprintf(`{"id": %q, "run_id": %q, "workflow": "double", "workflow_id": "w-1", "reason": %s, "attempts": 3,
		"error_class": "transient", "error_message": %s, "resolution": %s, "resolved_by": "ann", "note": %s,
		"first_failed_at": "2026-12-01T00:00:00Z", "last_failed_at": "2026-12-01T00:00:00Z", "parked_at": "2026-12-01T00:00:00Z"}`,
		jobID, runID, js("panic"+hostile), js(hostile), js("discarded"+hostile), js(hostile))
	mux.HandleFunc("GET /v1/dead-jobs", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"dead_jobs": [%s], "next_cursor": %s}`, deadJob, js(hostile))
	})
	mux.HandleFunc("GET /v1/dead-jobs/{id}", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(deadJob)) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// Whatever a server sends, the CLI prints nothing a terminal obeys: no
// escape, no raw newline inside a value (a forged line), no bidi control;
// it shows them escaped. Tables, `runs show`, a follow, the "more:
// --cursor" line and the error messages built from API error bodies
// (found by an attack pass: next_cursor and error texts were printed raw).
func TestCLIEscapesWhatTheServerSends(t *testing.T) {
	t.Parallel()
	srv := fakeEngine(t)
	var dead struct {
		DeadJobs []struct {
			ID string `json:"id"`
		} `json:"dead_jobs"`
	}
	_, out, _ := overHTTP(t, srv.URL, "", "dead", "list", "--json")
	require.NoError(t, json.Unmarshal([]byte(out), &dead), out)
	for _, c := range []struct {
		args []string
		code int
		want string // shown escaped
	}{
		{[]string{"runs", "list"}, 0, `more: --cursor x\x1b[2J\x1b]0;owned\a\nforged: line\u202eevil`},
		{[]string{"runs", "show", "shown"}, 0, `completedx\x1b[2J`},
		{[]string{"runs", "show", "ended", "--follow"}, 1, `ended failed: classx\x1b[2J`},
		{[]string{"start", "double", "--input", `{"n": 1}`}, 0, `status pendingx\x1b[2J`},
		{[]string{"schedules", "trigger", "nightly"}, 0, `(workflow ID schedule:x\x1b[2J`},
		{[]string{"dead", "list"}, 0, `more: --cursor x\x1b[2J`},
		{[]string{"dead", "show", dead.DeadJobs[0].ID}, 0, `reason       panicx\x1b[2J`},
		{[]string{"runs", "show", "missing"}, 1, `error: not found: x\x1b[2J\x1b]0;owned\a\nforged: line\u202eevil`},
		{[]string{"cancel", "shown"}, 1, `error: not found: x\x1b[2J`},
		{[]string{"runs", "show", "garbled"}, 1, `answered 502 Bad Gateway to GET /v1/runs/garbled`},
	} {
		code, out, errOut := overHTTP(t, srv.URL, "", c.args...)
		all := out + errOut
		require.Equal(t, c.code, code, "%v: %s", c.args, all)
		require.Contains(t, all, c.want, c.args)
		for _, raw := range []string{"\x1b", "\x07", "\u202e", "Bad\x1b"} {
			require.NotContains(t, all, raw, "%v: %q", c.args, all)
		}
		lines := bufio.NewScanner(strings.NewReader(all))
		for lines.Scan() {
			require.False(t, strings.HasPrefix(strings.TrimSpace(lines.Text()), "forged"), "%v: a forged line: %q", c.args, all)
		}
	}
	// --json keeps the server's text (JSON escapes its controls) with the
	// bidi controls escaped too.
	code, out, _ := overHTTP(t, srv.URL, "", "runs", "list", "--json")
	require.Equal(t, 0, code)
	require.Contains(t, out, `\u202eevil`)
	require.NotContains(t, out, "\u202e")
	require.NotContains(t, out, "\x1b")
	code, out, _ = overHTTP(t, srv.URL, "", "runs", "show", "missing", "--json")
	require.Equal(t, 1, code)
	require.NotContains(t, out, "\u202e")
	require.NotContains(t, out, "\x1b")
}

// terminate, and runs show on the terminated run, list the steps that were
// in flight when it was terminated (recorded started) with their request
// IDs: each may have taken effect, and nothing undoes it.
func TestTerminateShowsTheStepsInFlight(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	inCall, release := make(chan struct{}), make(chan struct{})
	wf := engine.Define("charge-hang", func(ctx *engine.Context, _ in) (string, error) {
		return engine.RunActivity(ctx, "charge", func(context.Context, *engine.ActivityAttempt) (string, error) {
			close(inCall)
			<-release
			return "ch_1", nil
		}, nil)
	}, nil)
	e := enginetest.NewEngine(t, db, nil, true, append(workflows(), wf)...)
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // before the engine stops
	ctx := context.Background()
	_, err := e.StartJSON(ctx, "charge-hang", []byte(`{}`), &engine.StartOpts{WorkflowID: "hang-1"})
	require.NoError(t, err)
	<-inCall
	id, err := e.FindRun(ctx, "hang-1")
	require.NoError(t, err)
	before, err := e.GetRun(ctx, id)
	require.NoError(t, err)
	require.Len(t, before.Steps, 1)
	requestID := before.Steps[0].RequestID.String()

	code, out, errOut := run(t, db, "terminate", "hang-1", "--reason", "stuck", "--by", "ann")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "run "+id.String()+": terminated")
	require.Contains(t, out, "warning: terminated with 1 step(s) in flight")
	require.Regexp(t, `\n0\s+charge\s+activity\s+`+requestID, out)
	free()
	code, out, errOut = run(t, db, "runs", "show", "hang-1")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "status       terminated")
	require.Contains(t, out, "check each with the service it called, by its request ID")
	require.Regexp(t, `\n0\s+charge\s+activity\s+`+requestID, out)

	code, _, errOut = run(t, db, "start", "approval", "--id", "quiet-1", "--input", `{}`)
	require.Equal(t, 0, code, errOut)
	code, out, errOut = run(t, db, "terminate", "quiet-1", "--reason", "not needed")
	require.Equal(t, 0, code, errOut)
	require.NotContains(t, out, "in flight", "nothing was in flight")

	code, _, errOut = run(t, db, "terminate", "quiet-1", "--reason", "two\nlines")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "line break")
}
