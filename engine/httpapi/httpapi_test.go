package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/engine/httpapi"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type order struct {
	OrderID string `json:"order_id"`
	Amount  int    `json:"amount"`
}

type bundle struct {
	srv *httptest.Server
	e   *engine.Engine
	db  *enginetest.DB
}

func setup(t *testing.T, opts *httpapi.Options) *bundle {
	t.Helper()
	wf := engine.Define("payment", func(ctx *engine.Context, o order) (string, error) {
		return engine.Step(ctx, "charge", func(sctx context.Context) (string, error) {
			if o.Amount < 0 {
				return "", engine.Permanent(errors.New("negative amount"))
			}
			if o.Amount == 13 {
				return "", errors.New("gateway down") // retried, then dead
			}
			if o.Amount == 7 {
				<-sctx.Done() // runs until cancelled
				return "", sctx.Err()
			}
			return "ch_" + o.OrderID, nil
		}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: time.Millisecond, MaximumAttempts: 2}})
	}, nil)
	approval := engine.Define("approval", func(ctx *engine.Context, _ order) (string, error) {
		a, err := engine.AwaitSignal[struct {
			By string `json:"by"`
		}](ctx, "approve", 0)
		return a.By, err
	}, nil)
	// approvals waits for an approval as a child run.
	approvals := engine.Define("approvals", func(ctx *engine.Context, o order) (string, error) {
		return engine.ChildWorkflow(ctx, approval, o, nil)
	}, nil)
	db := enginetest.NewDB(t)
	e := enginetest.NewEngine(t, db, nil, true, wf, approval, approvals)
	if opts == nil {
		opts = &httpapi.Options{}
	}
	opts.Pool = db.Pool
	srv := httptest.NewServer(checkedByOpenAPI(t, httpapi.New(e, opts)))
	t.Cleanup(srv.Close)
	return &bundle{srv: srv, e: e, db: db}
}

type reply struct {
	status int
	body   map[string]any
	raw    string
}

func (b *bundle) do(t *testing.T, method, path, body string, header ...string) reply {
	t.Helper()
	return b.doRaw(t, method, path, body, header...)
}

// doRaw sends a request: a JSON content type unless method is GET, then
// header's name/value pairs ("Host" sets the Host header, an empty value
// deletes the header).
func (b *bundle) doRaw(t *testing.T, method, path, body string, header ...string) reply {
	t.Helper()
	req, err := http.NewRequest(method, b.srv.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	if method != http.MethodGet {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		switch {
		case header[i] == "Host":
			req.Host = header[i+1]
		case header[i+1] == "":
			req.Header.Del(header[i])
		default:
			req.Header.Set(header[i], header[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	out := reply{status: resp.StatusCode, raw: string(raw)}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		require.NoError(t, json.Unmarshal(raw, &out.body), string(raw))
	}
	return out
}

func errCode(r reply) string {
	e, _ := r.body["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

func (b *bundle) waitStatus(t *testing.T, runID, status string) reply {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := b.do(t, "GET", "/v1/runs/"+runID, "")
		require.Equal(t, http.StatusOK, r.status)
		if r.body["status"] == status {
			return r
		}
		require.True(t, time.Now().Before(deadline), "run %s is %v, want %s", runID, r.body["status"], status)
		time.Sleep(20 * time.Millisecond)
	}
}

func TestStartAndReadRuns(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, "POST", "/v1/workflows/payment/runs", `{"id": "ord_1", "input": {"order_id": "ord_1", "amount": 4999}}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	runID := r.body["run_id"].(string)
	require.Equal(t, "ord_1", r.body["workflow_id"])
	require.Equal(t, false, r.body["existing"])

	again := b.do(t, "POST", "/v1/workflows/payment/runs", `{"id": "ord_1", "input": {"amount": 4999, "order_id": "ord_1"}}`)
	require.Equal(t, http.StatusOK, again.status, "same ID, same input (key order aside)")
	require.Equal(t, runID, again.body["run_id"])
	require.Equal(t, true, again.body["existing"])

	conflict := b.do(t, "POST", "/v1/workflows/payment/runs", `{"id": "ord_1", "input": {"order_id": "ord_1", "amount": 1}}`)
	require.Equal(t, http.StatusConflict, conflict.status)
	require.Equal(t, "workflow_id_conflict", errCode(conflict))

	run := b.waitStatus(t, runID, "completed")
	require.Equal(t, "ch_ord_1", run.body["output"])
	steps := run.body["steps"].([]any)
	require.Len(t, steps, 1)
	step := steps[0].(map[string]any)
	require.Equal(t, "charge", step["name"])
	require.EqualValues(t, 1, step["attempts"])
	require.Contains(t, step, "duration_ms")

	list := b.do(t, "GET", "/v1/runs?workflow=payment&status=completed&limit=10", "")
	require.Equal(t, http.StatusOK, list.status)
	require.Len(t, list.body["runs"].([]any), 1)
}

// A start's optional fields may be JSON null, as clients generated in
// other languages send them: null is the same as leaving the field out,
// and the OpenAPI document (which the test server checks every accepted
// body against) says so.
func TestStartTakesNullAsAnAbsentField(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, "POST", "/v1/workflows/payment/runs", `{"id": null, "input": {"order_id": "ord_n", "amount": 10},
		"start_at": null, "delay": null, "run_timeout": null, "tags": null}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	require.NotEmpty(t, r.body["workflow_id"], "a generated workflow ID, as without the field")
}

func TestStartErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, &httpapi.Options{MaxBodyBytes: 4096})
	for _, tc := range []struct {
		name, path, body string
		status           int
		code             string
	}{
		{"unknown workflow", "/v1/workflows/nope/runs", `{"input": {}}`, 404, "unknown_workflow"},
		{"invalid json", "/v1/workflows/payment/runs", `{"input": `, 400, "invalid_json"},
		{"unknown field", "/v1/workflows/payment/runs", `{"inputs": {}}`, 400, "invalid_json"},
		{"wrong type", "/v1/workflows/payment/runs", `{"input": {"amount": "ten"}}`, 400, "invalid_input"},
		{"trailing data", "/v1/workflows/payment/runs", `{"input": {}} {}`, 400, "invalid_json"},
		// Before, a null body started a new run (a generated ID) each time.
		{"null body", "/v1/workflows/payment/runs", ` null `, 400, "invalid_json"},
		{"null signal-with-start", "/v1/workflows/payment/signal-with-start", `null`, 400, "invalid_json"},
		{"NUL in input", "/v1/workflows/payment/runs", `{"input": {"order_id": "a\u0000"}}`, 400, "invalid_input"},
		{"long workflow ID", "/v1/workflows/payment/runs", fmt.Sprintf(`{"id": %q, "input": {}}`, strings.Repeat("x", 401)), 400, "invalid_input"},
		{"oversize body", "/v1/workflows/payment/runs", fmt.Sprintf(`{"input": {"order_id": %q}}`, strings.Repeat("x", 5000)), 413, "payload_too_large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := b.do(t, "POST", tc.path, tc.body)
			require.Equal(t, tc.status, r.status, r.raw)
			require.Equal(t, tc.code, errCode(r), r.raw)
			require.NotEmpty(t, r.body["error"].(map[string]any)["message"])
		})
	}
	runs := b.do(t, "GET", "/v1/runs", "")
	require.Empty(t, runs.body["runs"], "nothing was accepted, nothing was started")
}

// A start (or signal) whose body is not valid JSON says where it breaks:
// the byte offset encoding/json reports. Before, only what broke.
func TestStartSaysWhereTheBodyIsNotJSON(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, tc := range []struct {
		path, body, want string
	}{
		{"/v1/workflows/payment/runs", `{"id": "x", "input": {"order_id": "o", "amount": tru}}`,
			"invalid character '}' in literal true (expecting 'e') at byte offset 53"},
		{"/v1/workflows/payment/runs", `{"id": "x", "input": {"order_id": "o",}}`,
			"invalid character '}' looking for beginning of object key string at byte offset 39"},
		{"/v1/workflows/payment/runs", `{"id": "x", "input": `, "unexpected end of JSON input at byte offset 21"},
		{"/v1/workflows/approval/signal-with-start", `{"id": "x", "signal": "go" "payload": 1}`,
			"invalid character '\"' after object key:value pair at byte offset 28"},
		{"/v1/runs/x/signals/go", `{"by": ann}`, "signal payload is not valid JSON: invalid character 'a' looking for beginning of value at byte offset 8"},
	} {
		r := b.do(t, "POST", tc.path, tc.body)
		require.Equal(t, http.StatusBadRequest, r.status, r.raw)
		require.Contains(t, []string{"invalid_json", "invalid_input"}, errCode(r), r.raw)
		require.Contains(t, r.body["error"].(map[string]any)["message"], tc.want, tc.body)
	}
}

func TestRunRouteErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, tc := range []struct {
		method, path string
		status       int
		code         string
	}{
		{"GET", "/v1/runs/not-a-uuid", 404, "not_found"}, // a workflow ID no run has
		{"GET", "/v1/runs/" + "01a22c00-0000-7000-8000-000000000000", 404, "not_found"},
		{"GET", "/v1/runs?limit=abc", 400, "invalid_parameter"},
		{"GET", "/v1/runs?limit=5000", 400, "invalid_parameter"},
		{"GET", "/v1/runs?status=bogus", 400, "invalid_parameter"},
		{"GET", "/v1/runs?cursor=garbage", 400, "invalid_parameter"},
		{"POST", "/v1/runs/01a22c00-0000-7000-8000-000000000000/cancel", 404, "not_found"},
		{"POST", "/v1/runs/01a22c00-0000-7000-8000-000000000000/signals/approve", 404, "not_found"},
		{"GET", "/v1/dead-jobs?reason=bogus", 400, "invalid_parameter"},
		{"GET", "/v1/dead-jobs?open=maybe", 400, "invalid_parameter"},
		{"GET", "/v1/workflows/payment/runs", 405, "method_not_allowed"},
		{"GET", "/v1/dead-jobs/01a22c00-0000-7000-8000-000000000000", 404, "not_found"},
		{"POST", "/v1/dead-jobs/01a22c00-0000-7000-8000-000000000000/replay", 404, "not_found"},
		{"DELETE", "/v1/runs", 405, "method_not_allowed"},
		{"GET", "/v1/nothing/here", 404, "not_found"},
		{"GET", "/v2/anything", 404, "not_found"},
	} {
		r := b.do(t, tc.method, tc.path, "")
		require.Equal(t, tc.status, r.status, "%s %s: %s", tc.method, tc.path, r.raw)
		require.Equal(t, tc.code, errCode(r), "%s %s", tc.method, tc.path)
	}
}

func TestCancelAndDeadJobRoutes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	slow := b.do(t, "POST", "/v1/workflows/payment/runs", `{"input": {"order_id": "slow", "amount": 7}}`)
	require.Equal(t, http.StatusCreated, slow.status)
	slowID := slow.body["run_id"].(string)
	b.waitStatus(t, slowID, "running")
	c := b.do(t, "POST", "/v1/runs/"+slowID+"/cancel", "")
	require.Equal(t, http.StatusAccepted, c.status, c.raw)
	b.waitStatus(t, slowID, "cancelled")
	again := b.do(t, "POST", "/v1/runs/"+slowID+"/cancel", "")
	require.Equal(t, http.StatusAccepted, again.status, "a retried cancel is a no-op: %s", again.raw)
	require.Equal(t, "cancelled", again.body["status"])
	require.NotEmpty(t, again.body["cancel_requested_at"])
	done := b.do(t, "POST", "/v1/workflows/payment/runs", `{"input": {"order_id": "done", "amount": 1}}`)
	require.Equal(t, http.StatusCreated, done.status)
	b.waitStatus(t, done.body["run_id"].(string), "completed")
	closed := b.do(t, "POST", "/v1/runs/"+done.body["run_id"].(string)+"/cancel", "")
	require.Equal(t, http.StatusConflict, closed.status)
	require.Equal(t, "run_closed", errCode(closed))
	byWorkflowID := b.do(t, "POST", "/v1/workflows/payment/runs", `{"id": "ord-slow-2", "input": {"order_id": "slow-2", "amount": 7}}`)
	require.Equal(t, http.StatusCreated, byWorkflowID.status)
	c = b.do(t, "POST", "/v1/runs/ord-slow-2/cancel", "")
	require.Equal(t, http.StatusAccepted, c.status, "cancel takes a workflow ID: %s", c.raw)
	b.waitStatus(t, byWorkflowID.body["run_id"].(string), "cancelled")
	require.Equal(t, http.StatusNotFound, b.do(t, "POST", "/v1/runs/no-such-workflow-id/cancel", "").status)

	dead := b.do(t, "POST", "/v1/workflows/payment/runs", `{"input": {"order_id": "bad", "amount": 13}}`)
	deadID := dead.body["run_id"].(string)
	b.waitStatus(t, deadID, "dead")
	list := b.do(t, "GET", "/v1/dead-jobs?workflow=payment&reason=retries_exhausted", "")
	require.Equal(t, http.StatusOK, list.status)
	jobs := list.body["dead_jobs"].([]any)
	require.Len(t, jobs, 1)
	job := jobs[0].(map[string]any)
	require.Equal(t, deadID, job["run_id"])
	jobID := job["id"].(string)

	got := b.do(t, "GET", "/v1/dead-jobs/"+jobID, "")
	require.Equal(t, http.StatusOK, got.status)
	require.Equal(t, "charge", got.body["step"])
	require.Contains(t, got.body["error_message"], "gateway down")

	bad := b.do(t, "POST", "/v1/dead-jobs/"+jobID+"/replay", `{"who": "x"}`)
	require.Equal(t, http.StatusBadRequest, bad.status)
	bad = b.do(t, "POST", "/v1/dead-jobs/"+jobID+"/replay", `{"workflow_version": -1}`)
	require.Equal(t, http.StatusBadRequest, bad.status, bad.raw)
	require.Contains(t, bad.raw, "replay onto workflow version -1")
	bad = b.do(t, "POST", "/v1/dead-jobs/"+jobID+"/discard", `{"workflow_version": 2}`)
	require.Equal(t, http.StatusBadRequest, bad.status, bad.raw)
	require.Contains(t, bad.raw, "a version is for a replay")
	disc := b.do(t, "POST", "/v1/dead-jobs/"+jobID+"/discard", `{"by": "ops", "note": "test order"}`)
	require.Equal(t, http.StatusOK, disc.status, disc.raw)
	require.Equal(t, "discarded", disc.body["resolution"])
	require.Equal(t, "ops", disc.body["resolved_by"])
	replay := b.do(t, "POST", "/v1/dead-jobs/"+jobID+"/replay", "")
	require.Equal(t, http.StatusConflict, replay.status)
	require.Equal(t, "dead_job_resolved", errCode(replay))
}

