// Package enginemetrics exports the engine's events and queue state as
// Prometheus metrics (prometheus/client_golang). Wire it in with
//
//	m := enginemetrics.New(prometheus.DefaultRegisterer)
//	e, _ := engine.New(pool, &engine.Config{Observer: m})
//	m.WatchQueue(e) // queue depth, oldest pending age, open dead jobs, runs waiting for a version, read at scrape time
//
// Metric names carry the pgdurable_ prefix; labels are bounded, never run
// or workflow IDs: statuses and outcomes are fixed sets, and each label
// whose values come from names (workflow, step, schedule, signal) keeps the
// first MaxLabelValues distinct values it sees; later ones are reported as
// "other", so a client sending signals under a million names cannot grow
// the scrape.
package enginemetrics

import (
	"context"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgdurable/pgdurable/engine"
)

// Metrics implements engine.Observer with Prometheus collectors.
type Metrics struct {
	engine.NopObserver // the events it does not count
	reg                prometheus.Registerer
	runsStarted        *prometheus.CounterVec
	startHits          *prometheus.CounterVec
	runsEnded          *prometheus.CounterVec
	stepDuration       *prometheus.HistogramVec
	attempts           *prometheus.CounterVec
	retries            *prometheus.CounterVec
	replays            *prometheus.CounterVec
	leaseLosses        *prometheus.CounterVec
	fires              *prometheus.CounterVec
	signals            *prometheus.CounterVec
	pruned             *prometheus.CounterVec

	workflows, steps, schedules, signalNames *boundedLabel
}

// MaxLabelValues is how many distinct values each name label keeps.
const MaxLabelValues = 200

// OtherLabel is the value reported for names past MaxLabelValues.
const OtherLabel = "other"

// boundedLabel admits the first max distinct values of a label.
type boundedLabel struct {
	mu   sync.Mutex
	seen map[string]struct{}
	max  int
}

func newBoundedLabel(max int) *boundedLabel {
	return &boundedLabel{seen: map[string]struct{}{}, max: max}
}

// value returns v, or OtherLabel once max other values are taken (or when
// v is not valid UTF-8, which Prometheus refuses).
func (b *boundedLabel) value(v string) string {
	if !utf8.ValidString(v) {
		return OtherLabel
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.seen[v]; ok {
		return v
	}
	if len(b.seen) >= b.max {
		return OtherLabel
	}
	b.seen[v] = struct{}{}
	return v
}

var _ engine.Observer = (*Metrics)(nil)

// New builds the collectors and registers them with reg. It panics only if
// reg already holds collectors of the same names (a programming error, as
// with prometheus.MustRegister).
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		reg:       reg,
		workflows: newBoundedLabel(MaxLabelValues), steps: newBoundedLabel(MaxLabelValues),
		schedules: newBoundedLabel(MaxLabelValues), signalNames: newBoundedLabel(MaxLabelValues),
		runsStarted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgdurable_runs_started_total", Help: "Runs created by a start.",
		}, []string{"workflow"}),
		startHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgdurable_start_idempotent_hits_total", Help: "Starts that found an existing run with the same workflow ID and input.",
		}, []string{"workflow"}),
		runsEnded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgdurable_runs_finished_total", Help: "Runs that reached a terminal status (completed, failed, compensated, cancelled, dead, continued).",
		}, []string{"workflow", "status"}),
		stepDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "pgdurable_step_attempt_duration_seconds", Help: "Duration of step attempts, by outcome.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10), // 0.5 ms .. 131 s
		}, []string{"workflow", "kind", "outcome"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgdurable_step_attempts_total", Help: "Step attempts, by outcome (completed, retry, failed, parked, cancelled, interrupted).",
		}, []string{"workflow", "step", "outcome"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgdurable_step_retries_total", Help: "Step attempts that failed transiently and will be retried.",
		}, []string{"workflow", "step"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgdurable_step_replays_total", Help: "Recorded steps returned from their record instead of running again: duplicates avoided.",
		}, []string{"workflow", "kind"}),
		leaseLosses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgdurable_lease_losses_total", Help: "Deliveries that found another delivery owns their run and stopped.",
		}, []string{"workflow"}),
		fires: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgdurable_schedule_fires_total", Help: "Schedule fires handled, by outcome (started, buffered, skipped) and skip reason (missed, overlap).",
		}, []string{"schedule", "workflow", "outcome", "reason"}),
		signals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgdurable_signals_sent_total", Help: "Signals stored for runs; woken=true when the run was waiting for that name.",
		}, []string{"workflow", "signal", "woken"}),
		pruned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgdurable_pruned_rows_total", Help: "Rows deleted by retention (Config.Retention, Engine.Prune), by table.",
		}, []string{"table"}),
	}
	reg.MustRegister(m.runsStarted, m.startHits, m.runsEnded, m.stepDuration, m.attempts, m.retries, m.replays, m.leaseLosses,
		m.fires, m.signals, m.pruned)
	return m
}

