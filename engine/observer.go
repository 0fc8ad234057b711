package engine

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// Observer receives the engine's events, for metrics (package
// engine/enginemetrics implements it with Prometheus) or tracing. Each
// method takes one event struct, passed by value. Methods are called on
// the engine's goroutines: keep them fast, never block, and make them safe
// for concurrent use. A method that panics loses its event (the panic is
// logged with its stack); the run it concerns goes on.
//
// An implementation embeds NopObserver and overrides the events it wants
// (as River's hooks embed HookDefaults): new events are added to the
// interface with a no-op default, so an Observer keeps compiling as the
// engine grows. The unexported method makes the embedding required.
type Observer interface {
	// RunStarted: a start created a run, or found one.
	RunStarted(RunStartedEvent)
	// RunEnded: a run reached a final status and the record is committed.
	RunEnded(RunEndedEvent)
	// StepAttempt: one attempt of a step ended.
	StepAttempt(StepAttemptEvent)
	// StepReplayed: a recorded step returned its record instead of
	// running again (a duplicate execution avoided).
	StepReplayed(StepReplayedEvent)
	// LeaseLost: a delivery found another owns its run and stopped.
	LeaseLost(LeaseLostEvent)
	// ScheduleFired: one fire of a schedule was handled.
	ScheduleFired(ScheduleFiredEvent)
	// SignalSent: a signal was stored for a run.
	SignalSent(SignalSentEvent)
	// RowsPruned: retention or a prune deleted rows of one table.
	RowsPruned(RowsPrunedEvent)

	observer()
}

// RunStartedEvent: a start created a run of Workflow, or found one
// (Existing: an idempotent start hit).
type RunStartedEvent struct {
	Workflow string
	Existing bool
}

// RunEndedEvent: run RunID of Workflow reached Status (completed, failed,
// compensated, cancelled, terminated, dead, continued).
type RunEndedEvent struct {
	RunID    uuid.UUID
	Workflow string
	Status   RunStatus
}

// StepAttemptEvent: attempt Attempt (from 1) of step Step, of kind Kind,
// in a run of Workflow ended with Outcome: completed, retry, failed
// (recorded and returned), parked, cancelled or interrupted (shutdown or
// lost lease). Duration is the attempt's own time.
type StepAttemptEvent struct {
	Workflow string
	Step     string
	Kind     StepKind
	Attempt  int
	Outcome  string
	Duration time.Duration
}

// StepReplayedEvent: a recorded step of kind Kind in a run of Workflow
// returned its record.
type StepReplayedEvent struct {
	Workflow string
	Kind     StepKind
}

// LeaseLostEvent: a delivery of a run of Workflow lost its lease.
type LeaseLostEvent struct {
	Workflow string
}

// ScheduleFiredEvent: one fire of Schedule (of Workflow) was handled;
// Outcome is started, buffered, or skipped with Reason missed or overlap.
type ScheduleFiredEvent struct {
	Schedule string
	Workflow string
	Outcome  string
	Reason   string
}

// SignalSentEvent: signal Signal was stored for a run of Workflow (Woken:
// the run was waiting for it and is delivered now).
type SignalSentEvent struct {
	Workflow string
	Signal   string
	Woken    bool
}

// RowsPrunedEvent: a prune deleted Rows rows of Table (workflow_runs,
// workflow_steps, workflow_signals, dead_jobs, schedule_fires).
type RowsPrunedEvent struct {
	Table string
	Rows  int64
}

// NopObserver ignores every event. Embed it in an Observer and override
// the events wanted.
type NopObserver struct{}

func (NopObserver) RunStarted(RunStartedEvent)       {}
func (NopObserver) RunEnded(RunEndedEvent)           {}
func (NopObserver) StepAttempt(StepAttemptEvent)     {}
func (NopObserver) StepReplayed(StepReplayedEvent)   {}
func (NopObserver) LeaseLost(LeaseLostEvent)         {}
func (NopObserver) ScheduleFired(ScheduleFiredEvent) {}
func (NopObserver) SignalSent(SignalSentEvent)       {}
func (NopObserver) RowsPruned(RowsPrunedEvent)       {}
func (NopObserver) observer()                        {}

// guardedObserver calls an Observer, recovering and logging a panic in
// it: an Observer's bug must not park a run as if its workflow had
// panicked (an event of a sequential step is reported on the workflow's
// goroutine) nor kill the process (a parallel step's is reported on a
// goroutine of its own). The event is lost; the run goes on. A deferred
// recover allocates nothing, so the replay path stays allocation-free.
type guardedObserver struct {
	o   Observer
	log *slog.Logger
}