// Replay and discard given a run's ID with no open dead job name the
// run's status (409), as cancel does; an unknown ID stays 404. Before,
// all of them were 404 "dead job not found".
func TestResolvingARunWithoutADeadJobOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	done := b.do(t, "POST", "/v1/workflows/payment/runs", `{"input": {"order_id": "done", "amount": 1}}`)
	require.Equal(t, http.StatusCreated, done.status)
	doneID := done.body["run_id"].(string)
	b.waitStatus(t, doneID, "completed")
	waiting := b.do(t, "POST", "/v1/workflows/approval/runs", `{"input": {"order_id": "w", "amount": 1}}`)
	require.Equal(t, http.StatusCreated, waiting.status)
	waitingID := waiting.body["run_id"].(string)
	b.waitStatus(t, waitingID, "waiting")
	for _, action := range []string{"replay", "discard"} {
		r := b.do(t, "POST", "/v1/dead-jobs/"+doneID+"/"+action, "")
		require.Equal(t, http.StatusConflict, r.status, r.raw)
		require.Equal(t, "run_closed", errCode(r))
		require.Contains(t, r.raw, "run "+doneID+" is completed and has no open dead job to "+action)
		r = b.do(t, "POST", "/v1/dead-jobs/"+waitingID+"/"+action, "")
		require.Equal(t, http.StatusConflict, r.status, r.raw)
		require.Equal(t, "run_not_finished", errCode(r))
		require.Contains(t, r.raw, "run "+waitingID+" is waiting and has no open dead job to "+action)
		r = b.do(t, "POST", "/v1/dead-jobs/"+uuid.NewString()+"/"+action, "")
		require.Equal(t, http.StatusNotFound, r.status, r.raw)
		require.Equal(t, "not_found", errCode(r))
	}
}