// RunStarted implements engine.Observer.
func (m *Metrics) RunStarted(ev engine.RunStartedEvent) {
	workflow := m.workflows.value(ev.Workflow)
	if ev.Existing {
		m.startHits.WithLabelValues(workflow).Inc()
		return
	}
	m.runsStarted.WithLabelValues(workflow).Inc()
}

// RunEnded implements engine.Observer.
func (m *Metrics) RunEnded(ev engine.RunEndedEvent) {
	m.runsEnded.WithLabelValues(m.workflows.value(ev.Workflow), string(ev.Status)).Inc()
}

// StepAttempt implements engine.Observer.
func (m *Metrics) StepAttempt(ev engine.StepAttemptEvent) {
	workflow, step, outcome := m.workflows.value(ev.Workflow), m.steps.value(ev.Step), ev.Outcome
	m.stepDuration.WithLabelValues(workflow, string(ev.Kind), outcome).Observe(ev.Duration.Seconds())
	m.attempts.WithLabelValues(workflow, step, outcome).Inc()
	if outcome == "retry" {
		m.retries.WithLabelValues(workflow, step).Inc()
	}
}

// StepReplayed implements engine.Observer.
func (m *Metrics) StepReplayed(ev engine.StepReplayedEvent) {
	m.replays.WithLabelValues(m.workflows.value(ev.Workflow), string(ev.Kind)).Inc()
}

// LeaseLost implements engine.Observer.
func (m *Metrics) LeaseLost(ev engine.LeaseLostEvent) {
	m.leaseLosses.WithLabelValues(m.workflows.value(ev.Workflow)).Inc()
}

// WatchQueue registers gauges read from e.Stats at scrape time: pending
// runs (queue depth), the oldest pending run's age, running and waiting
// runs, and open dead jobs; and, per flow-controlled queue a process
// defined (e.ListQueues, at most 50), its ready and running runs, slots,
// oldest ready run's age, pause, rate-limit wait and serving processes.
// A scrape that cannot reach the database reports no values for them.
func (m *Metrics) WatchQueue(e *engine.Engine) {
	m.reg.MustRegister(&queueCollector{e: e})
}

var (
	descPending = prometheus.NewDesc("pgdurable_runs_pending", "Runs ready for a delivery (queue depth).", nil, nil)
	descOldest  = prometheus.NewDesc("pgdurable_oldest_pending_run_age_seconds", "How long the oldest pending run has waited for a delivery.", nil, nil)
	descRunning = prometheus.NewDesc("pgdurable_runs_running", "Runs a delivery holds.", nil, nil)
	descWaiting = prometheus.NewDesc("pgdurable_runs_waiting", "Runs waiting for a retry or a timer.", nil, nil)
	descDead    = prometheus.NewDesc("pgdurable_dead_jobs_open", "Dead jobs neither replayed nor discarded.", nil, nil)
	descTables  = prometheus.NewDesc("pgdurable_table_bytes", "Size of the engine's tables with their indexes (retention bounds them).", []string{"table"}, nil)

	versionLabels      = []string{"workflow", "version"}
	descVersionWaits   = prometheus.NewDesc("pgdurable_runs_waiting_for_version", "Runs waiting for a process that registers their workflow version.", versionLabels, nil)
	descVersionWaitAge = prometheus.NewDesc("pgdurable_runs_waiting_for_version_oldest_seconds", "How long the longest-waiting run of a workflow version has waited for a process that registers it.", versionLabels, nil)
	descVersionOverdue = prometheus.NewDesc("pgdurable_runs_waiting_for_version_overdue", "Runs that have waited Config.VersionWaitAlert or longer for a process that registers their workflow version: alert when above 0.", versionLabels, nil)

	queueLabels          = []string{"queue"}
	descQueueReady       = prometheus.NewDesc("pgdurable_queue_ready_runs", "Runs waiting in a flow-controlled queue for a slot (its depth).", queueLabels, nil)
	descQueueRunning     = prometheus.NewDesc("pgdurable_queue_running_runs", "Runs of a flow-controlled queue holding a slot (a live lease).", queueLabels, nil)
	descQueueSlots       = prometheus.NewDesc("pgdurable_queue_slots", "A flow-controlled queue's concurrency limit (0: none).", queueLabels, nil)
	descQueueOldest      = prometheus.NewDesc("pgdurable_queue_oldest_ready_seconds", "How long the oldest ready run of a flow-controlled queue has waited for a slot.", queueLabels, nil)
	descQueuePaused      = prometheus.NewDesc("pgdurable_queue_paused", "1 while a flow-controlled queue is paused.", queueLabels, nil)
	descQueueRateLimited = prometheus.NewDesc("pgdurable_queue_rate_limited", "1 while a flow-controlled queue's rate limit holds its next start back.", queueLabels, nil)
	descQueueProcesses   = prometheus.NewDesc("pgdurable_queue_processes", "Live engine processes that serve a flow-controlled queue: alert on 0 with ready runs.", queueLabels, nil)
	descUndefinedQueues  = prometheus.NewDesc("pgdurable_runs_in_undefined_queues", "Ready runs of queues that no process has registered (they wait for one).", nil, nil)
)

