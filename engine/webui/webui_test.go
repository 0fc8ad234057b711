package webui_test

import (
	"context"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/engine/httpapi"
	"github.com/pgdurable/pgdurable/engine/webui"
)

// order is the fixture workflow's input: Kind picks what its run does.
type order struct {
	Kind string `json:"kind"`
	ID   string `json:"id"`
}

// fixture is an engine with runs in every state, served with the UI.
type fixture struct {
	db    *enginetest.DB
	e     *engine.Engine
	srv   *httptest.Server
	fixed atomic.Bool // the "flaky" step succeeds once set
	runs  map[string]uuid.UUID
}

func newFixture(t *testing.T, token string) *fixture {
	t.Helper()
	f := &fixture{runs: map[string]uuid.UUID{}}
	wf := engine.Define("order", func(ctx *engine.Context, in order) (string, error) {
		if in.Kind == "wait" {
			return engine.AwaitSignal[string](ctx, "approve", 0)
		}
		hold, err := engine.Step(ctx, "reserve", func(context.Context) (string, error) { return "hold-" + in.ID, nil }, nil)
		if err != nil {
			return "", err
		}
		if err := ctx.Compensate(engine.Undo{Name: "release", Fn: func(context.Context, *engine.ActivityAttempt) error { return nil }}); err != nil {
			return "", err
		}
		charge, err := engine.RunActivity(ctx, "charge", func(_ context.Context, a *engine.ActivityAttempt) (string, error) {
			if in.Kind == "decline" {
				return "", engine.Permanent(errors.New("card declined"))
			}
			return "ch_" + a.RequestID.String()[:8], nil
		}, nil)
		if err != nil {
			return "", err
		}
		return hold + " " + charge, nil
	}, nil)
	// ship parks its run: its step fails until fixed, with no undo to run.
	dead := engine.Define("ship", func(ctx *engine.Context, in order) (int, error) {
		return engine.Step(ctx, "ship", func(context.Context) (int, error) {
			if !f.fixed.Load() {
				return 0, errors.New("carrier API returned 503")
			}
			return 1, nil
		}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: 10 * time.Millisecond, MaximumAttempts: 2}})
	}, nil)
	// family waits for an order of kind "wait" as its child run,
	// <its workflow ID>-kid.
	family := engine.Define("family", func(ctx *engine.Context, in order) (string, error) {
		return engine.ChildWorkflow(ctx, wf, order{Kind: "wait", ID: in.ID}, &engine.ChildOpts{WorkflowID: ctx.WorkflowID() + "-kid"})
	}, nil)
	db := enginetest.NewDB(t)
	f.db = db
	f.e = enginetest.NewEngine(t, db, &engine.Config{Logger: slog.New(slog.DiscardHandler)}, true, wf, dead, family, courier())
	ctx := context.Background()
	for _, s := range []struct {
		key, workflow, kind string
		opts                *engine.StartOpts
	}{
		{"completed", "order", "ok", &engine.StartOpts{Tags: map[string]string{"customer": "c_42", "region": "eu", "city": "New York"}}},
		{"compensated", "order", "decline", nil},
		{"waiting", "order", "wait", &engine.StartOpts{WorkflowID: "approval-7"}},
		{"delayed", "order", "ok", &engine.StartOpts{Delay: time.Hour, WorkflowID: "tomorrow"}},
		{"cancelled", "order", "wait", nil},
		{"dead", "ship", "", nil},
		{"dead2", "ship", "", nil},
		{"family", "family", "", &engine.StartOpts{WorkflowID: "family-1"}},
	} {
		res, err := f.e.StartJSON(ctx, s.workflow, []byte(fmt.Sprintf(`{"kind": %q, "id": %q}`, s.kind, s.key)), s.opts)
		require.NoError(t, err)
		f.runs[s.key] = res.RunID
	}
	require.NoError(t, f.e.Cancel(ctx, f.runs["cancelled"]))
	for key, want := range map[string]engine.RunStatus{"completed": engine.StatusCompleted, "compensated": engine.StatusCompensated,
		"waiting": engine.StatusWaiting, "delayed": engine.StatusWaiting, "cancelled": engine.StatusCancelled,
		"dead": engine.StatusDead, "dead2": engine.StatusDead} {
		waitStatus(t, f.e, f.runs[key], want)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		run, err := f.e.GetRun(ctx, f.runs["family"])
		require.NoError(t, err)
		if len(run.Children) == 1 && run.Status == engine.StatusWaiting {
			f.runs["family-kid"] = run.Children[0].RunID
			waitStatus(t, f.e, run.Children[0].RunID, engine.StatusWaiting)
			break
		}
		require.True(t, time.Now().Before(deadline), "family-1 never waited for its child")
		time.Sleep(20 * time.Millisecond)
	}
	_, err := f.e.CreateSchedule(ctx, engine.ScheduleSpec{Name: "nightly-report", Cron: "0 3 * * *", TimeZone: "Europe/Paris",
		Workflow: "order", Input: []byte(`{"kind": "ok", "id": "report"}`)})
	require.NoError(t, err)

	ui := webui.New(f.e, &webui.Options{Token: token, Pool: db.Pool, APIError: httpapi.ErrorCode})
	f.srv = httptest.NewUnstartedServer(nil)
	f.srv.Config.Handler = httpapi.New(f.e, &httpapi.Options{Token: token, UI: ui, Pool: db.Pool, ListenAddr: f.srv.Listener.Addr().String()})
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	return f
}

