package engine_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginemetrics"
	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/engine/httpapi"
	"github.com/pgdurable/pgdurable/internal/crashtest"
)

// A crash worker registers the versions of crash-checkout that
// envCheckoutVersions lists ("1", "2" or "1,2"; default both), and names
// itself envProcessName in what its steps return.
const (
	envCheckoutVersions = "PGDURABLE_TEST_CHECKOUT_VERSIONS"
	envProcessName      = "PGDURABLE_TEST_PROCESS"
)

// checkoutVersion is version v of crash-checkout: reserve, (v2: a fraud
// check behind a patch), wait for approval, charge. Its output says which
// version ran each end and in which process.
func checkoutVersion(v int) *engine.Workflow[string, string] {
	here := func(context.Context) (string, error) {
		return fmt.Sprintf("v%d on %s", v, os.Getenv(envProcessName)), nil
	}
	return engine.Define("crash-checkout", func(ctx *engine.Context, in string) (string, error) {
		reserved, err := engine.Step(ctx, "reserve", here, nil)
		if err != nil {
			return "", err
		}
		if v >= 2 && engine.Patched(ctx, "fraud-check") {
			if err := step(ctx, "fraud_check"); err != nil {
				return "", err
			}
		}
		if _, err := engine.AwaitSignal[string](ctx, "approve", time.Hour); err != nil {
			return "", err
		}
		charged, err := engine.Step(ctx, "charge", here, nil)
		if err != nil {
			return "", err
		}
		return reserved + ", charged by " + charged, nil
	}, &engine.WorkflowOpts{Version: v})
}

// checkoutVersions are the versions of crash-checkout a crash worker
// registers (see envCheckoutVersions).
func checkoutVersions() []engine.Registration {
	var out []engine.Registration
	for _, v := range strings.Split(cmp.Or(os.Getenv(envCheckoutVersions), "1,2"), ",") {
		n, err := strconv.Atoi(v)
		if err != nil {
			panic(fmt.Sprintf("%s=%q: want versions like 1,2", envCheckoutVersions, os.Getenv(envCheckoutVersions)))
		}
		out = append(out, checkoutVersion(n))
	}
	return out
}

// checkoutWorker starts a worker process that registers versions
// ("1", "2", "1,2") of crash-checkout, named name.
func checkoutWorker(t *testing.T, db *enginetest.DB, versions, name string) *exec.Cmd {
	t.Helper()
	return crashtest.StartWorker(t, db, 0, envCheckoutVersions+"="+versions, envProcessName+"="+name)
}

// startCheckouts starts n runs of w (by its version) through client, or,
// with w nil, by name (the latest version registered), and waits until each
// waits for its approval.
func startCheckouts(ctx context.Context, t *testing.T, client *engine.Engine, w *engine.Workflow[string, string], n int) []uuid.UUID {
	t.Helper()
	ids := make([]uuid.UUID, n)
	for i := range ids {
		var id uuid.UUID
		if w != nil {
			r, err := w.Start(ctx, client, "order", nil)
			require.NoError(t, err)
			id = r.RunID
		} else {
			r, err := client.StartJSON(ctx, "crash-checkout", []byte(`"order"`), nil)
			require.NoError(t, err)
			id = r.RunID
		}
		ids[i] = id
	}
	for _, id := range ids {
		waitStatus(t, client, id, engine.StatusWaiting, 60*time.Second)
	}
	return ids
}

// approveAll signals each run and waits for each to complete; it returns
// their outputs.
func approveAll(ctx context.Context, t *testing.T, client *engine.Engine, ids []uuid.UUID) []string {
	t.Helper()
	for _, id := range ids {
		require.NoError(t, client.Signal(ctx, id.String(), "approve", "ok", nil))
	}
	out := make([]string, len(ids))
	for i, id := range ids {
		run := waitStatus(t, client, id, engine.StatusCompleted, 60*time.Second)
		require.NoError(t, json.Unmarshal(run.Output, &out[i]))
	}
	return out
}

func requireNoDeadJobs(ctx context.Context, t *testing.T, e *engine.Engine) {
	t.Helper()
	dead, _, err := e.ListDeadJobs(ctx, engine.ListDeadJobsParams{})
	require.NoError(t, err)
	require.Empty(t, dead)
}

