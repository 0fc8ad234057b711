package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgdurable/pgdurable/engine/internal/cronspec"
	"github.com/pgdurable/pgdurable/engine/internal/maintenance"
	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// Overlap policies: what a fire does while the run of an earlier fire is
// still active (Temporal's names).
const (
	OverlapSkip      = "skip"       // the fire is skipped and recorded (default)
	OverlapAllow     = "allow"      // the fire starts a run anyway
	OverlapBufferOne = "buffer_one" // one fire waits and starts when the active run ends; more are skipped
)

// DefaultCatchupWindow is how old a missed fire may be and still start
// after downtime.
const DefaultCatchupWindow = time.Hour

// MarshalJSON writes the schedule in the API's snake_case shape, with
// catchup_window as a Go duration string ("1h0m0s").
func (s Schedule) MarshalJSON() ([]byte, error) {
	type plain Schedule
	return json.Marshal(struct {
		plain
		CatchupWindow string `json:"catchup_window"`
	}{plain(s), s.CatchupWindow.String()})
}

// ScheduleSpec defines a schedule: each fire of Cron in TimeZone starts one
// run of Workflow with Input and workflow ID
// "schedule:<name>:<fire time in UTC, RFC 3339>" — exactly one run per
// fire across any number of engine processes (the workflow ID is the
// start's idempotency key).
type ScheduleSpec struct {
	// Name: 1 to 100 of A-Z a-z 0-9 . _ -
	Name string `json:"name"`
	// Cron: 5 fields (minute hour day-of-month month day-of-week) or a
	// descriptor (@yearly, @monthly, @weekly, @daily, @hourly, @every 5m),
	// robfig/cron/v3 syntax. Daylight saving follows ISC cron: see
	// package engine/internal/cronspec and docs/time.md.
	Cron string `json:"cron"`
	// TimeZone is an IANA name (America/New_York); default UTC.
	TimeZone string `json:"time_zone"`
	// Workflow is a workflow registered with this engine; Input must decode
	// as its input (default null).
	Workflow string          `json:"workflow"`
	Input    json.RawMessage `json:"input,omitempty"`
	// Overlap: OverlapSkip (default), OverlapAllow or OverlapBufferOne. It
	// applies to catch-up fires too.
	Overlap string `json:"overlap"`
	// CatchupWindow: after downtime, missed fires younger than this start
	// in order; older ones are recorded as skipped. Default 1 h.
	CatchupWindow time.Duration `json:"-"`
	// Paused schedules do not fire; resuming does not catch up. Pausing is
	// state, as in Temporal: CreateSchedule creates the schedule paused,
	// UpdateSchedule and SaveSchedule pause it when true and leave it
	// paused when false; only ResumeSchedule resumes. So a schedule an
	// operator paused stays paused across deploys that save it from code.
	Paused bool `json:"paused"`
}

// Schedule is a schedule with its state.
type Schedule struct {
	ScheduleSpec
	NextFireAt time.Time  `json:"next_fire_at"`
	LastFireAt *time.Time `json:"last_fire_at,omitempty"`
	LastRunID  *uuid.UUID `json:"last_run_id,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	UpdatedAt  time.Time  `json:"updated_at"`
}

// What became of a fire (ScheduleFire.Outcome and Reason).
const (
	FireStarted  = "started"  // a run was started (RunID)
	FireBuffered = "buffered" // held by buffer_one until the active run ends
	FireSkipped  = "skipped"  // not started; Reason says why
	FireMissed   = "missed"   // reason: older than the catch-up window
	FireOverlap  = "overlap"  // reason: a run of an earlier fire was active
)

// ScheduleFire is what became of one fire time: outcome started (RunID
// set), buffered, or skipped with Reason "missed" (older than the catch-up
// window) or "overlap".
type ScheduleFire struct {
	FireAt  time.Time  `json:"fire_at"`
	Outcome string     `json:"outcome"`
	Reason  string     `json:"reason,omitempty"`
	RunID   *uuid.UUID `json:"run_id,omitempty"`
}

var scheduleName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,100}$`)

// validScheduleName: names go in URL paths, where "." and ".." are
// rewritten, and in workflow IDs.
func validScheduleName(name string) bool {
	return scheduleName.MatchString(name) && strings.Trim(name, ".") != ""
}