func waitStatus(t *testing.T, e *engine.Engine, id uuid.UUID, want engine.RunStatus) *engine.Run {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		run, err := e.GetRun(context.Background(), id)
		require.NoError(t, err)
		if run.Status == want && (want != engine.StatusWaiting || run.AwaitSignal != "" || run.StartedAt == nil) {
			return run
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s is %s, want %s", id, run.Status, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var csrfField = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// client is a browser-like HTTP client: it keeps cookies, follows no
// redirects, and sends the service's own Origin on POSTs.
type client struct {
	t    *testing.T
	base string
	http *http.Client
}

func newClient(t *testing.T, base string) *client {
	jar, _ := cookiejar.New(nil)
	return &client{t: t, base: base, http: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

func (c *client) do(method, path string, form url.Values, header map[string]string) (int, http.Header, string) {
	c.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, c.base+path, body)
	require.NoError(c.t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", c.base)
	}
	for k, v := range header {
		switch {
		case k == "Host":
			req.Host = v
		case v == "":
			req.Header.Del(k)
		default:
			req.Header.Set(k, v)
		}
	}
	resp, err := c.http.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, html.UnescapeString(string(b))
}

func (c *client) csrf(path string) string {
	c.t.Helper()
	code, _, body := c.do("GET", path, nil, nil)
	require.Equal(c.t, 200, code, body)
	m := csrfField.FindStringSubmatch(body)
	require.NotNil(c.t, m, "no CSRF field on %s", path)
	return m[1]
}

func TestPagesAnswerEveryRunStateWithoutABrowser(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "")
	c := newClient(t, f.srv.URL)
	for path, want := range map[string]string{
		"/ui/":                 "open dead jobs",
		"/ui/runs":             "approval-7",
		"/ui/runs?status=dead": "ship",
		"/ui/runs/" + f.runs["completed"].String():   "ch_",
		"/ui/runs/" + f.runs["compensated"].String(): "card declined",
		"/ui/runs/approval-7":                        "approve",
		"/ui/runs/" + f.runs["dead"].String():        "Parked as a dead job",
		"/ui/dead-jobs":                              "carrier API returned 503",
		"/ui/schedules":                              "nightly-report",
		"/ui/schedules/nightly-report":               "Next fires",
		"/ui/workflows":                              "order",
	} {
		code, h, body := c.do("GET", path, nil, nil)
		require.Equal(t, 200, code, path)
		require.Contains(t, body, want, path)
		require.Contains(t, h.Get("Content-Security-Policy"), "frame-ancestors 'none'", path)
		require.Equal(t, "DENY", h.Get("X-Frame-Options"))
	}
	code, h, _ := c.do("GET", "/", nil, nil)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "/ui/", h.Get("Location"))

	// Bad input: a precise message and a 4xx, never a 500.
	for _, bad := range []struct {
		path string
		code int
		want string
	}{
		{"/ui/runs?created_after=yesterday-ish", 400, "is not a time"},
		{"/ui/runs?status=sleeping", 400, "unknown run status"},
		{"/ui/runs?tags=nocolon", 400, "not key:value"},
		{"/ui/runs?tags=region%3Dapac", 200, "no runs match"},
		{"/ui/runs?cursor=zzz", 400, "cursor"},
		{"/ui/runs/" + uuid.NewString(), 404, "no run"},
		{"/ui/runs/no-such-workflow-id", 404, "no run"},
		{"/ui/dead-jobs/not-a-uuid", 404, "no dead job"},
		{"/ui/dead-jobs?reason=bored", 400, "unknown dead-job reason"},
		{"/ui/schedules/absent", 404, "not found"},
		{"/ui/nowhere", 404, "no page"},
	} {
		code, _, body := c.do("GET", bad.path, nil, nil)
		require.Equal(t, bad.code, code, bad.path)
		require.Contains(t, strings.ToLower(body), bad.want, bad.path)
	}

	csrf := c.csrf("/ui/runs/approval-7")
	waiting := f.runs["waiting"].String()
	code, _, body := c.do("POST", "/ui/runs/"+waiting+"/signal", url.Values{"csrf": {csrf}, "name": {"approve"}, "payload": {"{oops"}}, nil)
	require.Equal(t, 400, code)
	require.Contains(t, body, "not JSON")
	code, _, body = c.do("POST", "/ui/runs/"+waiting+"/terminate", url.Values{"csrf": {csrf}}, nil)
	require.Equal(t, 400, code)
	require.Contains(t, body, "termination reason must be 1 to 1000 bytes")
	code, h, _ = c.do("POST", "/ui/runs/"+waiting+"/signal", url.Values{"csrf": {csrf}, "name": {"approve"}, "payload": {`"yes"`}}, nil)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "/ui/runs/"+waiting+"?done=signalled", h.Get("Location"))
	run := waitStatus(t, f.e, f.runs["waiting"], engine.StatusCompleted)
	require.JSONEq(t, `"yes"`, string(run.Output))
	code, _, body = c.do("GET", h.Get("Location"), nil, nil)
	require.Equal(t, 200, code)
	require.Contains(t, body, "Signal sent.")
	code, _, _ = c.do("POST", "/ui/runs/"+waiting+"/cancel", url.Values{"csrf": {csrf}}, nil)
	require.Equal(t, 409, code, "cancelling a finished run")

	// Start a delayed run now.
	code, _, _ = c.do("POST", "/ui/runs/"+f.runs["delayed"].String()+"/start-now", url.Values{"csrf": {csrf}}, nil)
	require.Equal(t, http.StatusSeeOther, code)
	waitStatus(t, f.e, f.runs["delayed"], engine.StatusCompleted)
}

func TestFormsRefuseCrossSiteRequests(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "")
	c := newClient(t, f.srv.URL)
	csrf := c.csrf("/ui/runs")
	path := "/ui/runs/" + f.runs["waiting"].String() + "/cancel"
	for _, bad := range []struct {
		name   string
		form   url.Values
		header map[string]string
		want   string
	}{
		{"another origin", url.Values{"csrf": {csrf}}, map[string]string{"Origin": "https://evil.example"}, "another site"},
		{"cross-site fetch without Origin", url.Values{"csrf": {csrf}}, map[string]string{"Origin": "", "Sec-Fetch-Site": "cross-site"}, "another site"},
		{"no CSRF token", url.Values{}, nil, "security token"},
		{"a wrong CSRF token", url.Values{"csrf": {strings.Repeat("0", 64)}}, nil, "security token"},
	} {
		code, _, body := c.do("POST", path, bad.form, bad.header)
		require.Equal(t, http.StatusForbidden, code, bad.name)
		require.Contains(t, body, bad.want, bad.name)
	}
	run, err := f.e.GetRun(context.Background(), f.runs["waiting"])
	require.NoError(t, err)
	require.Nil(t, run.CancelRequestedAt, "no refused form acted")

	// A page rebinding its DNS name to 127.0.0.1 sends its own Host.
	code, _, _ := c.do("GET", "/ui/", nil, map[string]string{"Host": "evil.example"})
	require.Equal(t, http.StatusForbidden, code)
}