func TestBearerToken(t *testing.T) {
	t.Parallel()
	b := setup(t, &httpapi.Options{Token: "s3cret", Metrics: http.NotFoundHandler()})
	for _, auth := range []string{"", "Bearer wrong", "s3cret", "Basic s3cret"} {
		r := b.do(t, "GET", "/v1/runs", "", "Authorization", auth)
		require.Equal(t, http.StatusUnauthorized, r.status, "%q", auth)
		require.Equal(t, "unauthorized", errCode(r))
	}
	require.Equal(t, http.StatusUnauthorized, b.do(t, "GET", "/metrics", "").status)
	require.Equal(t, http.StatusOK, b.do(t, "GET", "/v1/runs", "", "Authorization", "Bearer s3cret").status)
	require.Equal(t, http.StatusOK, b.do(t, "GET", "/v1/runs", "", "Authorization", "bearer s3cret").status, "the scheme is case-insensitive")
	require.Equal(t, http.StatusUnauthorized, b.do(t, "GET", "/v1/runs", "", "Authorization", "Bearer S3CRET").status, "the token is not")
	require.Equal(t, http.StatusOK, b.do(t, "GET", "/healthz", "").status, "probes stay open")
	require.Equal(t, http.StatusOK, b.do(t, "GET", "/readyz", "").status)
}

func TestSignalRoute(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, "POST", "/v1/workflows/approval/runs", `{"id": "exp-1", "input": {"order_id": "o", "amount": 1}}`)
	require.Equal(t, 201, r.status, r.raw)
	runID := r.body["run_id"].(string)
	waitFor(t, func() bool { return b.do(t, "GET", "/v1/runs/"+runID, "").body["status"] == "waiting" })

	require.Equal(t, 400, b.do(t, "POST", "/v1/runs/"+runID+"/signals/approve", `{"by":`).status)
	require.Equal(t, 404, b.do(t, "POST", "/v1/runs/no-such-run/signals/approve", `{}`).status)
	r = b.do(t, "POST", "/v1/runs/exp-1/signals/approve", `{"by": "ann"}`) // by workflow ID
	require.Equal(t, 202, r.status, r.raw)
	waitFor(t, func() bool { return b.do(t, "GET", "/v1/runs/"+runID, "").body["status"] == "completed" })
	got := b.do(t, "GET", "/v1/runs/"+runID, "").body
	require.Equal(t, "ann", got["output"])
	require.Len(t, got["signals"], 1)
	require.Equal(t, "approve", got["signals"].([]any)[0].(map[string]any)["name"])

	r = b.do(t, "POST", "/v1/runs/"+runID+"/signals/approve", ``)
	require.Equal(t, 409, r.status, r.raw)
	require.Equal(t, "run_closed", r.body["error"].(map[string]any)["code"])
}

// A start with a delay or a start time waits; start-now starts it; a bad
// delay, both at once, or start-now on a run that finished are refused.
func TestDelayedStartRoutes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, "POST", "/v1/workflows/payment/runs", `{"id": "later-1", "input": {"order_id": "o1", "amount": 1}, "delay": "24h"}`)
	require.Equal(t, 201, r.status, r.raw)
	require.Equal(t, "waiting", r.body["status"])
	runID := r.body["run_id"].(string)
	r = b.do(t, "POST", "/v1/workflows/payment/runs", `{"id": "later-2", "input": {"order_id": "o2", "amount": 1}, "start_at": "2999-01-01T00:00:00Z"}`)
	require.Equal(t, 201, r.status, r.raw)
	require.Equal(t, "waiting", r.body["status"])
	got := b.do(t, "GET", "/v1/runs/later-2", "").body
	require.Equal(t, "2999-01-01T00:00:00Z", got["wake_at"])

	for _, body := range []string{
		`{"id": "bad-1", "input": {"order_id": "o", "amount": 1}, "delay": "tomorrow"}`,
		`{"id": "bad-2", "input": {"order_id": "o", "amount": 1}, "delay": "-5s"}`,
		`{"id": "bad-3", "input": {"order_id": "o", "amount": 1}, "delay": "5s", "start_at": "2999-01-01T00:00:00Z"}`,
	} {
		r = b.do(t, "POST", "/v1/workflows/payment/runs", body)
		require.Equal(t, 400, r.status, r.raw)
		require.Equal(t, "invalid_parameter", r.body["error"].(map[string]any)["code"], r.raw)
	}
	r = b.do(t, "POST", "/v1/workflows/payment/runs", `{"id": "bad-4", "input": {"order_id": "o", "amount": 1}, "start_at": "soon"}`)
	require.Equal(t, 400, r.status, r.raw)
	r = b.do(t, "POST", "/v1/workflows/payment/runs", `{"id": "bad-5", "input": {"order_id": "o", "amount": 1}, "run_timeout": "-1s"}`)
	require.Equal(t, 400, r.status, r.raw)
	r = b.do(t, "POST", "/v1/workflows/payment/runs", `{"id": "timed", "input": {"order_id": "o", "amount": 1}, "run_timeout": "1h"}`)
	require.Equal(t, 201, r.status, r.raw)
	waitFor(t, func() bool { return b.do(t, "GET", "/v1/runs/timed", "").body["status"] == "completed" })
	require.EqualValues(t, 3600000, b.do(t, "GET", "/v1/runs/timed", "").body["run_timeout_ms"])

	r = b.do(t, "POST", "/v1/runs/later-1/start-now", ``)
	require.Equal(t, 200, r.status, r.raw)
	waitFor(t, func() bool { return b.do(t, "GET", "/v1/runs/"+runID, "").body["status"] == "completed" })
	r = b.do(t, "POST", "/v1/runs/later-1/start-now", ``)
	require.Equal(t, 409, r.status, r.raw)
	require.Equal(t, "run_closed", r.body["error"].(map[string]any)["code"])
	require.Equal(t, 404, b.do(t, "POST", "/v1/runs/no-such-run/start-now", ``).status)
}

// signal-with-start starts the run the first time (201) and signals it
// either way (200 once it exists); it needs an ID and a signal name.
func TestSignalWithStartRoute(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	body := `{"id": "sws-1", "input": {"order_id": "o", "amount": 1}, "signal": "approve", "payload": {"by": "ann"}}`
	r := b.do(t, "POST", "/v1/workflows/approval/signal-with-start", body, "Idempotency-Key", "sws-k")
	require.Equal(t, 201, r.status, r.raw)
	runID := r.body["run_id"].(string)
	r = b.do(t, "POST", "/v1/workflows/approval/signal-with-start", body, "Idempotency-Key", "sws-k")
	require.Equal(t, 200, r.status, r.raw)
	require.Equal(t, runID, r.body["run_id"])
	waitFor(t, func() bool { return b.do(t, "GET", "/v1/runs/"+runID, "").body["status"] == "completed" })
	got := b.do(t, "GET", "/v1/runs/"+runID, "").body
	require.Equal(t, "ann", got["output"])
	require.Len(t, got["signals"], 1, "the keyed retry stored nothing")

	r = b.do(t, "POST", "/v1/workflows/approval/signal-with-start", `{"input": {"order_id": "o", "amount": 1}, "signal": "approve"}`)
	require.Equal(t, 400, r.status, r.raw)
	r = b.do(t, "POST", "/v1/workflows/approval/signal-with-start", `{"id": "sws-2", "input": {"order_id": "o", "amount": 1}}`)
	require.Equal(t, 400, r.status, r.raw)
	r = b.do(t, "POST", "/v1/workflows/nope/signal-with-start", `{"id": "sws-3", "signal": "approve"}`)
	require.Equal(t, 404, r.status, r.raw)
	r = b.do(t, "POST", "/v1/workflows/approval/signal-with-start", body)
	require.Equal(t, 409, r.status, r.raw)
	require.Equal(t, "run_closed", r.body["error"].(map[string]any)["code"])
}

// The Idempotency-Key header is the signal's key: a retried request is
// accepted and delivers the signal once, the key with another payload is
// 409 signal_key_conflict, and a key over 200 bytes is 400.
func TestSignalIdempotencyKeyHeader(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, "POST", "/v1/workflows/approval/runs", `{"id": "key-1", "input": {"order_id": "o", "amount": 1}}`)
	require.Equal(t, 201, r.status, r.raw)
	runID := r.body["run_id"].(string)
	for range 3 {
		r = b.do(t, "POST", "/v1/runs/key-1/signals/approve", `{"by": "ann"}`, "Idempotency-Key", "k-1")
		require.Equal(t, 202, r.status, r.raw)
	}
	r = b.do(t, "POST", "/v1/runs/key-1/signals/approve", `{"by": "eve"}`, "Idempotency-Key", "k-1")
	require.Equal(t, 409, r.status, r.raw)
	require.Equal(t, "signal_key_conflict", r.body["error"].(map[string]any)["code"])
	r = b.do(t, "POST", "/v1/runs/key-1/signals/approve", `{"by": "ann"}`, "Idempotency-Key", strings.Repeat("k", 201))
	require.Equal(t, 400, r.status, r.raw)
	waitFor(t, func() bool { return b.do(t, "GET", "/v1/runs/"+runID, "").body["status"] == "completed" })
	got := b.do(t, "GET", "/v1/runs/"+runID, "").body
	require.Len(t, got["signals"], 1)
	require.Equal(t, "k-1", got["signals"].([]any)[0].(map[string]any)["idempotency_key"])
	r = b.do(t, "POST", "/v1/runs/key-1/signals/approve", `{"by": "ann"}`, "Idempotency-Key", "k-1")
	require.Equal(t, 202, r.status, "a retry after the run finished is still the accepted signal: %s", r.raw)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "timed out")
		time.Sleep(20 * time.Millisecond)
	}
}