// validate checks spec against this engine's registrations and returns
// its parsed cron schedule. Errors wrap ErrInvalidArgument,
// ErrUnknownWorkflow or ErrInvalidInput.
func (e *Engine) validateSchedule(s *ScheduleSpec) (cronspec.Schedule, error) {
	if !validScheduleName(s.Name) {
		return nil, fmt.Errorf("%w: schedule name %q must be 1 to 100 of A-Z a-z 0-9 . _ - and not only dots", ErrInvalidArgument, s.Name)
	}
	if s.TimeZone == "" {
		s.TimeZone = "UTC"
	}
	sched, err := cronspec.Parse(s.Cron, s.TimeZone)
	if err != nil {
		return nil, fmt.Errorf("%w: schedule %q: %v", ErrInvalidArgument, s.Name, err)
	}
	switch s.Overlap {
	case "":
		s.Overlap = OverlapSkip
	case OverlapSkip, OverlapAllow, OverlapBufferOne:
	default:
		return nil, fmt.Errorf("%w: overlap policy %q: want skip, allow or buffer_one", ErrInvalidArgument, s.Overlap)
	}
	switch {
	case s.CatchupWindow == 0:
		s.CatchupWindow = DefaultCatchupWindow
	case s.CatchupWindow < time.Second:
		return nil, fmt.Errorf("%w: catch-up window %s is under 1s", ErrInvalidArgument, s.CatchupWindow)
	}
	if len(s.Input) == 0 {
		s.Input = json.RawMessage("null")
	}
	r, ok := e.workflow(s.Workflow)
	if !ok {
		return nil, fmt.Errorf("%w: %q (this process registers: %s)", ErrUnknownWorkflow, s.Workflow, e.registeredNames())
	}
	if len(s.Input) > e.cfg.MaxPayloadBytes {
		return nil, e.tooLarge(s.Workflow, len(s.Input))
	}
	if err := r.decode(s.Input); err != nil {
		return nil, fmt.Errorf("%w: input of workflow %q: %v", ErrInvalidInput, s.Workflow, err)
	}
	if err := checkStorable(s.Input); err != nil {
		return nil, fmt.Errorf("%w: input of workflow %q: %v", ErrInvalidInput, s.Workflow, err)
	}
	if err := checkJSONShape(s.Input, true); err != nil {
		return nil, fmt.Errorf("%w: input of workflow %q: %v", ErrInvalidInput, s.Workflow, err)
	}
	return sched, nil
}

func (e *Engine) scheduleRow(s *ScheduleSpec, next time.Time) *store.ScheduleRow {
	return &store.ScheduleRow{Name: s.Name, Cron: s.Cron, TimeZone: s.TimeZone, WorkflowName: s.Workflow, Input: s.Input,
		OverlapPolicy: s.Overlap, CatchupWindow: s.CatchupWindow, Paused: s.Paused, Queue: e.cfg.Queue, NextFireAt: next}
}

// CreateSchedule saves spec after validating it (an expression that never
// fires, an unknown time zone or workflow, an input that does not decode
// are rejected) and returns it with its first fire time, the first after
// now. ErrScheduleExists when the name is taken.
func (e *Engine) CreateSchedule(ctx context.Context, spec ScheduleSpec) (*Schedule, error) {
	return e.writeSchedule(ctx, spec, "creating", store.InsertSchedule)
}

// UpdateSchedule replaces a schedule's definition; a paused schedule stays
// paused (see ScheduleSpec.Paused). With the same cron expression and time
// zone (and the schedule not paused) its next fire time is kept, so fires
// missed while no engine ran are still caught up; a new expression or time
// zone fires from the first fire time after now, and drops a buffered fire.
// ErrNotFound when there is no such schedule.
func (e *Engine) UpdateSchedule(ctx context.Context, spec ScheduleSpec) (*Schedule, error) {
	return e.writeSchedule(ctx, spec, "updating", store.UpdateSchedule)
}

// writeSchedule validates spec, saves it with write (verb names it in
// errors) and reads it back.
func (e *Engine) writeSchedule(ctx context.Context, spec ScheduleSpec, verb string,
	write func(context.Context, store.DBTX, *store.ScheduleRow) error) (*Schedule, error) {
	sched, err := e.validateSchedule(&spec)
	if err != nil {
		return nil, err
	}
	if err := write(ctx, e.db, e.scheduleRow(&spec, sched.Next(e.now()))); err != nil {
		return nil, e.scheduleErr(verb, spec.Name, err)
	}
	return e.GetSchedule(ctx, spec.Name)
}

// errNoSuchName: a name no schedule can have (NUL, invalid UTF-8...):
// looked up, it is simply not found.
var errNoSuchName = errors.New("not a schedule name")

func lookupName(name string) error {
	if !validScheduleName(name) {
		return errNoSuchName
	}
	return nil
}

// SaveSchedule creates the schedule, or updates it when it exists (as
// UpdateSchedule: an unchanged expression keeps its next fire time). It is
// the call for schedules defined in code and saved at every start-up.
func (e *Engine) SaveSchedule(ctx context.Context, spec ScheduleSpec) (*Schedule, error) {
	s, err := e.CreateSchedule(ctx, spec)
	if errors.Is(err, ErrScheduleExists) {
		return e.UpdateSchedule(ctx, spec)
	}
	return s, err
}

