package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// Observer receives the engine's events, for metrics (package
// engine/enginemetrics implements it with Prometheus) or tracing. Methods
// are called on the engine's goroutines: keep them fast, never block, and
// make them safe for concurrent use.
type Observer interface {
	// RunStarted: a start created a run, or found one (existing: an
	// idempotent start hit).
	RunStarted(workflow string, existing bool)
	// RunEnded: run runID reached status (completed, failed, compensated,
	// cancelled, dead, continued) and the record is committed.
	RunEnded(runID uuid.UUID, workflow string, status RunStatus)
	// StepAttempt: one attempt of a step ended. outcome is completed,
	// retry, failed (recorded and returned), parked, cancelled or
	// interrupted (shutdown or lost lease); d is the attempt's duration.
	StepAttempt(workflow, step string, kind StepKind, attempt int, outcome string, d time.Duration)
	// StepReplayed: a recorded step returned its record instead of running
	// again (a duplicate execution avoided).
	StepReplayed(workflow string, kind StepKind)
	// LeaseLost: a delivery found another owns its run and stopped.
	LeaseLost(workflow string)
}

// ScheduleObserver is an Observer that also hears of schedules and
// signals. It is optional (checked with a type assertion) so Observers
// written before schedules existed keep compiling.
type ScheduleObserver interface {
	// ScheduleFired: one fire of schedule was handled; outcome is started,
	// buffered, or skipped with reason missed or overlap.
	ScheduleFired(schedule, workflow, outcome, reason string)
	// SignalSent: a signal was stored for a run of workflow (woken: the
	// run was waiting for it and is delivered now).
	SignalSent(workflow, name string, woken bool)
}

type nopObserver struct{}

func (nopObserver) RunStarted(string, bool)                                          {}
func (nopObserver) RunEnded(uuid.UUID, string, RunStatus)                            {}
func (nopObserver) StepAttempt(string, string, StepKind, int, string, time.Duration) {}
func (nopObserver) StepReplayed(string, StepKind)                                    {}
func (nopObserver) LeaseLost(string)                                                 {}
func (nopObserver) ScheduleFired(string, string, string, string)                     {}
func (nopObserver) SignalSent(string, string, bool)                                  {}

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
}

// Stats reads the queue's state on this engine's queue: a few index scans,
// fine for a scrape every few seconds.
func (e *Engine) Stats(ctx context.Context) (*Stats, error) {
	s, err := store.GetStats(ctx, e.pool, e.cfg.Queue)
	if err != nil {
		return nil, fmt.Errorf("pgdurable: reading stats: %w", err)
	}
	sizes, err := store.TableSizes(ctx, e.pool)
	if err != nil {
		return nil, fmt.Errorf("pgdurable: %w", err)
	}
	return &Stats{PendingRuns: s.Pending, OldestPendingAge: s.OldestPendingAge, RunningRuns: s.Running,
		WaitingRuns: s.Waiting, OpenDeadJobs: s.OpenDeadJobs, TableBytes: sizes}, nil
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
	a, err := store.GetActivity(ctx, e.pool, time.Now())
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
