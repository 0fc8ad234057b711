package maintenance

import (
	"context"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgdurable/pgdurable/engine/internal/cronspec"
	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// Overlap policies and fire outcomes, as stored and as package engine
// exports them (OverlapAllow, FireStarted...): the same strings.
const (
	OverlapAllow     = "allow"
	OverlapBufferOne = "buffer_one"

	FireStarted  = "started"
	FireBuffered = "buffered"
	FireSkipped  = "skipped"
	FireMissed   = "missed"
	FireOverlap  = "overlap"
)

// maxFiresPerTick bounds the fire times one schedule handles per tick
// (an "@every 1s" schedule after a day of downtime); the rest follow on
// the next ticks, in order.
const maxFiresPerTick = 1000

// ScheduleWorkflowID is the workflow ID of the run a schedule's fire at
// fireAt starts: "schedule:<name>:<fireAt in UTC, RFC 3339>". It makes the
// fire's start idempotent across engines.
func ScheduleWorkflowID(name string, fireAt time.Time) string {
	return "schedule:" + name + ":" + fireAt.UTC().Format(time.RFC3339)
}

// StartFunc starts a run of a workflow in tx with input and workflowID,
// and returns its run ID (an existing run's when workflowID is taken with
// the same input).
type StartFunc func(ctx context.Context, tx pgx.Tx, input []byte, workflowID string) (uuid.UUID, error)

// Scheduler fires the due schedules of the engine's queue whose workflow
// this process registers, at every tick, each schedule in its own
// transaction: the fires it starts (one run each, by a deterministic
// workflow ID: see ScheduleWorkflowID), skips or buffers, and the
// schedule's next fire time commit together.
type Scheduler struct {
	// DB is the engine's pool: each schedule's fires commit in a
	// transaction of their own. Log is the engine's Config.Logger.
	DB  DB
	Log *slog.Logger
	// QueueName is the engine's queue (Config.Queue).
	QueueName string
	// Now is the engine's clock (Config.Clock), which fire times follow.
	Now func() time.Time
	// Workflow returns the func that starts runs of workflow for
	// schedule; false when this process does not register workflow.
	Workflow func(workflow, schedule string) (StartFunc, bool)
	// Fired hears of each fire once its transaction committed: outcome
	// FireStarted, FireBuffered or FireSkipped (reason FireMissed or
	// FireOverlap).
	Fired func(schedule, workflow, outcome, reason string)

	// warned is when each schedule's unregistered workflow was last
	// logged.
	warned map[string]time.Time
}

// Next: every tick.
func (*Scheduler) Next(_, _ time.Time) time.Time { return time.Time{} }

// RunOnce handles up to 100 due schedules.
func (s *Scheduler) RunOnce(ctx context.Context) {
	if err := s.fireSchedules(ctx); err != nil && ctx.Err() == nil {
		s.Log.Warn("schedule tick failed", "error", err)
	}
}

func (s *Scheduler) fireSchedules(ctx context.Context) error {
	var seen []string // handled this tick: a schedule with a buffered fire stays due
	for range 100 {
		var name string
		var fired []fireEvent
		err := store.InTx(ctx, s.DB, func(tx pgx.Tx) error {
			fired = fired[:0]
			due, err := store.DueSchedules(ctx, store.Bind(s.DB, tx), s.QueueName, s.Now(), seen)
			if err != nil || len(due) == 0 {
				return err
			}
			name = due[0].Name
			return s.fireSchedule(ctx, tx, &due[0], &fired)
		})
		switch {
		case name == "":
			return err
		case err != nil && ctx.Err() == nil:
			s.Log.Error("firing schedule failed; retried next tick", "schedule", name, "error", err)
		case err == nil:
			for _, f := range fired { // committed: now they count
				s.Fired(name, f.workflow, f.outcome, f.reason)
			}
		}
		seen = append(seen, name)
	}
	return nil
}

// fireEvent is a handled fire, reported to Fired after the commit.
type fireEvent struct{ workflow, outcome, reason string }

func (s *Scheduler) fireSchedule(ctx context.Context, tx pgx.Tx, sc *store.ScheduleRow, fired *[]fireEvent) error {
	now := s.Now()
	log := s.Log.With("schedule", sc.Name, "workflow", sc.WorkflowName)
	startRun, ok := s.Workflow(sc.WorkflowName, sc.Name)
	if !ok {
		// Another process may register it; this one cannot start it. Said
		// once a minute per schedule, not at every sweep.
		if s.warnOnce(sc.Name, time.Minute) {
			log.Warn("schedule's workflow is not registered in this process; its fires wait for one that does")
		}
		return nil
	}
	sched, err := cronspec.Parse(sc.Cron, sc.TimeZone)
	if err != nil {
		log.Error("schedule no longer parses; pausing it", "error", err)
		return store.SetSchedulePaused(ctx, store.Bind(s.DB, tx), sc.Name, true, nil)
	}
	active := false
	if sc.LastRunID != nil && sc.OverlapPolicy != OverlapAllow {
		if active, err = store.RunActive(ctx, store.Bind(s.DB, tx), *sc.LastRunID); err != nil {
			return err
		}
	}
	start := func(fireAt time.Time) error {
		runID, err := startRun(ctx, tx, sc.Input, ScheduleWorkflowID(sc.Name, fireAt))
		if err != nil {
			return err
		}
		sc.LastRunID, active = &runID, true
		log.Debug("schedule fired", "fire_at", fireAt.UTC(), "run_id", runID)
		*fired = append(*fired, fireEvent{sc.WorkflowName, FireStarted, ""})
		return store.RecordFire(ctx, store.Bind(s.DB, tx), store.RecordFireParams{Schedule: sc.Name, FireAt: fireAt, Outcome: FireStarted, RunID: &runID})
	}
	skip := func(fireAt time.Time, reason string) error {
		log.Debug("schedule fire skipped", "fire_at", fireAt.UTC(), "reason", reason)
		*fired = append(*fired, fireEvent{sc.WorkflowName, FireSkipped, reason})
		return store.RecordFire(ctx, store.Bind(s.DB, tx), store.RecordFireParams{Schedule: sc.Name, FireAt: fireAt, Outcome: FireSkipped, Reason: &reason})
	}
	if sc.BufferedFireAt != nil && !active {
		if err := start(*sc.BufferedFireAt); err != nil {
			return err
		}
		sc.BufferedFireAt = nil
	}
	at := sc.NextFireAt
	for n := 0; !at.IsZero() && !at.After(now) && n < maxFiresPerTick; n++ {
		fireAt := at
		at = sched.Next(at)
		last := fireAt
		sc.LastFireAt = &last
		switch {
		case now.Sub(fireAt) >= sc.CatchupWindow:
			err = skip(fireAt, FireMissed)
		case sc.OverlapPolicy == OverlapAllow || !active:
			err = start(fireAt)
		case sc.OverlapPolicy == OverlapBufferOne && sc.BufferedFireAt == nil:
			sc.BufferedFireAt = &last
			*fired = append(*fired, fireEvent{sc.WorkflowName, FireBuffered, ""})
			err = store.RecordFire(ctx, store.Bind(s.DB, tx), store.RecordFireParams{Schedule: sc.Name, FireAt: fireAt, Outcome: FireBuffered})
		default:
			err = skip(fireAt, FireOverlap)
		}
		if err != nil {
			return err
		}
	}
	if at.IsZero() {
		log.Warn("schedule has no fire time within 8 years; pausing it")
		return store.SetSchedulePaused(ctx, store.Bind(s.DB, tx), sc.Name, true, nil)
	}
	sc.NextFireAt = at
	return store.AdvanceSchedule(ctx, store.Bind(s.DB, tx), sc)
}

// warnOnce reports whether to log, now, that schedule's workflow is not
// registered: at most once per every, not at every tick.
func (s *Scheduler) warnOnce(schedule string, every time.Duration) bool {
	if last, ok := s.warned[schedule]; ok && time.Since(last) < every {
		return false
	}
	if s.warned == nil {
		s.warned = map[string]time.Time{}
	}
	s.warned[schedule] = time.Now()
	return true
}
