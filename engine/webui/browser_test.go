package webui_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// browser starts headless Chromium (Debian's package: /usr/bin/chromium,
// or $CHROMIUM) for t. Without one the test is skipped, unless
// PGDURABLE_REQUIRE_BROWSER is set (CI sets it, after installing it).
func browser(t *testing.T) context.Context {
	t.Helper()
	path := os.Getenv("CHROMIUM")
	for _, p := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if path != "" {
			break
		}
		path, _ = exec.LookPath(p)
	}
	if path == "" {
		if os.Getenv("PGDURABLE_REQUIRE_BROWSER") != "" {
			t.Fatal("no Chromium found (PATH, $CHROMIUM) and PGDURABLE_REQUIRE_BROWSER is set: apt-get install chromium")
		}
		t.Skip("no Chromium on this machine (apt-get install chromium); set PGDURABLE_REQUIRE_BROWSER to fail instead")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1366, 900),
		chromedp.UserDataDir(t.TempDir()),
		// The machine's network is closed: no background fetches that fail.
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-quic", true), chromedp.Flag("no-first-run", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(func() { cancelTimeout(); cancel(); cancelAlloc() })
	require.NoError(t, chromedp.Do(ctx), "starting Chromium")
	return ctx
}

// shoot saves a full-page PNG of what the browser shows as name.png.
func shoot(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644))
}

// tab drives one headless Chromium tab over the UI at base, failing t on
// any error.
type tab struct {
	t    *testing.T
	ctx  context.Context
	base string
}

// text is the text of the first element sel selects.
func (b *tab) text(sel string) string {
	b.t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(b.t, err)
	return s
}

// submit clicks a form's button and waits for the page it leads to.
func (b *tab) submit(sel string) {
	b.t.Helper()
	_, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](`window.__before = true`))
	require.NoError(b.t, err)
	require.NoError(b.t, chromedp.Do(b.ctx, chromedp.Click(chromedp.CSS(sel))))
	deadline := time.Now().Add(20 * time.Second)
	for {
		fresh, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](`window.__before === undefined && document.readyState === "complete"`))
		if err == nil && fresh {
			break
		}
		require.True(b.t, time.Now().Before(deadline), "no new page after clicking %s", sel)
		time.Sleep(50 * time.Millisecond)
	}
}

// open navigates to path and waits for its heading.
func (b *tab) open(path string) {
	b.t.Helper()
	require.NoError(b.t, chromedp.Do(b.ctx, chromedp.Navigate(b.base+path), chromedp.WaitVisible(chromedp.CSS("main h1"))))
}