func TestScheduleRoutes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	body := `{"name": "nightly", "cron": "30 2 * * *", "time_zone": "America/New_York", "workflow": "payment",
		"input": {"order_id": "o", "amount": 1}, "catchup_window": "10m"}`
	r := b.do(t, "POST", "/v1/schedules", body)
	require.Equal(t, 201, r.status, r.raw)
	require.Equal(t, "10m0s", r.body["catchup_window"])
	require.Equal(t, "skip", r.body["overlap"])
	require.NotEmpty(t, r.body["next_fire_at"])
	require.Equal(t, 409, b.do(t, "POST", "/v1/schedules", body).status)

	for _, bad := range []struct {
		body string
		code int
	}{
		{`{"name": "x", "cron": "0 0 30 2 *", "workflow": "payment"}`, 400},
		{`{"name": "x", "cron": "@daily", "time_zone": "Nowhere/City", "workflow": "payment"}`, 400},
		{`{"name": "x", "cron": "@daily", "workflow": "nope"}`, 404},
		{`{"name": "x", "cron": "@daily", "workflow": "payment", "catchup_window": "soon"}`, 400},
		{`{"name": "x", "cron": "@daily", "workflow": "payment", "colour": "red"}`, 400},
		{`{"name": "x", "cron": `, 400},
	} {
		r := b.do(t, "POST", "/v1/schedules", bad.body)
		require.Equal(t, bad.code, r.status, bad.body+" → "+r.raw)
	}

	r = b.do(t, "PUT", "/v1/schedules/nightly", `{"cron": "@hourly", "workflow": "payment", "input": {"order_id": "o", "amount": 2}}`)
	require.Equal(t, 200, r.status, r.raw)
	require.Equal(t, "@hourly", r.body["cron"])
	require.Equal(t, "UTC", r.body["time_zone"])
	require.Equal(t, 404, b.do(t, "PUT", "/v1/schedules/absent", `{"cron": "@hourly", "workflow": "payment"}`).status)
	r = b.do(t, "POST", "/v1/schedules/nightly/pause", "")
	require.Equal(t, 200, r.status, r.raw)
	require.Equal(t, true, r.body["paused"])
	require.Equal(t, false, b.do(t, "POST", "/v1/schedules/nightly/resume", "").body["paused"])
	r = b.do(t, "GET", "/v1/schedules/nightly", "")
	require.Equal(t, 200, r.status)
	require.Contains(t, r.body, "fires")
	require.Empty(t, r.body["fires"])
	r = b.do(t, "POST", "/v1/schedules/nightly/trigger", "")
	require.Equal(t, 201, r.status, r.raw)
	require.Contains(t, r.body["workflow_id"], "schedule:nightly:trigger:")
	require.Len(t, b.do(t, "GET", "/v1/schedules/nightly", "").body["fires"], 1)
	require.Equal(t, 404, b.do(t, "POST", "/v1/schedules/absent/trigger", "").status)
	require.Len(t, b.do(t, "GET", "/v1/schedules", "").body["schedules"], 1)
	require.Equal(t, 204, b.do(t, "DELETE", "/v1/schedules/nightly", "").status)
	require.Equal(t, 404, b.do(t, "DELETE", "/v1/schedules/nightly", "").status)
	require.Equal(t, 405, b.do(t, "PATCH", "/v1/schedules/nightly", "").status)
	for _, path := range []string{"/v1/schedules/a%00b", "/v1/schedules/%FF"} { // found by an attack pass: was 500
		require.Equal(t, 404, b.do(t, "GET", path, "").status, path)
		require.Equal(t, 404, b.do(t, "DELETE", path, "").status, path)
	}
}

// The loopback API resists a browser: a state-changing request from
// another origin, or without a JSON content type (a form post, a no-cors
// fetch), is refused, and with no token a Host that is not this service's
// (DNS rebinding) is refused on every route.
func TestBrowserCannotDriveTheLoopbackAPI(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	start := `{"id": "csrf", "input": {"order_id": "csrf", "amount": 1}}`
	for _, tc := range []struct {
		name   string
		header []string
		status int
		code   string
	}{
		{"foreign origin", []string{"Origin", "https://evil.example"}, 403, "forbidden_origin"},
		{"null origin", []string{"Origin", "null"}, 403, "forbidden_origin"},
		{"form post", []string{"Content-Type", "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"},
		{"text/plain", []string{"Content-Type", "text/plain"}, 415, "unsupported_media_type"},
		{"no content type", []string{"Content-Type", ""}, 415, "unsupported_media_type"},
		{"rebound host", []string{"Host", "evil.example"}, 403, "forbidden_host"},
		{"rebound host with port", []string{"Host", "evil.example:8080"}, 403, "forbidden_host"},
	} {
		r := b.doRaw(t, "POST", "/v1/workflows/payment/runs", start, tc.header...)
		require.Equal(t, tc.status, r.status, "%s: %s", tc.name, r.raw)
		require.Equal(t, tc.code, errCode(r), tc.name)
	}
	r := b.doRaw(t, "GET", "/v1/runs", "", "Host", "evil.example")
	require.Equal(t, http.StatusForbidden, r.status, "reads through a rebound name are refused too")
	require.Equal(t, http.StatusNotFound, b.do(t, "GET", "/v1/runs/csrf", "").status, "nothing was started")

	same := b.do(t, "POST", "/v1/workflows/payment/runs", start, "Origin", b.srv.URL)
	require.Equal(t, http.StatusCreated, same.status, "the service's own origin is fine: %s", same.raw)
	for _, host := range []string{"localhost", "localhost:1234", "127.0.0.1", "[::1]:8080"} {
		require.Equal(t, http.StatusOK, b.doRaw(t, "GET", "/v1/runs", "", "Host", host).status, host)
	}

	// With a token, the token is the guard: any Host may call.
	tok := setup(t, &httpapi.Options{Token: "a-token-of-16-bytes-or-more"})
	require.Equal(t, http.StatusOK, tok.doRaw(t, "GET", "/v1/runs", "", "Host", "engine.internal", "Authorization", "Bearer a-token-of-16-bytes-or-more").status)
}

// Bad bytes anywhere a client puts them (path segments, query filters)
// answer 400 or 404 with the JSON error body, never 500; GET /v1/runs/{id}
// takes a workflow ID like the other run routes.
func TestBadBytesNeverAnswer500(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, "POST", "/v1/workflows/payment/runs", `{"id": "ord-by-id", "input": {"order_id": "x", "amount": 1}}`)
	require.Equal(t, http.StatusCreated, r.status)
	byID := b.do(t, "GET", "/v1/runs/ord-by-id", "")
	require.Equal(t, http.StatusOK, byID.status, byID.raw)
	require.Equal(t, r.body["run_id"], byID.body["run_id"])

	for _, bad := range []string{"%00", "a%00b", "%FF", "%C3%28", "%1B%5B31m", "%7F", "%E2%80%8F" + strings.Repeat("x", 500)} {
		for _, tc := range []struct{ method, path string }{
			{"GET", "/v1/runs/" + bad},
			{"POST", "/v1/runs/" + bad + "/cancel"},
			{"POST", "/v1/runs/" + bad + "/signals/approve"},
			{"POST", "/v1/runs/ord-by-id/signals/" + bad},
			{"GET", "/v1/runs?workflow=" + bad},
			{"GET", "/v1/runs?status=" + bad},
			{"GET", "/v1/runs?cursor=" + bad},
			{"GET", "/v1/dead-jobs?workflow=" + bad},
			{"GET", "/v1/dead-jobs?reason=" + bad},
			{"GET", "/v1/dead-jobs/" + bad},
			{"GET", "/v1/schedules/" + bad},
			{"POST", "/v1/workflows/" + bad + "/runs"},
		} {
			r := b.do(t, tc.method, tc.path, "{}")
			require.Contains(t, []int{400, 404, 409}, r.status, "%s %s: %s", tc.method, tc.path, r.raw)
			require.NotEmpty(t, errCode(r), "%s %s: %s", tc.method, tc.path, r.raw)
			require.NotContains(t, r.raw, "\u001b", "no raw escape is echoed")
		}
	}
	// A start whose workflow ID holds a control character is refused.
	esc := b.do(t, "POST", "/v1/workflows/payment/runs", `{"id": "ord\u001b[31m", "input": {"order_id": "x", "amount": 1}}`)
	require.Equal(t, http.StatusBadRequest, esc.status, esc.raw)
}