// A deploy across real processes: 50 runs waiting under v1 when a process
// that registers v1 and v2 replaces the v1 one all finish on v1's code, and
// new runs take v2's; in a rolling deploy a v1-only process and a v2-only
// one each work only their version's runs; with no v1 process left, v1
// runs wait, visibly (the run, the API, Stats and the metrics), overdue
// after Config.VersionWaitAlert, and finish once a v1 process starts. No
// run is ever parked.
func TestVersionsAcrossProcesses(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	v1, v2 := checkoutVersion(1), checkoutVersion(2)
	client := newEngine(t, db, &engine.Config{VersionWaitAlert: 2 * time.Second}, false, v1, v2)

	// 50 runs under v1 wait for approval; their process goes away, and the
	// deploy's process registers v1 and v2.
	a := checkoutWorker(t, db, "1", "a")
	waiting := startCheckouts(ctx, t, client, v1, 50)
	crashtest.Kill(t, a)
	b := checkoutWorker(t, db, "1,2", "b")
	for _, out := range approveAll(ctx, t, client, waiting) {
		require.Equal(t, "v1 on a, charged by v1 on b", out)
	}
	enginetest.RequireSteps(ctx, t, client, waiting[0], []string{"reserve", "approve", "charge"})
	fresh := startCheckouts(ctx, t, client, nil, 5)
	for _, out := range approveAll(ctx, t, client, fresh) {
		require.Equal(t, "v2 on b, charged by v2 on b", out)
	}
	steps := enginetest.RequireSteps(ctx, t, client, fresh[0], []string{"reserve", "fraud_check", "approve", "charge"})
	require.Equal(t, []string{"fraud-check"}, steps[1].Patches)
	requireNoDeadJobs(ctx, t, client)
	crashtest.Kill(t, b)

	// A rolling deploy: a v1-only process next to a v2-only one.
	a2 := checkoutWorker(t, db, "1", "a2")
	checkoutWorker(t, db, "2", "c")
	olds, news := startCheckouts(ctx, t, client, v1, 10), startCheckouts(ctx, t, client, nil, 10)
	for _, out := range approveAll(ctx, t, client, olds) {
		require.Equal(t, "v1 on a2, charged by v1 on a2", out)
	}
	for _, out := range approveAll(ctx, t, client, news) {
		require.Equal(t, "v2 on c, charged by v2 on c", out)
	}
	requireNoDeadJobs(ctx, t, client)

	// The v1 process stops: v1 runs wait for one, and say so.
	crashtest.Kill(t, a2)
	var orphans []uuid.UUID
	for range 5 {
		r, err := v1.Start(ctx, client, "order", nil)
		require.NoError(t, err)
		orphans = append(orphans, r.RunID)
	}
	const reason = "a process that registers crash-checkout v1"
	for _, id := range orphans {
		run := waitHandedBack(ctx, t, client, id)
		require.Equal(t, reason, run.WaitingFor)
		require.NotNil(t, run.WaitingSince)
		require.Equal(t, engine.StatusPending, run.Status)
		require.Empty(t, run.Steps, "no other version's code ran it")
	}
	api := httptest.NewServer(httpapi.New(client, &httpapi.Options{Token: "t"}))
	defer api.Close()
	var got struct {
		WaitingFor   string     `json:"waiting_for"`
		WaitingSince *time.Time `json:"waiting_since"`
	}
	getJSON(t, api.URL+"/v1/runs/"+orphans[0].String(), "t", &got)
	require.Equal(t, reason, got.WaitingFor)
	require.NotNil(t, got.WaitingSince)

	reg := prometheus.NewRegistry()
	enginemetrics.New(reg).WatchQueue(client)
	eventually(t, 30*time.Second, "the v1 runs to be overdue", func() bool {
		s, err := client.Stats(ctx)
		require.NoError(t, err)
		return len(s.VersionWaits) == 1 && s.VersionWaits[0].Overdue == 5
	})
	s, err := client.Stats(ctx)
	require.NoError(t, err)
	w := s.VersionWaits[0]
	require.Equal(t, "crash-checkout", w.Workflow)
	require.Equal(t, 1, w.Version)
	require.EqualValues(t, 5, w.Runs)
	require.Equal(t, reason, w.Reason())
	require.Equal(t, map[string]float64{
		"pgdurable_runs_waiting_for_version":         5,
		"pgdurable_runs_waiting_for_version_overdue": 5,
	}, versionWaitGauges(t, reg, "crash-checkout", "1"))
	requireNoDeadJobs(ctx, t, client)

	// A v1 process starts again: the runs run, on it, and wait no more.
	checkoutWorker(t, db, "1", "a3")
	for _, id := range orphans {
		run := waitStatus(t, client, id, engine.StatusWaiting, 60*time.Second)
		require.Empty(t, run.WaitingFor)
		require.Nil(t, run.WaitingSince)
	}
	for _, out := range approveAll(ctx, t, client, orphans) {
		require.Equal(t, "v1 on a3, charged by v1 on a3", out)
	}
	s, err = client.Stats(ctx)
	require.NoError(t, err)
	require.Empty(t, s.VersionWaits)
	require.Empty(t, versionWaitGauges(t, reg, "crash-checkout", "1"))
	requireNoDeadJobs(ctx, t, client)
}