func TestTokenProtectsThePagesBehindASignIn(t *testing.T) {
	t.Parallel()
	const token = "0123456789abcdef-ui-test-token"
	f := newFixture(t, token)
	c := newClient(t, f.srv.URL)

	code, h, _ := c.do("GET", "/ui/runs?status=dead", nil, nil)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "/ui/login?next="+url.QueryEscape("/ui/runs?status=dead"), h.Get("Location"))
	code, _, _ = c.do("GET", "/ui/static/style.css", nil, nil)
	require.Equal(t, 200, code, "the stylesheet is public")

	// The sign-in page shows no menu and nothing derived from the token
	// (found by an attack pass: its CSRF token was an HMAC of the API
	// token, which let anyone guess the token offline).
	code, _, body := c.do("GET", "/ui/login", nil, nil)
	require.Equal(t, 200, code)
	require.NotContains(t, body, `name="csrf"`)
	require.NotContains(t, body, "Sign out")
	require.NotContains(t, body, `href="/ui/runs"`)

	code, _, body = c.do("POST", "/ui/login", url.Values{"token": {"wrong"}, "next": {"/ui/runs"}}, nil)
	require.Equal(t, http.StatusUnauthorized, code)
	require.Contains(t, body, "not this service's API token")
	require.NotContains(t, body, token)

	// An action without a session is refused, not redirected.
	code, _, _ = c.do("POST", "/ui/runs/"+f.runs["waiting"].String()+"/cancel", url.Values{}, nil)
	require.Equal(t, http.StatusUnauthorized, code)

	// After sign-in, next may only be a page of this UI.
	for _, next := range []string{"//evil.example/ui/", "/ui/../v1/runs", "/ui/%2e%2e/v1/runs"} {
		code, h, _ = newClient(t, f.srv.URL).do("POST", "/ui/login", url.Values{"token": {token}, "next": {next}}, nil)
		require.Equal(t, http.StatusSeeOther, code, next)
		require.Equal(t, "/ui/", h.Get("Location"), next)
	}
	code, h, _ = c.do("POST", "/ui/login", url.Values{"token": {token}, "next": {"/ui/runs?status=dead"}}, nil)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "/ui/runs?status=dead", h.Get("Location"))
	cookie := h.Get("Set-Cookie")
	require.Contains(t, cookie, "HttpOnly")
	require.Contains(t, cookie, "SameSite=Strict")
	require.NotContains(t, cookie, token)
	code, _, body = c.do("GET", "/ui/runs?status=dead", nil, nil)
	require.Equal(t, 200, code)
	require.Contains(t, body, "Sign out")
	csrf := c.csrf("/ui/runs")

	// Each session has its own CSRF token, and its own cookie.
	other := newClient(t, f.srv.URL)
	other.do("POST", "/ui/login", url.Values{"token": {token}}, nil)
	otherCSRF := other.csrf("/ui/runs")
	require.NotEqual(t, csrf, otherCSRF)
	code, _, _ = c.do("POST", "/ui/runs/"+f.runs["waiting"].String()+"/cancel", url.Values{"csrf": {otherCSRF}}, nil)
	require.Equal(t, http.StatusForbidden, code, "another session's CSRF token")

	// Scripts may send the bearer token instead, and need no CSRF token.
	code, _, _ = newClient(t, f.srv.URL).do("GET", "/ui/dead-jobs", nil, map[string]string{"Authorization": "Bearer " + token})
	require.Equal(t, 200, code)

	// Sign-out ends the session on the server: the old cookie is dead.
	u, _ := url.Parse(f.srv.URL + "/ui/")
	old := c.http.Jar.Cookies(u)
	require.Len(t, old, 1)
	code, h, _ = c.do("POST", "/ui/logout", url.Values{"csrf": {csrf}}, nil)
	require.Equal(t, http.StatusSeeOther, code)
	require.Contains(t, h.Get("Set-Cookie"), "Max-Age=0")
	replay := newClient(t, f.srv.URL)
	replay.http.Jar.SetCookies(u, old)
	code, _, _ = replay.do("GET", "/ui/runs", nil, nil)
	require.Equal(t, http.StatusSeeOther, code, "a copied cookie no longer signs in after sign-out")
	code, _, _ = other.do("GET", "/ui/runs", nil, nil)
	require.Equal(t, 200, code, "the other session lives on")

	// Wrong tokens are limited: 20 a minute per client address, then 429;
	// a correct token still signs in (before, the 21st request was
	// refused whatever its token: TestSignInLimitNeverRefusesTheToken).
	guesser := newClient(t, f.srv.URL)
	for range 19 { // one wrong try above already
		code, _, _ = guesser.do("POST", "/ui/login", url.Values{"token": {"guess"}}, nil)
		require.Equal(t, http.StatusUnauthorized, code)
	}
	code, _, body = guesser.do("POST", "/ui/login", url.Values{"token": {"guess"}}, nil)
	require.Equal(t, http.StatusTooManyRequests, code)
	require.Contains(t, body, "Too many wrong tokens")
	code, _, _ = guesser.do("POST", "/ui/login", url.Values{"token": {token}}, nil)
	require.Equal(t, http.StatusSeeOther, code)
}

// screenshotDir is where the browser test saves a PNG of each page:
// $PGDURABLE_SCREENSHOTS, else a folder under the system's temp dir.
func screenshotDir(t *testing.T) string {
	dir := os.Getenv("PGDURABLE_SCREENSHOTS")
	if dir == "" {
		dir = os.TempDir() + "/pgdurable-ui-screenshots"
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	return dir
}

var hiddenField = regexp.MustCompile(`<input type="hidden" name="([a-z_]+)" value="([^"]*)">`)

// confirmForm returns the hidden fields of a confirmation page's form.
func confirmForm(body string) url.Values {
	v := url.Values{}
	for _, m := range hiddenField.FindAllStringSubmatch(body, -1) {
		v.Set(m[1], html.UnescapeString(m[2]))
	}
	return v
}

// A bulk action by filter acts on what its dry run counted, not on what
// matches by the time it is confirmed (found by an attack pass), and
// ticked jobs count once, resolved ones as skipped.
func TestBulkActionsActOnWhatTheyCounted(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "")
	c := newClient(t, f.srv.URL)
	ctx := context.Background()
	csrf := c.csrf("/ui/runs")
	startWait := func(id string) uuid.UUID {
		res, err := f.e.StartJSON(ctx, "order", []byte(`{"kind": "wait", "id": "x"}`), &engine.StartOpts{WorkflowID: id})
		require.NoError(t, err)
		waitStatus(t, f.e, res.RunID, engine.StatusWaiting)
		return res.RunID
	}
	startWait("pin-1")
	startWait("pin-2")
	code, _, body := c.do("POST", "/ui/runs/cancel-matching", url.Values{"csrf": {csrf}, "workflow_id_prefix": {"pin-"}, "created_after": {"1h"}}, nil)
	require.Equal(t, 200, code, body)
	require.Contains(t, body, "Matching runs: <strong>2</strong>.")
	form := confirmForm(body)
	require.Equal(t, "yes", form.Get("confirm"))
	late := startWait("pin-3")
	code, _, body = c.do("POST", "/ui/runs/cancel-matching", form, nil)
	require.Equal(t, 200, code, body)
	require.Contains(t, body, "2 done, 0 skipped")
	run, err := f.e.GetRun(ctx, late)
	require.NoError(t, err)
	require.Nil(t, run.CancelRequestedAt, "a run started after the count is not cancelled")

	// Dead jobs by filter: the same pin, by the time of the count.
	code, _, body = c.do("POST", "/ui/dead-jobs/bulk", url.Values{"csrf": {csrf}, "action": {"discard"}, "workflow": {"ship"}}, nil)
	require.Equal(t, 200, code, body)
	require.Contains(t, body, "Matching open dead jobs: <strong>2</strong>.")
	form = confirmForm(body)
	res, err := f.e.StartJSON(ctx, "ship", []byte(`{}`), nil)
	require.NoError(t, err)
	waitStatus(t, f.e, res.RunID, engine.StatusDead)
	code, _, body = c.do("POST", "/ui/dead-jobs/bulk", form, nil)
	require.Equal(t, 200, code, body)
	require.Contains(t, body, "2 done, 0 skipped")
	open, _, err := f.e.ListDeadJobs(ctx, engine.ListDeadJobsParams{OpenOnly: true})
	require.NoError(t, err)
	require.Len(t, open, 1)
	require.Equal(t, res.RunID, open[0].RunID, "the job parked after the count stays open")

	// Ticked: a job ticked twice counts once; a resolved one is skipped.
	all, _, err := f.e.ListDeadJobs(ctx, engine.ListDeadJobsParams{})
	require.NoError(t, err)
	require.Len(t, all, 3)
	ticked := url.Values{"csrf": {csrf}, "action": {"discard"}, "id": {open[0].ID.String(), open[0].ID.String()}}
	for _, j := range all {
		if j.ResolvedAt != nil {
			ticked.Add("id", j.ID.String())
		}
	}
	code, _, body = c.do("POST", "/ui/dead-jobs/bulk", ticked, nil)
	require.Equal(t, 200, code, body)
	require.Contains(t, body, "1 done, 2 skipped (changed meanwhile), of 3 matched")
	code, _, body = c.do("POST", "/ui/dead-jobs/bulk", url.Values{"csrf": {csrf}, "action": {"replay"}, "workflow": {"ship"}, "confirm": {"yes"}}, nil)
	require.Equal(t, 400, code, "a confirmation without its count's time")
	require.Contains(t, body, "count again")
}