// TestBrowserOperatorDesk opens every page against a real engine with runs
// in every state, in headless Chromium, saves a screenshot of each, and
// does what an operator does: replays a dead job and watches its run
// complete, discards another from the list, counts and cancels runs by
// filter, pauses and triggers a schedule, and sends a signal.
func TestBrowserOperatorDesk(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	f := newFixture(t, "")
	dir := screenshotDir(t)
	t.Logf("screenshots in %s", dir)
	base := f.srv.URL
	b := &tab{t: t, ctx: ctx, base: base}
	text, submit, open := b.text, b.submit, b.open

	for _, p := range []struct{ path, shot, want string }{
		{"/ui/", "overview", "open dead jobs"},
		{"/ui/runs", "runs", "approval-7"},
		{"/ui/runs/" + f.runs["compensated"].String(), "run-compensated", "card declined"},
		{"/ui/runs/" + f.runs["dead"].String(), "run-dead", "Parked as a dead job"},
		{"/ui/schedules", "schedules", "nightly-report"},
		{"/ui/workflows", "workflows", "order"},
	} {
		open(p.path)
		require.Contains(t, text("main"), p.want, p.path)
		shoot(t, ctx, dir, p.shot)
	}

	// Top-level runs only: tick the box, and the child run is hidden.
	open("/ui/runs?workflow_id_prefix=family-")
	require.Contains(t, text("tbody"), "family-1-kid")
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#f-top"))))
	submit(`form.filters button[type="submit"]`)
	require.NotContains(t, text("tbody"), "family-1-kid")
	require.Contains(t, text("tbody"), "family-1")
	checked, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector("#f-top").checked`))
	require.NoError(t, err)
	require.True(t, checked, "the box stays ticked on the filtered page")

	// Every form control has a label a screen reader can read.
	open("/ui/dead-jobs")
	unlabelled, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("input:not([type=hidden]), select, textarea")]
			.filter(e => !e.labels.length && !e.getAttribute("aria-label")).map(e => e.name)`))
	require.NoError(t, err)
	require.Empty(t, unlabelled)
	shoot(t, ctx, dir, "dead-jobs")

	// Replay a dead job from its page once the cause is fixed; the run
	// completes.
	f.fixed.Store(true)
	jobs, _, err := f.e.ListDeadJobs(context.Background(), engine.ListDeadJobsParams{RunID: f.runs["dead"], OpenOnly: true})
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	open("/ui/dead-jobs/" + jobs[0].ID.String())
	require.Contains(t, text("main"), "carrier API returned 503")
	shoot(t, ctx, dir, "dead-job")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS("#r-note"), "carrier is back"),
		chromedp.SendKeys(chromedp.CSS("#r-by"), "ops-alice")))
	submit(`form[action$="/replay"] button`)
	require.Contains(t, text(".notice"), "Dead job replayed")
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(text("h1 .status"), "completed") {
		require.True(t, time.Now().Before(deadline), "the replayed run completes; page says %q", text("h1"))
		time.Sleep(200 * time.Millisecond)
		require.NoError(t, chromedp.Do(ctx, chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("main h1"))))
	}
	require.Contains(t, text("main"), "ship")
	// Its attempt history: the two failures, the replay, the attempt that
	// completed it.
	attempts := text("table.attempts tbody")
	for _, want := range []string{"#1\tretrying\ttransient carrier API returned 503", "#2\tparked\ttransient retries exhausted",
		"—\treplayed\ta dead job's replay", "#1\tcompleted"} {
		require.Contains(t, attempts, want)
	}
	shoot(t, ctx, dir, "run-replayed")
	j, err := f.e.GetDeadJob(context.Background(), jobs[0].ID)
	require.NoError(t, err)
	require.Equal(t, "replayed", j.Resolution)
	require.Equal(t, "ops-alice", j.ResolvedBy)
	require.Equal(t, "carrier is back", j.Note)

	// Discard the other one by ticking it on the list.
	open("/ui/dead-jobs")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`input[name="id"]`)),
		chromedp.SendKeys(chromedp.CSS("#b-note"), "duplicate order")))
	submit(`button[value="discard"]`)
	require.Contains(t, text(".notice"), "1 done")
	run, err := f.e.GetRun(context.Background(), f.runs["dead2"])
	require.NoError(t, err)
	require.Equal(t, engine.StatusDead, run.Status, "a discarded job leaves its run dead")

	// Cancel the waiting runs by filter: a dry run counts first.
	open("/ui/runs?status=waiting&workflow_id_prefix=approval-")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`details.bulk summary`))))
	submit(`details.bulk button`)
	require.Contains(t, text("main"), "Matching runs: 1. Nothing has changed yet.")
	shoot(t, ctx, dir, "cancel-matching")
	submit(`button.danger`)
	require.Contains(t, text(".notice"), "1 done")
	waitStatus(t, f.e, f.runs["waiting"], engine.StatusCancelled)

	// Pause, then trigger, a schedule.
	open("/ui/schedules/nightly-report")
	require.Contains(t, text("main"), "Next fires")
	submit(`form[action$="/pause"] button`)
	require.Contains(t, text(".notice"), "Schedule paused")
	submit(`form[action$="/trigger"] button`)
	require.Contains(t, text(".notice"), "Schedule triggered")
	require.Contains(t, text("main"), "started")
	shoot(t, ctx, dir, "schedule")
	s, err := f.e.GetSchedule(context.Background(), "nightly-report")
	require.NoError(t, err)
	require.True(t, s.Paused)
	waitStatus(t, f.e, *s.LastRunID, engine.StatusCompleted)

	// An attempt lost with its worker, in the run's attempt history.
	lost := f.lostWorkerRun(t)
	open("/ui/runs/" + lost.String())
	attempts = text("table.attempts tbody")
	require.Contains(t, attempts, "#1\tretrying worker lost\tworker_lost")
	require.Contains(t, attempts, "#2\tcompleted")
	visible, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector("details.attempts").open && document.querySelector("strong.lost").offsetHeight > 0`))
	require.NoError(t, err)
	require.True(t, visible, "the history is open and the lost attempt shows")
	shoot(t, ctx, dir, "run-attempts")

	// The runs list has an error column.
	open("/ui/runs?status=dead")
	require.Contains(t, text("thead"), "Error")
	require.Contains(t, text("tbody"), "carrier API returned 503")

	// The run page of a completed run, for the README.
	open("/ui/runs/" + f.runs["completed"].String())
	require.Contains(t, text("main"), "request ID")
	shoot(t, ctx, dir, "run")
}

// TestBrowserSignOutEverywhere signs in with the token in headless
// Chromium and presses "Sign out everywhere": the browser lands on the
// sign-in page saying so, and another browser's session has ended too.
func TestBrowserSignOutEverywhere(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	const token = "0123456789abcdef-browser-token"
	f := newFixture(t, token)
	other := newClient(t, f.srv.URL)
	other.signIn(token)

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(f.srv.URL+"/ui/runs"), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), token), chromedp.Submit(chromedp.CSS("#token")),
		chromedp.WaitVisible(chromedp.CSS(`form[action="/ui/logout-everywhere"] button`))))
	loc, err := chromedp.Run(ctx, chromedp.Location())
	require.NoError(t, err)
	require.Equal(t, f.srv.URL+"/ui/runs", loc, "signed in, back where it was going")
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`form[action="/ui/logout-everywhere"] button`)),
		chromedp.WaitVisible(chromedp.CSS(".notice"))))
	notice, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(".notice")))
	require.NoError(t, err)
	require.Contains(t, notice, "Every browser is signed out")

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(f.srv.URL+"/ui/runs"), chromedp.WaitVisible(chromedp.CSS("#token"))))
	code, _, _ := other.do("GET", "/ui/runs", nil, nil)
	require.Equal(t, 303, code, "the other browser is signed out too")
}

// TestBrowserQueues pauses a queue from the Queues page with a reason, in
// headless Chromium: the page, the overview and a run waiting in the
// queue say it is paused, why and by whom; resuming starts the run.
func TestBrowserQueues(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	f := newFixture(t, "")
	dir := screenshotDir(t)
	b := &tab{t: t, ctx: ctx, base: f.srv.URL}
	wf := engine.Define("queued-browser", func(ctx *engine.Context, in string) (string, error) {
		return engine.Step(ctx, "work", func(context.Context) (string, error) { return in, nil }, nil)
	}, &engine.WorkflowOpts{Queue: "payments"})
	served := enginetest.NewEngine(t, f.db, nil, true, wf, engine.DefineQueue("payments", engine.QueueOpts{Concurrency: 3, KeyConcurrency: 1}))

	b.open("/ui/queues")
	require.Contains(t, b.text(`tr[data-queue="payments"]`), "serving")
	require.Contains(t, b.text(`tr[data-queue="payments"]`), "1 per key")
	require.NoError(t, chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS(`tr[data-queue="payments"] input[name="reason"]`), "card processor down")))
	b.submit(`tr[data-queue="payments"] form[action$="/pause"] button`)
	require.Contains(t, b.text(".notice"), "Queue paused")
	row := b.text(`tr[data-queue="payments"]`)
	require.Contains(t, row, "paused card processor down")
	require.Contains(t, row, "by web UI")
	shoot(t, ctx, dir, "queues")

	res, err := wf.Start(context.Background(), served, "x", &engine.StartOpts{QueueKey: "cus_1"})
	require.NoError(t, err)
	b.open("/ui/runs/" + res.RunID.String())
	require.Contains(t, b.text("[data-queue]"), "payments, key cus_1")
	require.Contains(t, b.text("[data-waiting-for]"), "queue payments is paused (card processor down, by web UI), ready since")
	b.open("/ui/")
	overview := b.text(`table[data-queues] tr[data-queue="payments"]`)
	require.Contains(t, overview, "paused")
	require.Regexp(t, `paused card processor down by web UI, [^\t]+\t1\t`, overview, "one run ready")
	shoot(t, ctx, dir, "overview-queues")

	b.open("/ui/queues")
	b.submit(`tr[data-queue="payments"] form[action$="/resume"] button`)
	require.Contains(t, b.text(".notice"), "Queue resumed")
	require.Contains(t, b.text(`tr[data-queue="payments"]`), "serving")
	waitStatus(t, f.e, res.RunID, engine.StatusCompleted)
}