// A schedule's view lists its latest fires next to its own fields (found
// by a fresh-user pass: the schedule's MarshalJSON, promoted through an
// embedding struct, dropped them).
func TestScheduleViewListsItsFires(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, "POST", "/v1/schedules", `{"name": "tick", "cron": "@every 1s", "workflow": "payment", "input": {"order_id": "t", "amount": 1}, "overlap": "allow"}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	require.Eventually(t, func() bool {
		r = b.do(t, "GET", "/v1/schedules/tick", "")
		fires, _ := r.body["fires"].([]any)
		return len(fires) > 0
	}, 10*time.Second, 100*time.Millisecond, "a fire listed: %s", r.raw)
	require.Equal(t, "@every 1s", r.body["cron"], "and the schedule's own fields")
	fire := r.body["fires"].([]any)[0].(map[string]any)
	require.Equal(t, "started", fire["outcome"])
}

// Findings of an attack pass, each answered with the JSON error body: a
// malformed chunked body is 400, not 500; so are numbers PostgreSQL cannot
// store and control characters in an operator's note; paths with . or ..
// are 400, not a redirect; limit=0 is 400; answers are compact (a deeply
// nested value once made a 20 KB input a 200 MB answer) with C1 controls
// escaped; an Origin must be http or https.
func TestAttackPassFindings(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	addr := strings.TrimPrefix(b.srv.URL, "http://")
	raw := func(req string) string {
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer conn.Close()
		_, err = conn.Write([]byte(req))
		require.NoError(t, err)
		out, _ := io.ReadAll(conn)
		return string(out)
	}
	resp := raw("POST /v1/workflows/payment/runs HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\n" +
		"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")
	require.True(t, strings.HasPrefix(resp, "HTTP/1.1 400"), resp)
	require.Contains(t, resp, `"invalid_body"`)

	r := b.do(t, "POST", "/v1/workflows/payment/runs", `{"id": "big-num", "input": {"order_id": "x", "amount": 1, "extra": 1e999999}}`)
	require.Equal(t, http.StatusBadRequest, r.status, r.raw)
	r = b.do(t, "POST", "/v1/workflows/approval/runs", `{"id": "ap", "input": {}}`)
	require.Equal(t, http.StatusCreated, r.status)
	r = b.do(t, "POST", "/v1/runs/ap/signals/approve", `1e999999`)
	require.Equal(t, http.StatusBadRequest, r.status, r.raw)

	dead := b.do(t, "POST", "/v1/workflows/payment/runs", `{"input": {"order_id": "bad", "amount": 13}}`)
	require.Equal(t, http.StatusCreated, dead.status)
	b.waitStatus(t, dead.body["run_id"].(string), "dead")
	jobs := b.do(t, "GET", "/v1/dead-jobs", "").body["dead_jobs"].([]any)
	id := jobs[0].(map[string]any)["id"].(string)
	for _, body := range []string{`{"by": "a\u0000b"}`, `{"note": "x\u001b[31m"}`, `{"by": "` + strings.Repeat("x", 300) + `"}`} {
		r := b.do(t, "POST", "/v1/dead-jobs/"+id+"/discard", body)
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", body, r.raw)
	}

	for _, p := range []string{"/v1/runs/../cancel", "/v1//runs", "/v1/./runs"} {
		r := b.doRaw(t, "POST", p, "")
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", p, r.raw)
		require.Equal(t, "invalid_path", errCode(r))
	}
	require.Equal(t, http.StatusBadRequest, b.do(t, "GET", "/v1/runs?limit=0", "").status)
	require.Equal(t, http.StatusBadRequest, b.do(t, "GET", "/v1/dead-jobs?limit=0", "").status)
	require.Equal(t, http.StatusForbidden, b.do(t, "POST", "/v1/runs/ap/cancel", "", "Origin", "ws://"+addr).status)

	r = b.do(t, "GET", "/v1/runs/ap", "")
	require.NotContains(t, r.raw, "\n ", "compact JSON")
	sig := b.do(t, "POST", "/v1/runs/ap/signals/approve", "\"\u009b2J\u007f\"")
	require.Equal(t, http.StatusAccepted, sig.status, sig.raw)
	r = b.do(t, "GET", "/v1/runs/ap", "")
	require.NotContains(t, r.raw, "\u009b")
	require.NotContains(t, r.raw, "\u007f")
	require.Contains(t, r.raw, `\u009b2J\u007f`)
}

// On a loopback listen address the Host check holds even with a token (a
// rebinding page could otherwise try tokens); /readyz tells nobody how it
// connects.
func TestHostCheckOnLoopbackWithATokenAndQuietReadiness(t *testing.T) {
	t.Parallel()
	b := setup(t, &httpapi.Options{Token: "a-token-of-16-bytes-or-more", ListenAddr: "127.0.0.1:8080"})
	r := b.doRaw(t, "GET", "/v1/runs", "", "Host", "evil.example", "Authorization", "Bearer a-token-of-16-bytes-or-more")
	require.Equal(t, http.StatusForbidden, r.status)
	require.Equal(t, http.StatusOK, b.doRaw(t, "GET", "/v1/runs", "", "Host", "127.0.0.1:8080", "Authorization", "Bearer a-token-of-16-bytes-or-more").status)

	cfg, err := pgxpool.ParseConfig("postgres://u:s3cretpw@127.0.0.1:1/nodb?sslmode=disable")
	require.NoError(t, err)
	down, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(down.Close)
	e := enginetest.NewEngine(t, enginetest.NewDB(t), nil, false)
	srv := httptest.NewServer(httpapi.New(e, &httpapi.Options{Pool: down, Logger: slog.New(slog.DiscardHandler)}))
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + "/readyz")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.NotContains(t, string(body), "user=")
	require.NotContains(t, string(body), "127.0.0.1:1")
}

// A body with bytes that are not UTF-8 is refused before decoding:
// encoding/json would turn them into U+FFFD, and workflow IDs "g\xff9" and
// "g\xfe9" would name one run.
func TestStartRefusesBodiesThatAreNotUTF8(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, id := range []string{"g\xff9", "g\xfe9"} {
		r := b.do(t, "POST", "/v1/workflows/payment/runs", `{"id": "`+id+`", "input": {}}`)
		require.Equal(t, 400, r.status, r.raw)
		require.Equal(t, "invalid_json", errCode(r), r.raw)
	}
	runs := b.do(t, "GET", "/v1/runs", "")
	require.Empty(t, runs.body["runs"])
}

// The API's run and dead job are the engine's values as encoding/json
// writes them: one JSON shape per entity, which the CLI's --json prints
// too.
func TestRunAndDeadJobBodiesAreTheEngineValues(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	r := b.do(t, "POST", "/v1/workflows/payment/runs", `{"id": "shape", "input": {"amount": 13, "order_id": "shape"}}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	runID := uuid.MustParse(r.body["run_id"].(string))
	b.waitStatus(t, runID.String(), "dead")

	run, err := b.e.GetRun(ctx, runID)
	require.NoError(t, err)
	want, err := json.Marshal(run)
	require.NoError(t, err)
	got := b.do(t, "GET", "/v1/runs/"+runID.String(), "")
	require.JSONEq(t, string(want), got.raw)
	require.Equal(t, "payment", got.body["workflow"])
	require.NotContains(t, got.body, "workflow_name", "one name per field")

	jobs, _, err := b.e.ListDeadJobs(ctx, engine.ListDeadJobsParams{RunID: runID})
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	want, err = json.Marshal(jobs[0])
	require.NoError(t, err)
	got = b.do(t, "GET", "/v1/dead-jobs/"+jobs[0].ID.String(), "")
	require.JSONEq(t, string(want), got.raw)
	require.Equal(t, "charge", got.body["step"])
}