// Forms take a workflow ID where the pages do; pages show IDs that tell
// runs apart and cut big payloads.
func TestRunPagesTakeWorkflowIDsAndCutPayloads(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "")
	c := newClient(t, f.srv.URL)
	ctx := context.Background()
	big := `"` + strings.Repeat("<x>", 100_000) + `"`
	require.NoError(t, f.e.SignalJSON(ctx, "approval-7", "other", []byte(big), nil))
	code, _, body := c.do("GET", "/ui/runs/approval-7", nil, nil)
	require.Equal(t, 200, code)
	require.Less(t, len(body), 64<<10, "a 300 KB payload is previewed, not printed")
	require.Contains(t, body, "cut here; the API returns all of it")

	csrf := c.csrf("/ui/runs")
	code, h, _ := c.do("POST", "/ui/runs/approval-7/signal", url.Values{"csrf": {csrf}, "name": {"approve"}, "payload": {`"ok"`}}, nil)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "/ui/runs/"+f.runs["waiting"].String()+"?done=signalled", h.Get("Location"))
	code, _, _ = c.do("POST", "/ui/runs/nobody/cancel", url.Values{"csrf": {csrf}}, nil)
	require.Equal(t, 404, code)

	_, _, body = c.do("GET", "/ui/runs", nil, nil)
	for key, id := range f.runs {
		require.Contains(t, body, "…"+id.String()[28:], key)
	}
	code, _, body = c.do("GET", "/ui/runs?created_after=soon&workflow=order", nil, nil)
	require.Equal(t, 400, code)
	require.Contains(t, body, "is not a time")
	require.Contains(t, body, `name="workflow" value="order"`, "a bad filter keeps the form as typed")
}

// The runs page filters to top-level runs as GET /v1/runs?top_level=true
// and the CLI's --top-level do: children hidden, in its pages and in the
// cancel-matching it offers.
func TestRunsPageTopLevelFilter(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "")
	c := newClient(t, f.srv.URL)
	code, _, body := c.do("GET", "/ui/runs?workflow_id_prefix=family-", nil, nil)
	require.Equal(t, 200, code, body)
	require.Contains(t, body, "family-1-kid")
	require.Contains(t, body, `id="f-top" name="top_level" value="true">`, "unticked")
	code, _, body = c.do("GET", "/ui/runs?workflow_id_prefix=family-&top_level=true", nil, nil)
	require.Equal(t, 200, code, body)
	require.NotContains(t, body, "family-1-kid")
	require.Contains(t, body, "family-1")
	require.Contains(t, body, `id="f-top" name="top_level" value="true" checked>`)
	require.Contains(t, body, `<input type="hidden" name="top_level" value="true">`, "the bulk form keeps it")
	csrf := c.csrf("/ui/runs")
	code, _, body = c.do("POST", "/ui/runs/cancel-matching", url.Values{"csrf": {csrf}, "workflow_id_prefix": {"family-"}, "top_level": {"true"}}, nil)
	require.Equal(t, 200, code, body)
	require.Contains(t, body, "Matching runs: <strong>1</strong>.")
	require.Equal(t, "true", confirmForm(body).Get("top_level"))
	code, _, body = c.do("POST", "/ui/runs/cancel-matching", url.Values{"csrf": {csrf}, "workflow_id_prefix": {"family-"}}, nil)
	require.Equal(t, 200, code, body)
	require.Contains(t, body, "Matching runs: <strong>2</strong>.")
}

// The runs page filters by a change's marker (engine.Patched) as
// GET /v1/runs?patched=&unpatched= do, and its cancel-matching keeps the
// filter, so it never cancels more than the page shows.
func TestRunsPagePatchFilter(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "")
	c := newClient(t, f.srv.URL)
	code, _, body := c.do("GET", "/ui/runs?workflow_id_prefix=family-&patched=fraud-check", nil, nil)
	require.Equal(t, 200, code, body)
	require.Contains(t, body, "No runs match.", "no fixture workflow calls Patched")
	require.Contains(t, body, `<input type="hidden" name="patched" value="fraud-check">`, "the bulk form keeps it")
	code, _, body = c.do("GET", "/ui/runs?workflow_id_prefix=family-&unpatched=fraud-check", nil, nil)
	require.Equal(t, 200, code, body)
	require.Contains(t, body, "family-1-kid")
	csrf := c.csrf("/ui/runs")
	code, _, body = c.do("POST", "/ui/runs/cancel-matching", url.Values{"csrf": {csrf}, "workflow_id_prefix": {"family-"}, "patched": {"fraud-check"}}, nil)
	require.Equal(t, 200, code, body)
	require.Contains(t, body, "Matching runs: <strong>0</strong>.")
	code, _, body = c.do("GET", "/ui/runs?patched=%0A", nil, nil)
	require.Equal(t, 200, code, body, "white space alone is no filter")
	code, _, body = c.do("GET", "/ui/runs?patched=a%0Ab", nil, nil)
	require.Equal(t, 400, code, body)
}

