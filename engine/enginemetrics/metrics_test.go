package enginemetrics_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginemetrics"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestMetricsCountRunsStepsAndQueue(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	wf := engine.Define("metered", func(ctx *engine.Context, n int) (int, error) {
		return engine.Step(ctx, "flaky", func(context.Context) (int, error) {
			if n < 0 {
				return 0, errors.New("always down")
			}
			if calls.Add(1) == 1 {
				return 0, errors.New("503")
			}
			return n, nil
		}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: time.Millisecond, MaximumAttempts: 2}})
	}, nil)
	db := enginetest.NewDB(t)
	reg := prometheus.NewRegistry()
	m := enginemetrics.New(reg)
	e := enginetest.NewEngine(t, db, &engine.Config{Observer: m}, true, wf)
	m.WatchQueue(e)
	ctx := context.Background()

	res, err := wf.Start(ctx, e, 5, &engine.StartOpts{WorkflowID: "w-1"})
	require.NoError(t, err)
	_, err = wf.Start(ctx, e, 5, &engine.StartOpts{WorkflowID: "w-1"})
	require.NoError(t, err)
	_, err = wf.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	dead, err := wf.Start(ctx, e, -1, nil)
	require.NoError(t, err)
	_, err = wf.Wait(ctx, e, dead.RunID, 10*time.Millisecond)
	require.Error(t, err)

	expected := `
# HELP pgdurable_runs_finished_total Runs that reached a terminal status (completed, failed, compensated, cancelled, dead, continued).
# TYPE pgdurable_runs_finished_total counter
pgdurable_runs_finished_total{status="completed",workflow="metered"} 1
pgdurable_runs_finished_total{status="dead",workflow="metered"} 1
# HELP pgdurable_runs_started_total Runs created by a start.
# TYPE pgdurable_runs_started_total counter
pgdurable_runs_started_total{workflow="metered"} 2
# HELP pgdurable_start_idempotent_hits_total Starts that found an existing run with the same workflow ID and input.
# TYPE pgdurable_start_idempotent_hits_total counter
pgdurable_start_idempotent_hits_total{workflow="metered"} 1
# HELP pgdurable_step_retries_total Step attempts that failed transiently and will be retried.
# TYPE pgdurable_step_retries_total counter
pgdurable_step_retries_total{step="flaky",workflow="metered"} 2
# HELP pgdurable_dead_jobs_open Dead jobs neither replayed nor discarded.
# TYPE pgdurable_dead_jobs_open gauge
pgdurable_dead_jobs_open 1
# HELP pgdurable_runs_pending Runs ready for a delivery (queue depth).
# TYPE pgdurable_runs_pending gauge
pgdurable_runs_pending 0
`
	// Observers hear of a run's end just after its commit, which Wait may
	// see first: compare until they agree, for a few seconds at most.
	compare := func() error {
		return testutil.GatherAndCompare(reg, strings.NewReader(expected),
			"pgdurable_runs_finished_total", "pgdurable_runs_started_total", "pgdurable_start_idempotent_hits_total",
			"pgdurable_step_retries_total", "pgdurable_dead_jobs_open", "pgdurable_runs_pending")
	}
	err = compare()
	for deadline := time.Now().Add(5 * time.Second); err != nil && time.Now().Before(deadline); err = compare() {
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, err)
	n, err := testutil.GatherAndCount(reg, "pgdurable_step_attempt_duration_seconds")
	require.NoError(t, err)
	require.Positive(t, n)
}