// An escape of half a UTF-16 surrogate pair is refused too: encoding/json
// decodes `\ud800` and `\udc00` both to U+FFFD, so workflow IDs "a\ud800b"
// and "a\udc00b" named one run. A whole pair, and an escaped backslash
// before "ud800", are characters and are kept.
func TestStartRefusesUnpairedSurrogateEscapes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, id := range []string{`a\ud800b`, `a\udc00b`, `a\uDBFF`, `\ud800\ud800`, `\udfff\ud800`} {
		r := b.do(t, "POST", "/v1/workflows/payment/runs", `{"id": "`+id+`", "input": {"order_id": "s", "amount": 1}}`)
		require.Equal(t, 400, r.status, r.raw)
		require.Equal(t, "invalid_json", errCode(r), r.raw)
		require.Contains(t, r.body["error"].(map[string]any)["message"], "surrogate", r.raw)
	}
	runs := b.do(t, "GET", "/v1/runs", "")
	require.Empty(t, runs.body["runs"])

	for id, want := range map[string]string{`pair-\ud83d\ude00`: "pair-\U0001F600", `lit-\\ud800`: `lit-\ud800`, `quote-\"\u00e9`: "quote-\"\u00e9"} {
		r := b.do(t, "POST", "/v1/workflows/payment/runs", `{"id": "`+id+`", "input": {"order_id": "s", "amount": 1}}`)
		require.Equal(t, http.StatusCreated, r.status, r.raw)
		require.Equal(t, want, r.body["workflow_id"])
	}
}

// A list refuses a query parameter it does not take, or one given twice,
// naming it: a misspelt filter would otherwise list everything. The
// workflow ID prefix filters runs.
func TestListsRefuseUnknownAndRepeatedParameters(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, path := range []string{"/v1/runs?stauts=dead", "/v1/runs?status=dead&status=completed", "/v1/dead-jobs?run=x",
		"/v1/runs?workflow=payment&" + strings.Repeat("k", 5000) + "=1"} {
		r := b.do(t, "GET", path, "")
		require.Equal(t, 400, r.status, "%s: %s", path[:min(len(path), 60)], r.raw)
		require.Equal(t, "invalid_parameter", errCode(r))
		require.Less(t, len(r.raw), 600, "the name is cut short in the message")
	}
	require.Contains(t, b.do(t, "GET", "/v1/runs?stauts=dead", "").raw, `\"stauts\"`)

	for _, id := range []string{"batch7_1", "batch7_2", "other_1"} {
		r := b.do(t, "POST", "/v1/workflows/payment/runs", `{"id": "`+id+`", "input": {"order_id": "o", "amount": 1}}`)
		require.Equal(t, http.StatusCreated, r.status, r.raw)
	}
	list := b.do(t, "GET", "/v1/runs?workflow_id_prefix=batch7_", "")
	require.Equal(t, http.StatusOK, list.status, list.raw)
	require.Len(t, list.body["runs"].([]any), 2)
}

// GET /v1/runs/{id} shows a parent's children and the child it waits for,
// and a child's parent; cancelling the parent over HTTP cancels the child.
func TestRunBodiesShowParentAndChildren(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, "POST", "/v1/workflows/approvals/runs", `{"id": "parent-1", "input": {"order_id": "o", "amount": 1}}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	b.waitStatus(t, "parent-1", "waiting")
	var parent map[string]any
	require.Eventually(t, func() bool {
		parent = b.do(t, "GET", "/v1/runs/parent-1", "").body
		return len(parent["await_children"].([]any)) == 1
	}, 10*time.Second, 10*time.Millisecond)
	kids := parent["children"].([]any)
	require.Len(t, kids, 1)
	kid := kids[0].(map[string]any)
	require.Equal(t, "approval", kid["workflow"])
	require.Equal(t, parent["run_id"].(string)+":0", kid["workflow_id"])
	require.Equal(t, "cancel", kid["parent_close_policy"])
	child := b.do(t, "GET", "/v1/runs/"+kid["workflow_id"].(string), "").body // the default child workflow ID is a path segment
	require.Equal(t, kid["run_id"], child["run_id"])
	require.Equal(t, parent["run_id"], child["parent_run_id"])
	require.EqualValues(t, 0, child["parent_seq"])

	c := b.do(t, "POST", "/v1/runs/parent-1/cancel", "")
	require.Equal(t, http.StatusAccepted, c.status, c.raw)
	b.waitStatus(t, "parent-1", "cancelled")
	b.waitStatus(t, kid["run_id"].(string), "cancelled")
}

// GET /v1/runs/{id} lists a child that continued as new once, at its
// chain's latest run, with the chain's first run (first_run_id).
func TestRunBodyShowsAContinuedChildOnce(t *testing.T) {
	t.Parallel()
	// chain starts a child that continues as new three times.
	chainKid := engine.Define("chain-kid", func(ctx *engine.Context, n int) (int, error) {
		if n < 3 {
			return 0, engine.ContinueAsNew(ctx, n+1)
		}
		return n, nil
	}, nil)
	chain := engine.Define("chain", func(ctx *engine.Context, _ int) (int, error) {
		return engine.ChildWorkflow(ctx, chainKid, 0, nil)
	}, nil)
	e := enginetest.NewEngine(t, enginetest.NewDB(t), nil, true, chain, chainKid)
	srv := httptest.NewServer(httpapi.New(e, nil))
	t.Cleanup(srv.Close)
	b := &bundle{srv: srv, e: e}
	r := b.do(t, "POST", "/v1/workflows/chain/runs", `{"id": "chain-1", "input": 0}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	parent := b.waitStatus(t, "chain-1", "completed").body
	kids := parent["children"].([]any)
	require.Len(t, kids, 1, "one entry for the chain of 4 runs: %s", parent["children"])
	kid := kids[0].(map[string]any)
	require.Equal(t, "completed", kid["status"])
	first := kid["first_run_id"].(string)
	require.NotEqual(t, first, kid["run_id"])
	steps := parent["steps"].([]any)
	require.Equal(t, first, steps[0].(map[string]any)["request_id"], "the parent's record holds the chain's first run")
	latest := b.do(t, "GET", "/v1/runs/"+kid["run_id"].(string), "").body
	require.Nil(t, latest["continued_run_id"], "the listed run is the chain's latest")
	require.Equal(t, first, latest["first_run_id"])
}

// POST /v1/runs/{id}/terminate ends a run at once, with its reason; a
// request without one is refused, a retry succeeds, and a finished run is
// 409.
func TestTerminateOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, "POST", "/v1/workflows/approval/runs", `{"id": "term-1", "input": {"order_id": "o", "amount": 1}}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	b.waitStatus(t, "term-1", "waiting")
	bad := b.do(t, "POST", "/v1/runs/term-1/terminate", `{}`)
	require.Equal(t, 400, bad.status, bad.raw)
	ok := b.do(t, "POST", "/v1/runs/term-1/terminate", `{"reason": "test run", "by": "ann"}`)
	require.Equal(t, http.StatusOK, ok.status, ok.raw)
	require.Equal(t, "terminated", ok.body["status"])
	require.Equal(t, "terminated by ann: test run", ok.body["error"].(map[string]any)["message"])
	again := b.do(t, "POST", "/v1/runs/term-1/terminate", `{"reason": "retry"}`)
	require.Equal(t, http.StatusOK, again.status, again.raw)
	p := b.do(t, "POST", "/v1/workflows/payment/runs", `{"id": "term-done", "input": {"order_id": "o", "amount": 1}}`)
	require.Equal(t, http.StatusCreated, p.status, p.raw)
	b.waitStatus(t, "term-done", "completed")
	closed := b.do(t, "POST", "/v1/runs/term-done/terminate", `{"reason": "late"}`)
	require.Equal(t, http.StatusConflict, closed.status, closed.raw)
}

// The runs list takes created and finished time ranges as RFC 3339 times;
// anything else is 400 invalid_parameter.
func TestListRunsByTimeOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, "POST", "/v1/workflows/payment/runs", `{"id": "timed", "input": {"order_id": "o", "amount": 1}}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	b.waitStatus(t, "timed", "completed")
	hourAgo := url.QueryEscape(time.Now().Add(-time.Hour).Format(time.RFC3339))
	inAnHour := url.QueryEscape(time.Now().Add(time.Hour).Format(time.RFC3339))
	list := b.do(t, "GET", "/v1/runs?created_after="+hourAgo+"&finished_before="+inAnHour, "")
	require.Equal(t, http.StatusOK, list.status, list.raw)
	require.Len(t, list.body["runs"].([]any), 1)
	list = b.do(t, "GET", "/v1/runs?created_before="+hourAgo, "")
	require.Empty(t, list.body["runs"])
	bad := b.do(t, "GET", "/v1/runs?finished_after=yesterday", "")
	require.Equal(t, 400, bad.status)
	require.Equal(t, "invalid_parameter", errCode(bad))
}