// A run's page shows each step's attempts, their outcomes and when they
// were recorded, an attempt lost with its worker (worker_lost) included;
// the runs list shows each run's error.
func TestRunPageShowsAttemptHistory(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "")
	c := newClient(t, f.srv.URL)
	lost := f.lostWorkerRun(t)

	code, _, body := c.do("GET", "/ui/runs/"+f.runs["dead"].String(), nil, nil)
	require.Equal(t, 200, code)
	require.Contains(t, body, "Attempts of step #0")
	require.Regexp(t, `(?s)<tr class="attempt-retrying">\s*<td>#1</td>\s*<td>retrying</td>\s*<td class="error-cell"><code>transient</code> carrier API returned 503</td>\s*<td><time datetime="[^"]+"`, body)
	require.Regexp(t, `(?s)<tr class="attempt-parked">\s*<td>#2</td>\s*<td>parked</td>\s*<td class="error-cell"><code>transient</code> retries exhausted after 2 attempts: carrier API returned 503</td>`, body)

	code, _, body = c.do("GET", "/ui/runs/"+lost.String(), nil, nil)
	require.Equal(t, 200, code)
	require.Regexp(t, `(?s)<tr class="attempt-retrying">\s*<td>#1</td>\s*<td>retrying <strong class="lost">worker lost</strong></td>\s*<td class="error-cell"><code>worker_lost</code> `, body)
	require.Regexp(t, `(?s)<tr class="attempt-completed">\s*<td>#2</td>\s*<td>completed</td>`, body)

	code, _, body = c.do("GET", "/ui/runs/"+f.runs["completed"].String(), nil, nil)
	require.Equal(t, 200, code)
	require.NotContains(t, body, "Attempts of step", "a step that never failed has no history")

	code, _, body = c.do("GET", "/ui/runs?status=dead", nil, nil)
	require.Equal(t, 200, code)
	require.Contains(t, body, `<th scope="col">Error</th>`)
	require.Contains(t, body, "carrier API returned 503")
	code, _, body = c.do("GET", "/ui/runs?workflow=order", nil, nil)
	require.Equal(t, 200, code)
	require.Contains(t, body, "card declined", "the compensated run's error")
}

// A parent's run page shows a child that continued as new once, at its
// chain's latest run, with a link to the chain's first run; before, one
// row per run of the chain.
func TestRunPageShowsAContinuedChildOnce(t *testing.T) {
	t.Parallel()
	kid := engine.Define("page-chain-kid", func(ctx *engine.Context, n int) (int, error) {
		if n < 4 {
			return 0, engine.ContinueAsNew(ctx, n+1)
		}
		return n, nil
	}, nil)
	parent := engine.Define("page-chain-parent", func(ctx *engine.Context, _ int) (int, error) {
		return engine.ChildWorkflow(ctx, kid, 0, nil)
	}, nil)
	db := enginetest.NewDB(t)
	e := enginetest.NewEngine(t, db, &engine.Config{Logger: slog.New(slog.DiscardHandler)}, true, parent, kid)
	res, err := parent.Start(context.Background(), e, 0, nil)
	require.NoError(t, err)
	run := waitStatus(t, e, res.RunID, engine.StatusCompleted)
	require.Len(t, run.Children, 1)
	chain := run.Children[0]
	require.NotNil(t, chain.FirstRunID)

	ui := webui.New(e, &webui.Options{Pool: db.Pool, APIError: httpapi.ErrorCode})
	srv := httptest.NewUnstartedServer(nil)
	srv.Config.Handler = httpapi.New(e, &httpapi.Options{UI: ui, ListenAddr: srv.Listener.Addr().String()})
	srv.Start()
	t.Cleanup(srv.Close)
	code, _, body := newClient(t, srv.URL).do("GET", "/ui/runs/"+res.RunID.String(), nil, nil)
	require.Equal(t, 200, code)
	require.Equal(t, 1, strings.Count(body, "<td>#0</td>"), "one row for the chain of 5 runs")
	require.Contains(t, body, `<a href="/ui/runs/`+chain.RunID.String()+`">`, "the row links to the latest run")
	require.Contains(t, body, "latest run of a continue-as-new chain")
	require.Contains(t, body, `<a href="/ui/runs/`+chain.FirstRunID.String()+`">`, "and to the chain's first run")
}

// A parent parked with its dead child (child_dead) shows the child run and
// the child's dead job on its dead job's page, linked.
func TestDeadJobPageLinksTheDeadChild(t *testing.T) {
	t.Parallel()
	kid := engine.Define("page-dead-kid", func(ctx *engine.Context, _ int) (int, error) {
		return engine.Step(ctx, "work", func(context.Context) (int, error) {
			return 0, errors.New("broken")
		}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{MaximumAttempts: 1}}) // parked at once
	}, nil)
	parent := engine.Define("page-dead-kid-parent", func(ctx *engine.Context, _ int) (int, error) {
		return engine.ChildWorkflow(ctx, kid, 0, nil)
	}, nil)
	db := enginetest.NewDB(t)
	e := enginetest.NewEngine(t, db, &engine.Config{Logger: slog.New(slog.DiscardHandler)}, true, parent, kid)
	ctx := context.Background()
	res, err := parent.Start(ctx, e, 0, nil)
	require.NoError(t, err)
	waitStatus(t, e, res.RunID, engine.StatusDead)
	jobs, _, err := e.ListDeadJobs(ctx, engine.ListDeadJobsParams{RunID: res.RunID})
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	job := jobs[0]

	ui := webui.New(e, &webui.Options{Pool: db.Pool, APIError: httpapi.ErrorCode})
	srv := httptest.NewUnstartedServer(nil)
	srv.Config.Handler = httpapi.New(e, &httpapi.Options{UI: ui, ListenAddr: srv.Listener.Addr().String()})
	srv.Start()
	t.Cleanup(srv.Close)
	code, _, body := newClient(t, srv.URL).do("GET", "/ui/dead-jobs/"+job.ID.String(), nil, nil)
	require.Equal(t, 200, code)
	require.Contains(t, body, "child_dead")
	require.Contains(t, body, `<a href="/ui/runs/`+job.ChildRunID.String()+`">`)
	require.Contains(t, body, `<a href="/ui/dead-jobs/`+job.ChildDeadJobID.String()+`">`)
	require.Contains(t, body, "replaying either dead job replays both")
	code, _, body = newClient(t, srv.URL).do("GET", "/ui/dead-jobs/"+job.ChildDeadJobID.String(), nil, nil)
	require.Equal(t, 200, code)
	require.Contains(t, body, `<a href="/ui/runs/`+res.RunID.String()+`">`, "the child's page names the parent parked on it")
	require.Contains(t, body, `<a href="/ui/dead-jobs/`+job.ID.String()+`">`)
}