// PauseSchedule stops a schedule's fires until ResumeSchedule.
func (e *Engine) PauseSchedule(ctx context.Context, name string) error {
	if err := lookupName(name); err != nil {
		return e.scheduleErr("pausing", name, err)
	}
	return e.scheduleErr("pausing", name, store.SetSchedulePaused(ctx, e.db, name, true, nil))
}

// ResumeSchedule lets a paused schedule fire again, from the first fire
// time after now: fires during the pause are not caught up.
func (e *Engine) ResumeSchedule(ctx context.Context, name string) error {
	s, err := e.GetSchedule(ctx, name)
	if err != nil {
		return err
	}
	sched, err := cronspec.Parse(s.Cron, s.TimeZone)
	if err != nil {
		return fmt.Errorf("pgdurable: schedule %q: %w", name, err)
	}
	next := sched.Next(e.now())
	return e.scheduleErr("resuming", name, store.SetSchedulePaused(ctx, e.db, name, false, &next))
}

// TriggerSchedule fires schedule name now, outside its cron expression, as
// an operator's "run it now": it starts one run of the schedule's workflow
// with its input, whatever its overlap policy and even while it is paused
// (the operator asked for this run), and records the fire (outcome
// started) in its history. Every call starts a run of its own, even two
// calls at one clock reading (a fake Config.Clock, two operators in the
// same instant): the run's workflow ID is
// "schedule:<name>:trigger:<a new UUID v7>", which never equals a cron
// fire's "schedule:<name>:<fire time>" (ScheduleWorkflowID). The fire is
// recorded at the trigger's time (Config.Clock), to the microsecond, moved
// on by a microsecond when that time is a whole second (where a cron fire
// is recorded) or is already recorded (an earlier trigger at the same
// reading), so no record replaces another. The run counts as the
// schedule's latest run, so a cron fire with overlap skip or buffer_one
// waits for it. The schedule's next cron fire is unchanged.
//
// Errors: ErrNotFound (no such schedule), ErrUnknownWorkflow (this process
// does not register the schedule's workflow), ErrInvalidInput (its input
// no longer decodes as the workflow's input type).
func (e *Engine) TriggerSchedule(ctx context.Context, name string) (*StartResult, error) {
	if err := lookupName(name); err != nil {
		return nil, e.scheduleErr("triggering", name, err)
	}
	var res *StartResult
	var workflow string
	err := e.txn(ctx, func(tx pgx.Tx) error {
		s, err := store.LockSchedule(ctx, e.on(tx), name)
		if err != nil {
			return e.scheduleErr("triggering", name, err)
		}
		workflow = s.WorkflowName
		r, ok := e.workflow(s.WorkflowName)
		if !ok {
			return fmt.Errorf("%w: schedule %q starts %q, which is not registered in this process (registered: %s)",
				ErrUnknownWorkflow, name, s.WorkflowName, e.registeredNames())
		}
		input, err := e.checkInput(r, s.WorkflowName, s.Input)
		if err != nil {
			return err
		}
		id, err := uuid.NewV7()
		if err != nil {
			return fmt.Errorf("pgdurable: triggering schedule %q: generating its workflow ID: %w", name, err)
		}
		res, err = e.startJSON(ctx, tx, s.WorkflowName, r.version, input,
			&StartOpts{WorkflowID: triggerWorkflowID(name, id), schedule: name})
		if err != nil {
			return err
		}
		if _, err := store.RecordTrigger(ctx, e.on(tx), name, e.now().UTC(), res.RunID); err != nil {
			return fmt.Errorf("pgdurable: triggering schedule %q: %w", name, err)
		}
		s.LastRunID = &res.RunID
		return store.AdvanceSchedule(ctx, e.on(tx), s)
	})
	if err != nil {
		return nil, err
	}
	e.obs.ScheduleFired(ScheduleFiredEvent{Schedule: name, Workflow: workflow, Outcome: FireStarted})
	return res, nil
}

// DeleteSchedule removes a schedule and its fire history; the runs it
// started stay.
func (e *Engine) DeleteSchedule(ctx context.Context, name string) error {
	if err := lookupName(name); err != nil {
		return e.scheduleErr("deleting", name, err)
	}
	return e.scheduleErr("deleting", name, store.DeleteSchedule(ctx, e.db, name))
}