// versionWaitGauges reads the version-wait gauges of workflow w, version
// v from reg: name → value, for those reported.
func versionWaitGauges(t *testing.T, reg *prometheus.Registry, w, v string) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "pgdurable_runs_waiting_for_version") || strings.HasSuffix(f.GetName(), "_seconds") {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["workflow"] == w && labels["version"] == v {
				out[f.GetName()] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// getJSON GETs url with the bearer token and decodes the 200 answer into
// v.
func getJSON(t *testing.T, url, token string, v any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	require.NoError(t, json.NewDecoder(bytes.NewReader(body)).Decode(v))
}

// A process that hands back a run whose version it does not register logs
// it (info: routine in a rolling deploy) and, once the run has waited
// Config.VersionWaitAlert, logs an error naming what it waits for.
func TestAnOverdueVersionWaitIsLogged(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := testCtx(t)
	var logs syncBuffer
	onlyV2 := newEngine(t, db, &engine.Config{VersionWaitAlert: 1500 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}, true, versioned(2))
	r, err := versioned(1).Start(ctx, onlyV2, "orphan", nil)
	require.NoError(t, err)
	eventually(t, 30*time.Second, "the overdue error", func() bool {
		return strings.Contains(logs.String(), "run has waited too long for a process that registers its workflow version")
	})
	out := logs.String()
	require.Contains(t, out, "level=INFO msg=\"workflow version not registered in this process")
	require.Contains(t, out, "level=ERROR msg=\"run has waited too long")
	require.Contains(t, out, "workflow=pinned")
	require.Contains(t, out, "workflow_version=1")
	run, err := onlyV2.GetRun(ctx, r.RunID)
	require.NoError(t, err)
	require.Equal(t, "a process that registers pinned v1", run.WaitingFor)
	require.Equal(t, engine.StatusPending, run.Status)
}

// syncBuffer is a bytes.Buffer for a logger written from several
// goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A compensating run whose version no process registers shows what it
// waits for, and Stats counts it, as a pending one.
func TestACompensatingRunWaitsForItsVersion(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := testCtx(t)
	var fails atomic.Int64
	define := func(v int) *engine.Workflow[string, string] {
		return engine.Define("undone", func(ctx *engine.Context, _ string) (string, error) {
			if err := step(ctx, "reserve"); err != nil {
				return "", err
			}
			if err := ctx.Compensate(engine.Undo{Name: "release", Fn: func(context.Context, *engine.ActivityAttempt) error {
				if fails.Add(1) == 1 {
					return errors.New("503") // retried after a second
				}
				return nil
			}, RetryPolicy: &engine.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 1, MaximumAttempts: 5}}); err != nil {
				return "", err
			}
			return "", engine.Permanent(errors.New("declined"))
		}, &engine.WorkflowOpts{Version: v})
	}
	v1 := define(1)
	old := newEngine(t, db, nil, true, v1)
	r, err := v1.Start(ctx, old, "x", nil)
	require.NoError(t, err)
	enginetest.RequireRunStatus(ctx, t, old, r.RunID, engine.StatusCompensating, 0)
	require.NoError(t, old.Stop(ctx))
	onlyV2 := newEngine(t, db, nil, true, define(2))
	eventually(t, 30*time.Second, "the compensating run to be handed back", func() bool {
		run, err := onlyV2.GetRun(ctx, r.RunID)
		require.NoError(t, err)
		return run.WaitingSince != nil && run.WaitingFor == "a process that registers undone v1" && run.Status == engine.StatusCompensating
	})
	s, err := onlyV2.Stats(ctx)
	require.NoError(t, err)
	require.Len(t, s.VersionWaits, 1)
	require.EqualValues(t, 1, s.VersionWaits[0].Runs)
	require.NoError(t, onlyV2.Stop(ctx))
	again := newEngine(t, db, nil, true, v1)
	run := enginetest.RequireRunStatus(ctx, t, again, r.RunID, engine.StatusCompensated, 0)
	require.Empty(t, run.WaitingFor)
}

// A process that starts takes the runs waiting for a version it registers
// at once, though their own tickets were snoozed far ahead by the
// processes that handed them back.
func TestAStartingProcessTakesTheRunsWaitingForItsVersion(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := testCtx(t)
	onlyV2 := newEngine(t, db, nil, true, versioned(2))
	r, err := versioned(1).Start(ctx, onlyV2, "orphan", nil)
	require.NoError(t, err)
	waitHandedBack(ctx, t, onlyV2, r.RunID)
	require.NoError(t, onlyV2.Stop(ctx))
	// As after many hand-backs: the run's ticket is due much later.
	_, err = db.Pool.Exec(ctx, `UPDATE pgdurable.river_job SET scheduled_at = now() + interval '1 hour' WHERE state IN ('scheduled', 'available')`)
	require.NoError(t, err)
	onlyV1 := newEngine(t, db, nil, true, versioned(1))
	run := waitStatus(t, onlyV1, r.RunID, engine.StatusWaiting, 10*time.Second)
	require.Empty(t, run.WaitingFor)
}

// A hand-back does not start a run: its timeout's clock starts at the
// pick-up that runs it, so a run that waits for a process of its version
// longer than its timeout still runs when one comes. A cancelled run that
// never ran ends cancelled at its next hand-back instead of waiting.
func TestAHandBackNeitherStartsNorStrandsARun(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := testCtx(t)
	onlyV2 := newEngine(t, db, nil, true, versioned(2))
	timed, err := versioned(1).Start(ctx, onlyV2, "timed", &engine.StartOpts{RunTimeout: time.Second})
	require.NoError(t, err)
	doomed, err := versioned(1).Start(ctx, onlyV2, "doomed", nil)
	require.NoError(t, err)
	for _, id := range []uuid.UUID{timed.RunID, doomed.RunID} {
		waitHandedBack(ctx, t, onlyV2, id)
	}
	require.NoError(t, onlyV2.Cancel(ctx, doomed.RunID))
	run := waitStatus(t, onlyV2, doomed.RunID, engine.StatusCancelled, 30*time.Second)
	require.Empty(t, run.WaitingFor)
	require.Empty(t, run.Steps)

	time.Sleep(1500 * time.Millisecond) // past the timeout, had a hand-back started its clock
	run, err = onlyV2.GetRun(ctx, timed.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, run.Status)
	require.Nil(t, run.StartedAt)
	require.Nil(t, run.DeadlineAt)
	require.Nil(t, run.CancelRequestedAt)
	s, err := onlyV2.Stats(ctx)
	require.NoError(t, err)
	require.Len(t, s.VersionWaits, 1)
	require.EqualValues(t, 1, s.VersionWaits[0].Runs, "the cancelled run is counted no more")

	require.NoError(t, onlyV2.Stop(ctx))
	onlyV1 := newEngine(t, db, nil, true, versioned(1))
	run = waitStatus(t, onlyV1, timed.RunID, engine.StatusWaiting, 30*time.Second)
	require.NotNil(t, run.DeadlineAt, "its clock runs from this pick-up")
	require.NotNil(t, run.StartedAt)
}

// Before any process hands it back, a pending run whose version no live
// process registers (none is running) says so too, without a since.
func TestAPendingRunSaysNoLiveProcessRegistersItsVersion(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := testCtx(t)
	client := newEngine(t, db, nil, false, versioned(1))
	r, err := versioned(1).Start(ctx, client, "early", nil)
	require.NoError(t, err)
	run, err := client.GetRun(ctx, r.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, run.Status)
	require.Equal(t, "a process that registers pinned v1", run.WaitingFor)
	require.Nil(t, run.WaitingSince)
	s, err := client.Stats(ctx)
	require.NoError(t, err)
	require.Empty(t, s.VersionWaits, "counted once a process hands it back")

	worker := newEngine(t, db, nil, true, versioned(1))
	run = waitStatus(t, worker, r.RunID, engine.StatusWaiting, 30*time.Second)
	require.Empty(t, run.WaitingFor)
}

// waitHandedBack waits until a process has handed run id back for want of
// a process of its version (its wait's since is set), and returns it.
func waitHandedBack(ctx context.Context, t *testing.T, e *engine.Engine, id uuid.UUID) *engine.Run {
	t.Helper()
	var run *engine.Run
	eventually(t, 30*time.Second, "the hand-back of run "+id.String(), func() bool {
		var err error
		run, err = e.GetRun(ctx, id)
		require.NoError(t, err)
		return run.WaitingSince != nil
	})
	return run
}