// serveWithToken serves the fixture's engine and database behind another
// UI and API with token: the same deployment restarted with a new token.
func (f *fixture) serveWithToken(t *testing.T, token string) *httptest.Server {
	t.Helper()
	ui := webui.New(f.e, &webui.Options{Token: token, Pool: f.db.Pool, APIError: httpapi.ErrorCode})
	srv := httptest.NewUnstartedServer(nil)
	srv.Config.Handler = httpapi.New(f.e, &httpapi.Options{Token: token, UI: ui, Pool: f.db.Pool, ListenAddr: srv.Listener.Addr().String()})
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// signIn signs c in with token and returns its session's CSRF token.
func (c *client) signIn(token string) string {
	c.t.Helper()
	code, h, body := c.do("POST", "/ui/login", url.Values{"token": {token}}, nil)
	require.Equal(c.t, http.StatusSeeOther, code, body)
	require.Equal(c.t, "/ui/", h.Get("Location"))
	return c.csrf("/ui/runs")
}

// A session lives only as long as the token it was opened with: a server
// restarted with a new token (a leaked one rotated) refuses the cookies
// the old token opened (found by an attack pass: they lasted their 12
// hours).
func TestSessionEndsWhenTheTokenChanges(t *testing.T) {
	t.Parallel()
	const oldToken, newToken = "0123456789abcdef-old-ui-token", "0123456789abcdef-new-ui-token"
	f := newFixture(t, oldToken)
	c := newClient(t, f.srv.URL)
	csrf := c.signIn(oldToken)
	code, _, _ := c.do("GET", "/ui/runs", nil, nil)
	require.Equal(t, 200, code)

	rotated := f.serveWithToken(t, newToken)
	u, _ := url.Parse(f.srv.URL + "/ui/")
	moved := newClient(t, rotated.URL)
	ru, _ := url.Parse(rotated.URL + "/ui/")
	moved.http.Jar.SetCookies(ru, c.http.Jar.Cookies(u))
	require.Len(t, moved.http.Jar.Cookies(ru), 1)
	code, h, _ := moved.do("GET", "/ui/runs", nil, nil)
	require.Equal(t, http.StatusSeeOther, code, "the old token's session does not sign in under the new token")
	require.True(t, strings.HasPrefix(h.Get("Location"), "/ui/login"), h.Get("Location"))
	code, _, body := moved.do("POST", "/ui/runs/"+f.runs["waiting"].String()+"/cancel", url.Values{"csrf": {csrf}}, nil)
	require.Equal(t, http.StatusUnauthorized, code, "nor act, even with its CSRF token")
	require.Contains(t, body, "sign in again")
	run, err := f.e.GetRun(context.Background(), f.runs["waiting"])
	require.NoError(t, err)
	require.Nil(t, run.CancelRequestedAt)

	// The new token opens sessions of its own, which the old token's
	// server refuses in turn.
	fresh := newClient(t, rotated.URL)
	fresh.signIn(newToken)
	code, _, _ = fresh.do("GET", "/ui/runs", nil, nil)
	require.Equal(t, 200, code)
	back := newClient(t, f.srv.URL)
	back.http.Jar.SetCookies(u, fresh.http.Jar.Cookies(ru))
	code, _, _ = back.do("GET", "/ui/runs", nil, nil)
	require.Equal(t, http.StatusSeeOther, code)
}

// Sign out everywhere ends every session, from the UI (a form with the
// CSRF token) or the API (POST /v1/ui-sessions/revoke with the bearer
// token).
func TestSignOutEverywhere(t *testing.T) {
	t.Parallel()
	const token = "0123456789abcdef-ui-everywhere"
	f := newFixture(t, token)
	a, b := newClient(t, f.srv.URL), newClient(t, f.srv.URL)
	csrf := a.signIn(token)
	b.signIn(token)
	_, _, body := a.do("GET", "/ui/", nil, nil)
	require.Contains(t, body, `action="/ui/logout-everywhere"`)
	require.Contains(t, body, "Sign out everywhere")

	code, _, body := a.do("POST", "/ui/logout-everywhere", url.Values{}, nil)
	require.Equal(t, http.StatusForbidden, code, "no CSRF token")
	require.Contains(t, body, "security token")
	code, _, _ = a.do("POST", "/ui/logout-everywhere", url.Values{"csrf": {csrf}}, map[string]string{"Origin": "https://evil.example"})
	require.Equal(t, http.StatusForbidden, code, "another site")
	code, _, _ = b.do("GET", "/ui/runs", nil, nil)
	require.Equal(t, 200, code, "a refused form ended nothing")

	code, h, _ := a.do("POST", "/ui/logout-everywhere", url.Values{"csrf": {csrf}}, nil)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "/ui/login?done=signed-out-everywhere", h.Get("Location"))
	require.Contains(t, h.Get("Set-Cookie"), "Max-Age=0")
	code, _, body = a.do("GET", h.Get("Location"), nil, nil)
	require.Equal(t, 200, code)
	require.Contains(t, body, "Every browser is signed out")
	for name, c := range map[string]*client{"this browser": a, "another browser": b} {
		code, _, _ = c.do("GET", "/ui/runs", nil, nil)
		require.Equal(t, http.StatusSeeOther, code, name)
	}

	// Over the API: the bearer token is needed, and the answer counts the
	// sessions ended.
	a.signIn(token)
	b.signIn(token)
	api := func(auth string) (int, string) {
		req, err := http.NewRequest("POST", f.srv.URL+"/v1/ui-sessions/revoke", nil)
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(raw)
	}
	code, _ = api("")
	require.Equal(t, http.StatusUnauthorized, code)
	code, _ = api("0123456789abcdef-not-the-token")
	require.Equal(t, http.StatusUnauthorized, code)
	code, _, _ = a.do("GET", "/ui/runs", nil, nil)
	require.Equal(t, 200, code, "a refused call ended nothing")
	code, raw := api(token)
	require.Equal(t, 200, code, raw)
	require.JSONEq(t, `{"revoked": 2}`, raw)
	for name, c := range map[string]*client{"a": a, "b": b} {
		code, _, _ = c.do("GET", "/ui/runs", nil, nil)
		require.Equal(t, http.StatusSeeOther, code, name)
	}
	code, raw = api(token)
	require.Equal(t, 200, code, raw)
	require.JSONEq(t, `{"revoked": 0}`, raw)
}