func (g guardedObserver) recover(event string) {
	if r := recover(); r != nil {
		g.log.Error("observer panicked; the event is dropped", "event", event, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
	}
}

func (g guardedObserver) RunStarted(ev RunStartedEvent) {
	defer g.recover("RunStarted")
	g.o.RunStarted(ev)
}

func (g guardedObserver) RunEnded(ev RunEndedEvent) {
	defer g.recover("RunEnded")
	g.o.RunEnded(ev)
}

func (g guardedObserver) StepAttempt(ev StepAttemptEvent) {
	defer g.recover("StepAttempt")
	g.o.StepAttempt(ev)
}

func (g guardedObserver) StepReplayed(ev StepReplayedEvent) {
	defer g.recover("StepReplayed")
	g.o.StepReplayed(ev)
}

func (g guardedObserver) LeaseLost(ev LeaseLostEvent) {
	defer g.recover("LeaseLost")
	g.o.LeaseLost(ev)
}

func (g guardedObserver) ScheduleFired(ev ScheduleFiredEvent) {
	defer g.recover("ScheduleFired")
	g.o.ScheduleFired(ev)
}

func (g guardedObserver) SignalSent(ev SignalSentEvent) {
	defer g.recover("SignalSent")
	g.o.SignalSent(ev)
}

func (g guardedObserver) RowsPruned(ev RowsPrunedEvent) {
	defer g.recover("RowsPruned")
	g.o.RowsPruned(ev)
}

func (guardedObserver) observer() {}

// Stats is a snapshot of the engine's queue, for gauges.
type Stats struct {
	PendingRuns      int64         // runs ready for a delivery
	OldestPendingAge time.Duration // how long the oldest of them has waited (0: none)
	RunningRuns      int64         // runs a delivery holds, or held when its worker died
	WaitingRuns      int64         // runs waiting for a retry or timer
	OpenDeadJobs     int64         // dead jobs neither replayed nor discarded
	// TableBytes is the size of each of the engine's tables with its
	// indexes (workflow_runs, workflow_steps, workflow_signals, dead_jobs,
	// schedule_fires), which retention (Config.Retention) bounds.
	TableBytes map[string]int64
	// VersionWaits are the open runs waiting for a process that registers
	// their workflow version (Run.WaitingFor), by workflow version,
	// longest-waiting first: at most 50 versions.
	VersionWaits []VersionWait
}

// VersionWait counts the runs of one workflow version that wait for a
// process that registers it (Run.WaitingFor).
type VersionWait struct {
	Workflow string
	Version  int
	Runs     int64
	// OldestSince is when the longest-waiting of them began to wait, and
	// Waited how long ago that was (on Config.Clock).
	OldestSince time.Time
	Waited      time.Duration
	// Overdue counts those that have waited Config.VersionWaitAlert or
	// longer (0 when the alert is off).
	Overdue int64
}

// Reason is what the runs wait for, as Run.WaitingFor says it.
func (w VersionWait) Reason() string { return versionWaitReason(w.Workflow, w.Version) }

// Stats reads the queue's state on this engine's queue: a few index scans,
// fine for a scrape every few seconds.
func (e *Engine) Stats(ctx context.Context) (*Stats, error) {
	s, err := store.GetStats(ctx, e.db, e.cfg.Queue)
	if err != nil {
		return nil, fmt.Errorf("pgdurable: reading stats: %w", err)
	}
	sizes, err := store.TableSizes(ctx, e.db)
	if err != nil {
		return nil, fmt.Errorf("pgdurable: %w", err)
	}
	overdue := time.Time{} // with the alert off, nothing is overdue
	if e.cfg.VersionWaitAlert > 0 {
		overdue = e.now().Add(-e.cfg.VersionWaitAlert)
	}
	waits, err := store.VersionWaits(ctx, e.db, e.cfg.Queue, overdue)
	if err != nil {
		return nil, fmt.Errorf("pgdurable: %w", err)
	}
	out := &Stats{PendingRuns: s.Pending, OldestPendingAge: s.OldestPendingAge, RunningRuns: s.Running,
		WaitingRuns: s.Waiting, OpenDeadJobs: s.OpenDeadJobs, TableBytes: sizes}
	for _, w := range waits {
		out.VersionWaits = append(out.VersionWaits, VersionWait{Workflow: w.Workflow, Version: w.Version,
			Runs: w.Runs, OldestSince: w.Oldest, Waited: e.now().Sub(w.Oldest), Overdue: w.Overdue})
	}
	return out, nil
}

// Overview is the state of the whole database at a glance, as the web
// UI's overview page shows it: Stats (this engine's queue), the open runs
// of every queue by status, and throughput.
type Overview struct {
	Stats
	// OpenRuns counts the runs of every queue in each status that is not
	// final (pending, running, waiting, compensating, dead).
	OpenRuns map[RunStatus]int64
	// StartedLastMinute and StartedLast15Minutes count the runs created
	// in those windows; FinishedLastMinute and FinishedLast15Minutes those
	// that reached a final status in them, among the runs created in the
	// last hour (a run that slept longer is not counted: the count reads
	// an hour of runs at most, through the primary key).
	StartedLastMinute, StartedLast15Minutes   int64
	FinishedLastMinute, FinishedLast15Minutes int64
}

// Overview reads the Overview: Stats' index scans plus one over the open
// runs and one over the last hour's runs.
func (e *Engine) Overview(ctx context.Context) (*Overview, error) {
	s, err := e.Stats(ctx)
	if err != nil {
		return nil, err
	}
	a, err := store.GetActivity(ctx, e.db, time.Now())
	if err != nil {
		return nil, fmt.Errorf("pgdurable: %w", err)
	}
	o := &Overview{Stats: *s, OpenRuns: make(map[RunStatus]int64, len(a.Open)),
		StartedLastMinute: a.Started1m, StartedLast15Minutes: a.Started15m,
		FinishedLastMinute: a.Finished1m, FinishedLast15Minutes: a.Finished15m}
	for k, v := range a.Open {
		o.OpenRuns[RunStatus(k)] = v
	}
	return o, nil
}