// maxQueueSeries bounds the queues the metrics label: queue names come
// from code (RegisterQueue), but a start may name any queue, so only
// defined queues are labelled, and at most this many of them.
const maxQueueSeries = 50

type queueCollector struct{ e *engine.Engine }

func (q *queueCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPending, descOldest, descRunning, descWaiting, descDead, descTables,
		descVersionWaits, descVersionWaitAge, descVersionOverdue, descQueueReady, descQueueRunning, descQueueSlots,
		descQueueOldest, descQueuePaused, descQueueRateLimited, descQueueProcesses, descUndefinedQueues} {
		ch <- d
	}
}

func (q *queueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := q.e.Stats(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descPending, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(s.PendingRuns))
	ch <- prometheus.MustNewConstMetric(descOldest, prometheus.GaugeValue, s.OldestPendingAge.Seconds())
	ch <- prometheus.MustNewConstMetric(descRunning, prometheus.GaugeValue, float64(s.RunningRuns))
	ch <- prometheus.MustNewConstMetric(descWaiting, prometheus.GaugeValue, float64(s.WaitingRuns))
	ch <- prometheus.MustNewConstMetric(descDead, prometheus.GaugeValue, float64(s.OpenDeadJobs))
	for table, n := range s.TableBytes {
		ch <- prometheus.MustNewConstMetric(descTables, prometheus.GaugeValue, float64(n), table)
	}
	// Stats bounds the versions (50), and each name is a registered
	// workflow's, so the labels stay few.
	for _, w := range s.VersionWaits {
		v := strconv.Itoa(w.Version)
		ch <- prometheus.MustNewConstMetric(descVersionWaits, prometheus.GaugeValue, float64(w.Runs), w.Workflow, v)
		ch <- prometheus.MustNewConstMetric(descVersionWaitAge, prometheus.GaugeValue, w.Waited.Seconds(), w.Workflow, v)
		ch <- prometheus.MustNewConstMetric(descVersionOverdue, prometheus.GaugeValue, float64(w.Overdue), w.Workflow, v)
	}
	q.collectQueues(ctx, ch)
}

// collectQueues reports the flow-controlled queues (Engine.ListQueues).
func (q *queueCollector) collectQueues(ctx context.Context, ch chan<- prometheus.Metric) {
	queues, err := q.e.ListQueues(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descQueueReady, err)
		return
	}
	undefined, labelled := 0, 0
	for _, qi := range queues {
		if !qi.Defined {
			undefined += qi.Ready
			continue
		}
		if labelled++; labelled > maxQueueSeries {
			continue
		}
		var oldest float64
		if qi.OldestReadyAt != nil {
			oldest = time.Since(*qi.OldestReadyAt).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(descQueueReady, prometheus.GaugeValue, float64(qi.Ready), qi.Name)
		ch <- prometheus.MustNewConstMetric(descQueueRunning, prometheus.GaugeValue, float64(qi.Running), qi.Name)
		ch <- prometheus.MustNewConstMetric(descQueueSlots, prometheus.GaugeValue, float64(qi.Concurrency), qi.Name)
		ch <- prometheus.MustNewConstMetric(descQueueOldest, prometheus.GaugeValue, oldest, qi.Name)
		ch <- prometheus.MustNewConstMetric(descQueuePaused, prometheus.GaugeValue, boolGauge(qi.Paused), qi.Name)
		ch <- prometheus.MustNewConstMetric(descQueueRateLimited, prometheus.GaugeValue, boolGauge(qi.RateLimitedUntil != nil), qi.Name)
		ch <- prometheus.MustNewConstMetric(descQueueProcesses, prometheus.GaugeValue, float64(len(qi.Processes)), qi.Name)
	}
	ch <- prometheus.MustNewConstMetric(descUndefinedQueues, prometheus.GaugeValue, float64(undefined))
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// RowsPruned implements engine.Observer.
func (m *Metrics) RowsPruned(ev engine.RowsPrunedEvent) {
	m.pruned.WithLabelValues(ev.Table).Add(float64(ev.Rows))
}

// ScheduleFired implements engine.Observer.
func (m *Metrics) ScheduleFired(ev engine.ScheduleFiredEvent) {
	m.fires.WithLabelValues(m.schedules.value(ev.Schedule), m.workflows.value(ev.Workflow), ev.Outcome, ev.Reason).Inc()
}

// SignalSent implements engine.Observer.
func (m *Metrics) SignalSent(ev engine.SignalSentEvent) {
	w := "false"
	if ev.Woken {
		w = "true"
	}
	m.signals.WithLabelValues(m.workflows.value(ev.Workflow), m.signalNames.value(ev.Signal), w).Inc()
}