// GetSchedule reads one schedule; ErrNotFound when absent.
func (e *Engine) GetSchedule(ctx context.Context, name string) (*Schedule, error) {
	if err := lookupName(name); err != nil {
		return nil, e.scheduleErr("reading", name, err)
	}
	row, err := store.GetSchedule(ctx, e.db, name)
	if err != nil {
		return nil, e.scheduleErr("reading", name, err)
	}
	return toSchedule(row), nil
}

// ListSchedules returns every schedule, by name.
func (e *Engine) ListSchedules(ctx context.Context) ([]Schedule, error) {
	rows, err := store.ListSchedules(ctx, e.db)
	if err != nil {
		return nil, fmt.Errorf("pgdurable: listing schedules: %w", err)
	}
	out := make([]Schedule, len(rows))
	for i := range rows {
		out[i] = *toSchedule(&rows[i])
	}
	return out, nil
}

// ListScheduleFires returns a schedule's latest fires, newest first (limit
// 1 to 1,000); ErrNotFound when there is no such schedule.
func (e *Engine) ListScheduleFires(ctx context.Context, name string, limit int) ([]ScheduleFire, error) {
	if limit < 1 || limit > 1000 {
		return nil, fmt.Errorf("%w: limit %d must be 1 to 1000", ErrInvalidArgument, limit)
	}
	if _, err := e.GetSchedule(ctx, name); err != nil {
		return nil, err
	}
	fires, err := store.ListFires(ctx, e.db, name, limit)
	if err != nil {
		return nil, e.scheduleErr("reading fires of", name, err)
	}
	out := make([]ScheduleFire, len(fires))
	for i, f := range fires {
		out[i] = ScheduleFire{FireAt: f.FireAt.UTC(), Outcome: f.Outcome, RunID: f.RunID}
		if f.Reason != nil {
			out[i].Reason = *f.Reason
		}
	}
	return out, nil
}

func (e *Engine) scheduleErr(verb, name string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrNotFound), errors.Is(err, errNoSuchName):
		return fmt.Errorf("%w: schedule %q", ErrNotFound, name)
	case errors.Is(err, store.ErrConflict):
		return fmt.Errorf("%w: %q", ErrScheduleExists, name)
	case errors.Is(err, store.ErrBadPayload):
		return fmt.Errorf("%w: input of schedule %q: %v", ErrInvalidInput, name, err)
	}
	return fmt.Errorf("pgdurable: %s schedule %q: %w", verb, name, err)
}

func toSchedule(r *store.ScheduleRow) *Schedule {
	s := &Schedule{
		ScheduleSpec: ScheduleSpec{Name: r.Name, Cron: r.Cron, TimeZone: r.TimeZone, Workflow: r.WorkflowName, Input: r.Input,
			Overlap: r.OverlapPolicy, CatchupWindow: r.CatchupWindow, Paused: r.Paused},
		NextFireAt: r.NextFireAt.UTC(), LastFireAt: r.LastFireAt, LastRunID: r.LastRunID, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt,
	}
	if s.LastFireAt != nil {
		t := s.LastFireAt.UTC()
		s.LastFireAt = &t
	}
	return s
}

// NextFireTimes returns the first n fire times (at most 100) of the cron
// expression spec in the IANA time zone tz ("" is UTC) at or after from,
// in UTC, as a schedule with that spec would fire: for showing an
// operator what comes next. Errors wrap ErrInvalidArgument.
func NextFireTimes(spec, tz string, from time.Time, n int) ([]time.Time, error) {
	if tz == "" {
		tz = "UTC"
	}
	sched, err := cronspec.Parse(spec, tz)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	n = min(max(n, 0), 100)
	out := make([]time.Time, 0, n)
	at := from.Add(-time.Nanosecond) // "at or after": Next is strictly after
	for range n {
		if at = sched.Next(at); at.IsZero() {
			break
		}
		out = append(out, at.UTC())
	}
	return out, nil
}

// ScheduleWorkflowID is the workflow ID of the run a schedule's fire at
// fireAt starts: "schedule:<name>:<fireAt in UTC, RFC 3339>".
func ScheduleWorkflowID(name string, fireAt time.Time) string {
	return maintenance.ScheduleWorkflowID(name, fireAt)
}

// triggerWorkflowID is the workflow ID of the run TriggerSchedule starts:
// "schedule:<name>:trigger:<id>", id a new UUID v7. A schedule name holds
// no ":", so it cannot be read as a cron fire's ID (ScheduleWorkflowID).
func triggerWorkflowID(name string, id uuid.UUID) string {
	return "schedule:" + name + ":trigger:" + id.String()
}

// registeredNames lists this process's workflows, for error messages.
func (e *Engine) registeredNames() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	names := make([]string, 0, len(e.versions))
	for k := range e.versions {
		names = append(names, fmt.Sprintf("%s v%d", k.name, k.version))
	}
	if len(names) == 0 {
		return "none"
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}