// Wrong tokens are limited per client address, and only wrong ones: a
// client that sends 21 wrong tokens a minute gets 429 for its wrong
// tokens, and a correct token is never refused (found by an attack pass:
// the limit counted every client together and was checked before the
// token, so anyone could lock every operator out).
func TestSignInLimitNeverRefusesTheToken(t *testing.T) {
	t.Parallel()
	const token = "0123456789abcdef-ui-limit-token"
	f := newFixture(t, token)
	guesser := newClient(t, f.srv.URL)
	for i := range 20 {
		code, _, _ := guesser.do("POST", "/ui/login", url.Values{"token": {fmt.Sprintf("guess-%d", i)}}, nil)
		require.Equal(t, http.StatusUnauthorized, code, i)
	}
	for range 5 {
		code, _, body := guesser.do("POST", "/ui/login", url.Values{"token": {"guess"}}, nil)
		require.Equal(t, http.StatusTooManyRequests, code)
		require.Contains(t, body, "Too many wrong tokens")
		require.NotContains(t, body, token)
	}
	// Another address is counted apart: its wrong token is a plain 401.
	elsewhere := newClient(t, f.srv.URL)
	elsewhere.http.Transport = &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext}
	code, _, body := elsewhere.do("POST", "/ui/login", url.Values{"token": {"typo"}}, nil)
	require.Equal(t, http.StatusUnauthorized, code, "another client address has its own count")
	require.NotContains(t, body, "Too many wrong tokens")

	operator := newClient(t, f.srv.URL) // from the guesser's address, as behind one proxy
	code, h, _ := operator.do("POST", "/ui/login", url.Values{"token": {token}, "next": {"/ui/runs"}}, nil)
	require.Equal(t, http.StatusSeeOther, code, "the token signs in whatever wrong tokens came before")
	require.Equal(t, "/ui/runs", h.Get("Location"))
	code, _, _ = operator.do("GET", "/ui/runs", nil, nil)
	require.Equal(t, 200, code)
	code, _, _ = guesser.do("POST", "/ui/login", url.Values{"token": {token}}, nil)
	require.Equal(t, http.StatusSeeOther, code, "the guesser's own correct token too")
}

// /ui/static/ serves its files, and no listing of them.
func TestStaticServesFilesNotListings(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "0123456789abcdef-ui-static-token")
	c := newClient(t, f.srv.URL)
	for _, p := range []string{"/ui/static/", "/ui/static/?C=M;O=D", "/ui/static/nope.css", "/ui/static/style.css/"} {
		code, _, body := c.do("GET", p, nil, nil)
		require.Equal(t, http.StatusNotFound, code, p)
		require.NotContains(t, body, `href="style.css"`, p, "no listing")
		require.NotContains(t, body, `href="app.js"`, p, "no listing")
	}
	code, _, _ := c.do("GET", "/ui/static", nil, nil)
	require.NotEqual(t, 200, code)
	for _, p := range []string{"/ui/static/style.css", "/ui/static/app.js"} {
		code, h, _ := c.do("GET", p, nil, nil)
		require.Equal(t, 200, code, p)
		require.Equal(t, "max-age=300", h.Get("Cache-Control"), p)
	}
}

// A terminated run's page names the steps it was terminated in the
// middle of (recorded started), with their request IDs: each may have
// taken effect, and nothing undoes it. A run terminated between steps
// shows no such notice.
func TestRunPageShowsStepsInFlightOfATerminatedRun(t *testing.T) {
	t.Parallel()
	inCall, release := make(chan struct{}), make(chan struct{})
	hang := engine.Define("page-in-flight", func(ctx *engine.Context, _ int) (string, error) {
		return engine.RunActivity(ctx, "charge", func(context.Context, *engine.ActivityAttempt) (string, error) {
			close(inCall)
			<-release
			return "ch_1", nil
		}, nil)
	}, nil)
	quiet := engine.Define("page-quiet", func(ctx *engine.Context, _ int) (int, error) {
		return engine.AwaitSignal[int](ctx, "never", 0)
	}, nil)
	db := enginetest.NewDB(t)
	e := enginetest.NewEngine(t, db, &engine.Config{Logger: slog.New(slog.DiscardHandler)}, true, hang, quiet)
	released := false
	t.Cleanup(func() {
		if !released {
			close(release)
		}
	})
	ctx := context.Background()
	res, err := hang.Start(ctx, e, 0, nil)
	require.NoError(t, err)
	<-inCall
	require.NoError(t, e.Terminate(ctx, res.RunID, &engine.TerminateOpts{Reason: "stuck", By: "ann"}))
	released = true
	close(release)
	run, err := e.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Len(t, run.Steps, 1)
	q, err := quiet.Start(ctx, e, 0, nil)
	require.NoError(t, err)
	waitStatus(t, e, q.RunID, engine.StatusWaiting)
	require.NoError(t, e.Terminate(ctx, q.RunID, &engine.TerminateOpts{Reason: "not needed"}))

	ui := webui.New(e, &webui.Options{Pool: db.Pool, APIError: httpapi.ErrorCode})
	srv := httptest.NewUnstartedServer(nil)
	srv.Config.Handler = httpapi.New(e, &httpapi.Options{UI: ui, ListenAddr: srv.Listener.Addr().String()})
	srv.Start()
	t.Cleanup(srv.Close)
	c := newClient(t, srv.URL)
	code, _, body := c.do("GET", "/ui/runs/"+res.RunID.String(), nil, nil)
	require.Equal(t, 200, code)
	require.Contains(t, body, "Terminated with 1 step in flight")
	require.Contains(t, body, "check each with the service it called, by its request ID")
	require.Regexp(t, `step #0 <strong>charge</strong> \(activity\), request ID <code>`+run.Steps[0].RequestID.String()+`</code>`, body)
	code, _, body = c.do("GET", "/ui/runs/"+q.RunID.String(), nil, nil)
	require.Equal(t, 200, code)
	require.NotContains(t, body, "in flight", "a run terminated while it waited")
}

// A run whose workflow version no process registers shows what it waits
// for on its page, and the overview counts such runs by version.
func TestPagesShowARunWaitingForItsVersion(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "")
	c := newClient(t, f.srv.URL)
	legacy := engine.Define("legacy", func(ctx *engine.Context, _ string) (string, error) { return "", nil }, &engine.WorkflowOpts{Version: 3})
	starter := enginetest.NewEngine(t, f.db, nil, false, legacy)
	r, err := legacy.Start(context.Background(), starter, "x", nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		run, err := f.e.GetRun(context.Background(), r.RunID)
		require.NoError(t, err)
		return run.WaitingSince != nil // handed back
	}, 30*time.Second, 20*time.Millisecond, "the fixture's engine, which does not register legacy, hands the run back")

	code, _, body := c.do("GET", "/ui/runs/"+r.RunID.String(), nil, nil)
	require.Equal(t, 200, code)
	require.Regexp(t, `<dt>Waits for</dt><dd class="warn" data-waiting-for>a process that registers legacy v3, since \d{4}-\d\d-\d\d [0-9:]+Z \(`, body)
	code, _, body = c.do("GET", "/ui/", nil, nil)
	require.Equal(t, 200, code)
	require.Regexp(t, `(?s)Waiting for a process of their version.*<a href="/ui/runs\?workflow=legacy&workflow_version=3&status=open">a process that registers legacy v3</a></td>\s*<td>1</td>`, body)
}