// GET /v1/workflows lists what the live engine processes register.
func TestListWorkflowsOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, "GET", "/v1/workflows", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	var names []string
	for _, w := range r.body["workflows"].([]any) {
		names = append(names, w.(map[string]any)["name"].(string))
	}
	require.Equal(t, []string{"approval", "approvals", "payment"}, names)
	require.Equal(t, 400, b.do(t, "GET", "/v1/workflows?x=1", "").status)
}

// The bulk routes act on what a filter matches, with a dry run first.
func TestBulkActionsOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, id := range []string{"bulk-1", "bulk-2"} {
		r := b.do(t, "POST", "/v1/workflows/approval/runs", `{"id": "`+id+`", "input": {"order_id": "o", "amount": 1}}`)
		require.Equal(t, http.StatusCreated, r.status, r.raw)
		b.waitStatus(t, id, "waiting")
	}
	dry := b.do(t, "POST", "/v1/bulk/cancel-runs", `{"workflow": "approval", "dry_run": true}`)
	require.Equal(t, http.StatusOK, dry.status, dry.raw)
	require.EqualValues(t, 2, dry.body["matched"])
	require.EqualValues(t, 0, dry.body["done"])
	done := b.do(t, "POST", "/v1/bulk/cancel-runs", `{"workflow": "approval", "workflow_id_prefix": "bulk-"}`)
	require.Equal(t, http.StatusOK, done.status, done.raw)
	require.EqualValues(t, 2, done.body["done"])
	b.waitStatus(t, "bulk-1", "cancelled")
	bad := b.do(t, "POST", "/v1/bulk/cancel-runs", `{"status": "completed"}`)
	require.Equal(t, 400, bad.status, bad.raw)

	r := b.do(t, "POST", "/v1/workflows/payment/runs", `{"id": "bulk-dead", "input": {"order_id": "o", "amount": 13}}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	b.waitStatus(t, "bulk-dead", "dead")
	disc := b.do(t, "POST", "/v1/bulk/discard-dead-jobs", `{"workflow": "payment", "by": "ann", "note": "test"}`)
	require.Equal(t, http.StatusOK, disc.status, disc.raw)
	require.EqualValues(t, 1, disc.body["done"])
}

// Tags: given at the start, shown on the run, filtered with tag=key:value
// (repeatable), and taken by the bulk cancel.
func TestTagsOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, s := range []struct{ id, tags string }{
		{"tag-1", `{"customer": "c_42", "region": "eu"}`},
		{"tag-2", `{"customer": "c_42", "region": "us"}`},
		{"tag-3", `{"customer": "c_7"}`},
	} {
		r := b.do(t, "POST", "/v1/workflows/approval/runs", `{"id": "`+s.id+`", "input": {"order_id": "o", "amount": 1}, "tags": `+s.tags+`}`)
		require.Equal(t, http.StatusCreated, r.status, r.raw)
	}
	r := b.do(t, "GET", "/v1/runs/tag-1", "")
	require.Equal(t, map[string]any{"customer": "c_42", "region": "eu"}, r.body["tags"])
	ids := func(query string) []string {
		t.Helper()
		r := b.do(t, "GET", "/v1/runs?"+query, "")
		require.Equal(t, http.StatusOK, r.status, r.raw)
		var out []string
		for _, run := range r.body["runs"].([]any) {
			out = append(out, run.(map[string]any)["workflow_id"].(string))
		}
		return out
	}
	require.Equal(t, []string{"tag-2", "tag-1"}, ids("tag=customer:c_42"))
	require.Equal(t, []string{"tag-1"}, ids("tag=customer:c_42&tag=region%3Deu"))
	require.Empty(t, ids("tag=customer:nobody"))
	for _, bad := range []string{"tag=nocolon", "tag=a:1&tag=a:2", "tag=bad%20key:v", "tag=k:"} {
		r := b.do(t, "GET", "/v1/runs?"+bad, "")
		require.Equal(t, 400, r.status, bad+" → "+r.raw)
		require.Equal(t, "invalid_parameter", errCode(r), bad)
	}
	r = b.do(t, "POST", "/v1/workflows/approval/runs", `{"input": {"order_id": "o", "amount": 1}, "tags": {"k": "\u001b[31m"}}`)
	require.Equal(t, 400, r.status, r.raw)
	r = b.do(t, "POST", "/v1/workflows/approval/runs", `{"input": {"order_id": "o", "amount": 1}, "tags": {"k": 7}}`)
	require.Equal(t, 400, r.status, r.raw)

	dry := b.do(t, "POST", "/v1/bulk/cancel-runs", `{"tags": {"customer": "c_42"}, "dry_run": true}`)
	require.Equal(t, http.StatusOK, dry.status, dry.raw)
	require.EqualValues(t, 2, dry.body["matched"])
}

// POST /v1/runs/prune runs Engine.Prune; GET /v1/dead-jobs takes run_id.
func TestPruneAndDeadJobsByRunOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, "POST", "/v1/runs/prune", `{"older_than": "720h", "dry_run": true}`)
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.EqualValues(t, 0, r.body["runs"])
	for _, bad := range []string{`{"older_than": "soon"}`, `{"older_than": "-1h"}`, `{}`} {
		r := b.do(t, "POST", "/v1/runs/prune", bad)
		require.Equal(t, 400, r.status, bad)
	}
	r = b.do(t, "GET", "/v1/dead-jobs?run_id="+uuid.NewString(), "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Empty(t, r.body["dead_jobs"])
	require.Equal(t, 400, b.do(t, "GET", "/v1/dead-jobs?run_id=nope", "").status)
}

// GET /v1/runs?top_level=true leaves out child runs, as
// ListRunsParams.TopLevel does; the bulk cancel takes "top_level" too.
func TestTopLevelRunsOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, "POST", "/v1/workflows/approvals/runs", `{"id": "parent-1", "input": {"order_id": "o", "amount": 1}}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	r = b.do(t, "POST", "/v1/workflows/approval/runs", `{"id": "alone-1", "input": {"order_id": "o", "amount": 1}}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	ids := func(query string) []string {
		t.Helper()
		r := b.do(t, "GET", "/v1/runs?"+query, "")
		require.Equal(t, http.StatusOK, r.status, r.raw)
		var out []string
		for _, run := range r.body["runs"].([]any) {
			out = append(out, run.(map[string]any)["workflow_id"].(string))
		}
		return out
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(ids("workflow=approval")) < 2 {
		require.True(t, time.Now().Before(deadline), "the parent never started its child")
		time.Sleep(20 * time.Millisecond)
	}
	require.ElementsMatch(t, []string{"alone-1"}, ids("workflow=approval&top_level=true"))
	require.ElementsMatch(t, []string{"parent-1", "alone-1"}, ids("top_level=true"))
	require.Len(t, ids("workflow=approval&top_level=false"), 2)
	r = b.do(t, "GET", "/v1/runs?top_level=maybe", "")
	require.Equal(t, 400, r.status, r.raw)
	require.Contains(t, r.raw, `top_level \"maybe\" is not true or false`)
	// No run of these workflows calls engine.Patched: none is patched.
	require.Empty(t, ids("patched=fraud-check"))
	require.Len(t, ids("workflow=approval&unpatched=fraud-check"), 2)
	r = b.do(t, "GET", "/v1/runs?patched=%0Abad", "")
	require.Equal(t, 400, r.status, r.raw)
	require.Contains(t, r.raw, "patched change ID")
	dry := b.do(t, "POST", "/v1/bulk/cancel-runs", `{"workflow": "approval", "top_level": true, "dry_run": true}`)
	require.Equal(t, http.StatusOK, dry.status, dry.raw)
	require.EqualValues(t, 1, dry.body["matched"])
	// Every run here is version 1.
	require.Len(t, ids("workflow=approval&workflow_version=1"), 2)
	require.Empty(t, ids("workflow=approval&workflow_version=2"))
	r = b.do(t, "GET", "/v1/runs?workflow_version=first", "")
	require.Equal(t, 400, r.status, r.raw)
	require.Contains(t, r.raw, `workflow_version \"first\" is not a version (1 or more)`)
	for body, matched := range map[string]int{
		`{"workflow": "approval", "workflow_version": 2, "dry_run": true}`:      0,
		`{"workflow": "approval", "workflow_version": 1, "dry_run": true}`:      2,
		`{"workflow": "approval", "unpatched": "fraud-check", "dry_run": true}`: 2,
		`{"workflow": "approval", "patched": "fraud-check", "dry_run": true}`:   0,
	} {
		dry = b.do(t, "POST", "/v1/bulk/cancel-runs", body)
		require.Equal(t, http.StatusOK, dry.status, dry.raw)
		require.EqualValues(t, matched, dry.body["matched"], body)
	}
}

// The package doc lists every route the handler serves, with its method,
// and the Idempotency-Key header: a route added without its line fails
// here. Before, signal-with-start, start-now and the header were missing.
func TestPackageDocListsEveryRoute(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("httpapi.go")
	require.NoError(t, err)
	f, err := parser.ParseFile(token.NewFileSet(), "httpapi.go", src, parser.ParseComments|parser.PackageClauseOnly)
	require.NoError(t, err)
	doc := f.Doc.Text()
	require.Contains(t, doc, "Idempotency-Key")
	routes := regexp.MustCompile(`(?:v1|mux)\.Handle(?:Func)?\("([A-Z]+) (/[^"]*)"`).FindAllStringSubmatch(string(src), -1)
	require.Greater(t, len(routes), 25, "the route registrations were found")
	for _, r := range routes {
		method, path := r[1], strings.TrimSuffix(r[2], "{$}")
		// On one line: the method, then the whole path (not a longer one).
		line := regexp.MustCompile(`(?m)\b` + method + ` (?:.* )?` + regexp.QuoteMeta(path) + `(?:[ ,?]|$)`)
		require.Regexp(t, line, doc, "the package doc does not list %s %s", method, path)
	}
}

// A start whose "id" parses as a UUID (another run's ID, in any spelling)
// is a 400 that says why, never a run that GET /v1/runs/{id} would
// confuse with the other.
func TestStartRefusesAUUIDAsWorkflowID(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, "POST", "/v1/workflows/approval/runs", `{"input": {"order_id": "o", "amount": 1}}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	victim := r.body["run_id"].(string)
	for _, id := range []string{victim, strings.ToUpper(victim), "urn:uuid:" + victim} {
		r = b.do(t, "POST", "/v1/workflows/approval/runs", `{"id": "`+id+`", "input": {"order_id": "o", "amount": 1}}`)
		require.Equal(t, http.StatusBadRequest, r.status, r.raw)
		require.Contains(t, r.raw, "parses as a UUID")
	}
}

// The careless requests an attack pass sent: a bulk cancel with no filter
// (it cancelled every open run) and a prune of runs that ended 1 ns ago
// (it deleted every finished run) are 400s that say why.
func TestBulkCancelAndPruneRefuseCarelessRequests(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, "POST", "/v1/workflows/approval/runs", `{"id": "keep-me", "input": {"order_id": "o", "amount": 1}}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	for _, body := range []string{`{}`, `{"dry_run": false}`, `{"status": "waiting"}`, `{"top_level": true}`} {
		r = b.do(t, "POST", "/v1/bulk/cancel-runs", body)
		require.Equal(t, http.StatusBadRequest, r.status, body)
		require.Contains(t, r.raw, "a bulk cancel needs a filter", body)
	}
	for _, path := range []string{"/v1/bulk/replay-dead-jobs", "/v1/bulk/discard-dead-jobs"} {
		r = b.do(t, "POST", path, `{"dry_run": true}`)
		require.Equal(t, http.StatusBadRequest, r.status, path)
		require.Contains(t, r.raw, "needs a filter", path)
	}
	r = b.do(t, "POST", "/v1/runs/keep-me/terminate", `{"reason": "   "}`)
	require.Equal(t, http.StatusBadRequest, r.status, r.raw)
	require.Contains(t, r.raw, "termination reason is blank")
	for _, age := range []string{"1ns", "59s"} {
		r = b.do(t, "POST", "/v1/runs/prune", `{"older_than": "`+age+`"}`)
		require.Equal(t, http.StatusBadRequest, r.status, age)
		require.Contains(t, r.raw, "below the 1m0s minimum", age)
	}
	r = b.do(t, "POST", "/v1/runs/prune", `{"older_than": "1m", "dry_run": true}`)
	require.Equal(t, http.StatusOK, r.status, r.raw)
	r = b.do(t, "GET", "/v1/runs/keep-me", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.NotEqual(t, "cancelled", r.body["status"])
}

// POST /v1/ui-sessions/revoke signs every browser out of the web UI and
// counts the live sessions it ended; like all of /v1 it needs the token.
func TestRevokeUISessionsRoute(t *testing.T) {
	t.Parallel()
	const token = "a-token-of-16-bytes-or-more"
	opts := &httpapi.Options{Token: token}
	b := setup(t, opts)
	ctx := context.Background()
	_, err := opts.Pool.Exec(ctx, `INSERT INTO pgdurable.ui_sessions (session_hash, expires_at) VALUES
		('\x01', now() + interval '1 hour'), ('\x02', now() + interval '1 hour'), ('\x03', now() - interval '1 hour')`)
	require.NoError(t, err)
	sessions := func() (n int) {
		require.NoError(t, opts.Pool.QueryRow(ctx, `SELECT count(*) FROM pgdurable.ui_sessions`).Scan(&n))
		return n
	}

	r := b.do(t, "POST", "/v1/ui-sessions/revoke", "")
	require.Equal(t, http.StatusUnauthorized, r.status, r.raw)
	r = b.do(t, "GET", "/v1/ui-sessions/revoke", "", "Authorization", "Bearer "+token)
	require.Equal(t, http.StatusMethodNotAllowed, r.status, r.raw)
	r = b.do(t, "POST", "/v1/ui-sessions/revoke", "{}", "Authorization", "Bearer "+token, "Content-Type", "text/plain")
	require.Equal(t, http.StatusUnsupportedMediaType, r.status, r.raw)
	require.Equal(t, 3, sessions(), "a refused request ended nothing")

	r = b.do(t, "POST", "/v1/ui-sessions/revoke", "", "Authorization", "Bearer "+token)
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.JSONEq(t, `{"revoked": 2}`, r.raw, "the live sessions")
	require.Zero(t, sessions(), "the expired one went too")
	r = b.do(t, "POST", "/v1/ui-sessions/revoke", "{}", "Authorization", "Bearer "+token)
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.JSONEq(t, `{"revoked": 0}`, r.raw)

	// Without a database pool there are no sessions to end.
	srv := httptest.NewServer(httpapi.New(b.e, nil))
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/ui-sessions/revoke", "application/json", nil)
	require.NoError(t, err)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusNotImplemented, resp.StatusCode, string(raw))
	require.Contains(t, string(raw), `"code":"not_implemented"`)
}

// GET /v1/runs/{id} trims the run for a follower: steps_from, signals=false
// and payloads=false leave out what it does not need; bad values are 400s.
func TestGetRunTrimsForAFollower(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, "POST", "/v1/workflows/approval/runs", `{"id": "trim-1", "input": {"order_id": "o-trim", "amount": 7}}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	r = b.do(t, "POST", "/v1/runs/trim-1/signals/noise", `{"big": "payload"}`)
	require.Equal(t, http.StatusAccepted, r.status, r.raw)
	var steps []any
	deadline := time.Now().Add(20 * time.Second)
	for len(steps) == 0 {
		require.True(t, time.Now().Before(deadline), "the run never recorded a step")
		time.Sleep(20 * time.Millisecond)
		r = b.do(t, "GET", "/v1/runs/trim-1", "")
		steps, _ = r.body["steps"].([]any)
	}
	require.Contains(t, r.raw, `"o-trim"`, "the whole run has its input")
	require.Contains(t, r.raw, `"big"`, "and its signals' payloads")
	r = b.do(t, "GET", "/v1/runs/trim-1?signals=false&payloads=false", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.NotContains(t, r.raw, `"o-trim"`)
	require.NotContains(t, r.raw, `"big"`)
	require.Nil(t, r.body["signals"])
	r = b.do(t, "GET", fmt.Sprintf("/v1/runs/trim-1?steps_from=%d", len(steps)), "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Nil(t, r.body["steps"], "no step at or after the last one")
	for _, bad := range []string{"steps_from=-1", "steps_from=x", "steps_from=2147483648", "steps_from=9223372036854775807",
		"signals=maybe", "payloads=2", "other=1"} {
		r = b.do(t, "GET", "/v1/runs/trim-1?"+bad, "")
		require.Equal(t, http.StatusBadRequest, r.status, bad)
	}
}