func TestMetricsCountScheduleFiresAndSignals(t *testing.T) {
	t.Parallel()
	wf := engine.Define("waits", func(ctx *engine.Context, _ int) (int, error) {
		return engine.AwaitSignal[int](ctx, "go", 0)
	}, nil)
	db := enginetest.NewDB(t)
	reg := prometheus.NewRegistry()
	m := enginemetrics.New(reg)
	clock := enginetest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	e := enginetest.NewEngine(t, db, &engine.Config{Observer: m, Clock: clock}, true, wf)
	ctx := context.Background()
	_, err := e.CreateSchedule(ctx, engine.ScheduleSpec{Name: "m", Cron: "* * * * *", Workflow: "waits"})
	require.NoError(t, err)
	clock.Advance(2 * time.Minute) // fire 1 starts a run that waits; fire 2 overlaps it
	require.Eventually(t, func() bool {
		return testutil.CollectAndCount(reg, "pgdurable_schedule_fires_total") == 2
	}, 20*time.Second, 20*time.Millisecond)
	runID := engine.ScheduleWorkflowID("m", time.Date(2026, 1, 1, 0, 1, 0, 0, time.UTC))
	require.Eventually(t, func() bool {
		r, err := e.GetRun(ctx, mustRun(t, db, runID))
		return err == nil && r.Status == engine.StatusWaiting
	}, 20*time.Second, 20*time.Millisecond)
	require.NoError(t, e.Signal(ctx, runID, "go", 1, nil))

	expected := `
# HELP pgdurable_schedule_fires_total Schedule fires handled, by outcome (started, buffered, skipped) and skip reason (missed, overlap).
# TYPE pgdurable_schedule_fires_total counter
pgdurable_schedule_fires_total{outcome="skipped",reason="overlap",schedule="m",workflow="waits"} 1
pgdurable_schedule_fires_total{outcome="started",reason="",schedule="m",workflow="waits"} 1
# HELP pgdurable_signals_sent_total Signals stored for runs; woken=true when the run was waiting for that name.
# TYPE pgdurable_signals_sent_total counter
pgdurable_signals_sent_total{signal="go",woken="true",workflow="waits"} 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected), "pgdurable_schedule_fires_total", "pgdurable_signals_sent_total"))
}

func mustRun(t *testing.T, db *enginetest.DB, workflowID string) (id uuid.UUID) {
	t.Helper()
	require.NoError(t, db.Pool.QueryRow(context.Background(), db.SQL(`SELECT run_id FROM pgdurable.workflow_runs WHERE workflow_id = $1`), workflowID).Scan(&id))
	return id
}

// Names chosen by clients (signal names, schedule names) never become
// unbounded label values: past MaxLabelValues distinct values they are
// reported as "other", and invalid UTF-8 never reaches Prometheus.
func TestNameLabelsAreBounded(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := enginemetrics.New(reg)
	for i := range 5 * enginemetrics.MaxLabelValues {
		m.SignalSent(engine.SignalSentEvent{Workflow: "wf", Signal: fmt.Sprintf("signal-%d", i)})
		m.ScheduleFired(engine.ScheduleFiredEvent{Schedule: fmt.Sprintf("schedule-%d", i), Workflow: "wf", Outcome: engine.FireStarted})
	}
	m.SignalSent(engine.SignalSentEvent{Workflow: "wf", Signal: "bad\xff"})
	require.Equal(t, enginemetrics.MaxLabelValues+1, testutil.CollectAndCount(reg, "pgdurable_signals_sent_total"))
	require.Equal(t, enginemetrics.MaxLabelValues+1, testutil.CollectAndCount(reg, "pgdurable_schedule_fires_total"))
	require.Equal(t, float64(4*enginemetrics.MaxLabelValues+1),
		testutil.ToFloat64(collectorFor(t, reg, "pgdurable_signals_sent_total", enginemetrics.OtherLabel)))
}

// collectorFor finds the one series of name whose label values include v.
func collectorFor(t *testing.T, reg *prometheus.Registry, name, v string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, metric := range mf.GetMetric() {
			for _, l := range metric.GetLabel() {
				if l.GetValue() == v {
					g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
					g.Set(metric.GetCounter().GetValue())
					return g
				}
			}
		}
	}
	t.Fatalf("no series of %s with a label %q", name, v)
	return nil
}

func TestMetricsReportQueues(t *testing.T) {
	t.Parallel()
	wf := engine.Define("queued", func(ctx *engine.Context, n int) (int, error) { return n, nil }, &engine.WorkflowOpts{Queue: "payments"})
	db := enginetest.NewDB(t)
	reg := prometheus.NewRegistry()
	m := enginemetrics.New(reg)
	e := enginetest.NewEngine(t, db, &engine.Config{Observer: m}, false, wf)
	require.NoError(t, e.RegisterQueue("payments", engine.QueueOpts{Concurrency: 5}))
	require.NoError(t, e.Start(context.Background()))
	t.Cleanup(func() { _ = e.StopAndCancel(context.Background()) })
	m.WatchQueue(e)
	ctx := context.Background()
	require.NoError(t, e.PauseQueue(ctx, "payments", nil))
	for range 3 {
		_, err := wf.Start(ctx, e, 1, nil)
		require.NoError(t, err)
	}
	_, err := wf.Start(ctx, e, 1, &engine.StartOpts{Queue: "nobody"}) // any name a start gives: no series of its own
	require.NoError(t, err)
	expected := `
# HELP pgdurable_queue_paused 1 while a flow-controlled queue is paused.
# TYPE pgdurable_queue_paused gauge
pgdurable_queue_paused{queue="payments"} 1
# HELP pgdurable_queue_processes Live engine processes that serve a flow-controlled queue: alert on 0 with ready runs.
# TYPE pgdurable_queue_processes gauge
pgdurable_queue_processes{queue="payments"} 1
# HELP pgdurable_queue_ready_runs Runs waiting in a flow-controlled queue for a slot (its depth).
# TYPE pgdurable_queue_ready_runs gauge
pgdurable_queue_ready_runs{queue="payments"} 3
# HELP pgdurable_queue_running_runs Runs of a flow-controlled queue holding a slot (a live lease).
# TYPE pgdurable_queue_running_runs gauge
pgdurable_queue_running_runs{queue="payments"} 0
# HELP pgdurable_queue_slots A flow-controlled queue's concurrency limit (0: none).
# TYPE pgdurable_queue_slots gauge
pgdurable_queue_slots{queue="payments"} 5
# HELP pgdurable_runs_in_undefined_queues Ready runs of queues that no process has registered (they wait for one).
# TYPE pgdurable_runs_in_undefined_queues gauge
pgdurable_runs_in_undefined_queues 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected), "pgdurable_queue_paused", "pgdurable_queue_processes",
		"pgdurable_queue_ready_runs", "pgdurable_queue_running_runs", "pgdurable_queue_slots", "pgdurable_runs_in_undefined_queues"))
	n, err := testutil.GatherAndCount(reg, "pgdurable_queue_oldest_ready_seconds")
	require.NoError(t, err)
	require.Equal(t, 1, n)
}