// A dead job's page replays it onto another workflow version when its
// "Onto version" field is filled: the run moves to that version, and the
// page refuses a version that is not one.
func TestDeadJobPageReplaysOntoAVersion(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "")
	c := newClient(t, f.srv.URL)
	jobs, _, err := f.e.ListDeadJobs(context.Background(), engine.ListDeadJobsParams{RunID: f.runs["dead"], OpenOnly: true})
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	page := "/ui/dead-jobs/" + jobs[0].ID.String()
	code, _, body := c.do("GET", page, nil, nil)
	require.Equal(t, 200, code)
	require.Contains(t, body, `<label for="r-version">Onto version</label><input id="r-version" name="workflow_version" inputmode="numeric" placeholder="v1 (its own)">`)
	csrf := c.csrf(page)
	code, _, body = c.do("POST", page+"/replay", url.Values{"csrf": {csrf}, "workflow_version": {"two"}}, nil)
	require.Equal(t, 400, code, body)
	require.Contains(t, body, `onto version: "two" is not a workflow version (1 or more)`)
	code, _, body = c.do("POST", page+"/replay", url.Values{"csrf": {csrf}, "workflow_version": {"4"}}, nil)
	require.Equal(t, 400, code, body)
	require.Contains(t, body, `no live engine process on queue "pgdurable" registers workflow "ship" version 4 (they register [1])`)
	// The fix, deployed as ship v4: the replay moves the run there.
	enginetest.NewEngine(t, f.db, nil, true, engine.Define("ship", func(ctx *engine.Context, in order) (int, error) {
		return engine.Step(ctx, "ship", func(context.Context) (int, error) { return 4, nil }, nil)
	}, &engine.WorkflowOpts{Version: 4}))
	code, _, body = c.do("POST", page+"/replay", url.Values{"csrf": {csrf}, "workflow_version": {"4"}, "note": {"moved"}}, nil)
	require.Less(t, code, 400, body)
	run := enginetest.RequireRunCompleted(context.Background(), t, f.e, f.runs["dead"], 0)
	require.Equal(t, 4, run.WorkflowVersion)
	job, err := f.e.GetDeadJob(context.Background(), jobs[0].ID)
	require.NoError(t, err)
	require.Equal(t, "replayed onto version 4 (was 1). moved", job.Note)
}

// A run's page names the change (engine.Patched) the run took, on the step
// after it.
func TestRunPageShowsTheChangesARunTook(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "")
	c := newClient(t, f.srv.URL)
	patched := engine.Define("patched", func(ctx *engine.Context, _ string) (int, error) {
		if engine.Patched(ctx, "fraud-check") {
			return engine.Step(ctx, "fraud_check", func(context.Context) (int, error) { return 1, nil }, nil)
		}
		return 0, nil
	}, nil)
	e := enginetest.NewEngine(t, f.db, &engine.Config{Queue: "patched"}, true, patched)
	r, err := patched.Start(context.Background(), e, "x", nil)
	require.NoError(t, err)
	enginetest.RequireRunCompleted(context.Background(), t, e, r.RunID, 0)
	code, _, body := c.do("GET", "/ui/runs/"+r.RunID.String(), nil, nil)
	require.Equal(t, 200, code)
	require.Contains(t, body, `fraud_check<br><span class="tag" title="engine.Patched: the run took this change before this step">took change fraud-check</span>`)
}

// A run waiting in a flow-controlled queue says on its page which queue,
// and what holds it there.
func TestRunPageShowsWhatHoldsAQueuedRun(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "")
	c := newClient(t, f.srv.URL)
	queued := engine.Define("queued-page", func(ctx *engine.Context, _ string) (string, error) { return "", nil }, nil)
	starter := enginetest.NewEngine(t, f.db, nil, true, queued) // a live process registers it: the queue is what holds it
	r, err := queued.Start(context.Background(), starter, "x", &engine.StartOpts{Queue: "unserved", QueueKey: "cus_1", Priority: 2})
	require.NoError(t, err)
	code, _, body := c.do("GET", "/ui/runs/"+r.RunID.String(), nil, nil)
	require.Equal(t, 200, code)
	require.Contains(t, body, `<dt>Queue</dt><dd data-queue>unserved, key <code>cus_1</code>, priority 2</dd>`)
	require.Regexp(t, `<dt>Waits for</dt><dd class="warn" data-waiting-for>a process that serves queue unserved, ready since \d{4}-\d\d-\d\d [0-9:]+Z \(`, body)
}

// The queues page lists each queue with its backlog, and pauses and
// resumes it, recording who and why.
func TestQueuesPagePausesAndResumes(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "")
	c := newClient(t, f.srv.URL)
	code, _, body := c.do("GET", "/ui/queues", nil, nil)
	require.Equal(t, 200, code)
	require.Contains(t, body, "No queues.")
	wf := engine.Define("queued-ui", func(ctx *engine.Context, _ string) (string, error) { return "", nil }, &engine.WorkflowOpts{Queue: "payments"})
	served := enginetest.NewEngine(t, f.db, &engine.Config{Queues: map[string]engine.QueueOpts{"payments": {Concurrency: 3, KeyConcurrency: 1}}}, true, wf)
	require.NoError(t, served.PauseQueue(context.Background(), "payments", nil))
	_, err := wf.Start(context.Background(), served, "x", nil)
	require.NoError(t, err)
	require.NoError(t, served.ResumeQueue(context.Background(), "payments", "setup"))
	code, _, body = c.do("GET", "/ui/queues", nil, nil)
	require.Equal(t, 200, code)
	require.Contains(t, body, `<tr data-queue="payments">`)
	require.Contains(t, body, `1 per key`)
	csrf := c.csrf("/ui/queues")
	code, _, body = c.do("POST", "/ui/queues/payments/pause", url.Values{"csrf": {csrf}, "reason": {"processor down"}}, nil)
	require.Less(t, code, 400, body)
	_, _, body = c.do("GET", "/ui/queues?done=queue-paused", nil, nil)
	require.Contains(t, body, "Queue paused")
	require.Regexp(t, `status-paused">paused</span> processor down <span class="muted">by web UI`, body)
	queues, err := served.ListQueues(context.Background())
	require.NoError(t, err)
	require.True(t, queues[0].Paused)
	require.Equal(t, "web UI", queues[0].PausedBy)
	code, _, body = c.do("POST", "/ui/queues/payments/resume", url.Values{"csrf": {csrf}}, nil)
	require.Less(t, code, 400, body)
	_, _, body = c.do("GET", "/ui/queues?done=queue-resumed", nil, nil)
	require.Contains(t, body, "Queue resumed")
	require.Contains(t, body, `status-active">serving</span>`)
	code, _, _ = c.do("POST", "/ui/queues/payments/pause", url.Values{"reason": {"no csrf"}}, nil)
	require.GreaterOrEqual(t, code, 400, "a form without its CSRF token is refused")
	code, _, _ = c.do("POST", "/ui/queues/nope/pause", url.Values{"csrf": {csrf}}, nil)
	require.Equal(t, 404, code)
}
