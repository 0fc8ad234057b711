package store

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// ScheduleRow is one row of schedules.
type ScheduleRow struct {
	Name           string
	Cron           string
	TimeZone       string
	WorkflowName   string
	Input          []byte
	OverlapPolicy  string
	CatchupWindow  time.Duration
	Paused         bool
	Queue          string
	NextFireAt     time.Time
	LastFireAt     *time.Time
	LastRunID      *uuid.UUID
	BufferedFireAt *time.Time
	CreatedAt      time.Time
	UpdatedAt      time.Time
}

const scheduleColumns = `name, cron, time_zone, workflow_name, input, overlap_policy, catchup_window_ms, paused, queue,
    next_fire_at, last_fire_at, last_run_id, buffered_fire_at, created_at, updated_at`

func scanSchedule(row pgx.CollectableRow) (ScheduleRow, error) {
	var s ScheduleRow
	var windowMS int64
	err := row.Scan(&s.Name, &s.Cron, &s.TimeZone, &s.WorkflowName, &s.Input, &s.OverlapPolicy, &windowMS, &s.Paused, &s.Queue,
		&s.NextFireAt, &s.LastFireAt, &s.LastRunID, &s.BufferedFireAt, &s.CreatedAt, &s.UpdatedAt)
	s.CatchupWindow = time.Duration(windowMS) * time.Millisecond
	return s, err
}

// InsertSchedule creates s; ErrConflict when the name is taken.
func InsertSchedule(ctx context.Context, db DBTX, s *ScheduleRow) error {
	_, err := insertSchedule.exec(ctx, db, s.args(true))
	return translate(err)
}

var insertSchedule = named(`INSERT INTO pgdurable.schedules (name, cron, time_zone, workflow_name, input, overlap_policy,
		catchup_window_ms, paused, queue, next_fire_at)
	VALUES (@name, @cron, @time_zone, @workflow_name, @input::jsonb, @overlap_policy, @catchup_window_ms, @paused, @queue,
		@next_fire_at)`)

// args are the arguments of insertSchedule (withQueue) or of
// updateSchedule, which keeps the queue.
func (s *ScheduleRow) args(withQueue bool) pgx.StrictNamedArgs {
	args := pgx.StrictNamedArgs{"name": s.Name, "cron": s.Cron, "time_zone": s.TimeZone, "workflow_name": s.WorkflowName,
		"input": string(s.Input), "overlap_policy": s.OverlapPolicy, "catchup_window_ms": ms(s.CatchupWindow),
		"paused": s.Paused, "next_fire_at": s.NextFireAt}
	if withQueue {
		args["queue"] = s.Queue
	}
	return args
}

// updateSchedule keeps the next fire (and a buffered one) of a schedule
// whose expression and time zone stay, unless it was paused.
var updateSchedule = named(`UPDATE pgdurable.schedules SET
		next_fire_at = CASE WHEN cron = @cron AND time_zone = @time_zone AND NOT paused THEN next_fire_at ELSE @next_fire_at END,
		buffered_fire_at = CASE WHEN cron = @cron AND time_zone = @time_zone AND NOT paused THEN buffered_fire_at END,
		cron = @cron, time_zone = @time_zone, workflow_name = @workflow_name, input = @input::jsonb,
		overlap_policy = @overlap_policy, catchup_window_ms = @catchup_window_ms, paused = paused OR @paused, updated_at = now()
		WHERE name = @name`)

// UpdateSchedule replaces s's definition, keeping its fire history. When
// the expression and time zone are unchanged and it was not paused, it
// keeps its next fire time (and a buffered fire), so fires missed while no
// engine ran are still caught up; otherwise the next fire is s.NextFireAt.
// ErrNotFound when there is no such schedule.
func UpdateSchedule(ctx context.Context, db DBTX, s *ScheduleRow) error {
	tag, err := updateSchedule.exec(ctx, db, s.args(false))
	if err != nil {
		return translate(err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// SetSchedulePaused pauses or resumes name; resuming sets the next fire
// time (fires during the pause are not caught up). ErrNotFound when absent.
func SetSchedulePaused(ctx context.Context, db DBTX, name string, paused bool, next *time.Time) error {
	tag, err := db.Exec(ctx, `UPDATE pgdurable.schedules SET paused = $2, next_fire_at = coalesce($3, next_fire_at),
		buffered_fire_at = CASE WHEN $2 THEN buffered_fire_at ELSE NULL END, updated_at = now() WHERE name = $1`, name, paused, next)
	if err != nil {
		return translate(err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// DeleteSchedule removes name and its fire history (its runs stay).
func DeleteSchedule(ctx context.Context, db DBTX, name string) error {
	tag, err := db.Exec(ctx, `DELETE FROM pgdurable.schedules WHERE name = $1`, name)
	if err != nil {
		return translate(err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// GetSchedule reads one schedule; ErrNotFound when absent.
func GetSchedule(ctx context.Context, db DBTX, name string) (*ScheduleRow, error) {
	return oneSchedule(ctx, db, `SELECT `+scheduleColumns+` FROM pgdurable.schedules WHERE name = $1`, name)
}

// LockSchedule reads one schedule and locks its row until tx ends, as a
// fire does; ErrNotFound when absent.
func LockSchedule(ctx context.Context, tx DBTX, name string) (*ScheduleRow, error) {
	return oneSchedule(ctx, tx, `SELECT `+scheduleColumns+` FROM pgdurable.schedules WHERE name = $1 FOR UPDATE`, name)
}

func oneSchedule(ctx context.Context, db DBTX, sql, name string) (*ScheduleRow, error) {
	rows, err := db.Query(ctx, sql, name)
	if err != nil {
		return nil, translate(err)
	}
	s, err := pgx.CollectExactlyOneRow(rows, scanSchedule)
	if err != nil {
		return nil, translate(err)
	}
	return &s, nil
}

// ListSchedules returns every schedule by name.
func ListSchedules(ctx context.Context, db DBTX) ([]ScheduleRow, error) {
	rows, err := db.Query(ctx, `SELECT `+scheduleColumns+` FROM pgdurable.schedules ORDER BY name`)
	if err != nil {
		return nil, translate(err)
	}
	return pgx.CollectRows(rows, scanSchedule)
}

// DueSchedules locks one unpaused schedule of queue, not in skip, that has
// a fire due at now or a buffered fire. SKIP LOCKED lets every engine
// process look at once: each schedule is handled by one of them, and the
// next tick of any of them picks up what a dead one left.
func DueSchedules(ctx context.Context, tx DBTX, queue string, now time.Time, skip []string) ([]ScheduleRow, error) {
	rows, err := tx.Query(ctx, `SELECT `+scheduleColumns+` FROM pgdurable.schedules
		WHERE queue = $1 AND NOT paused AND (next_fire_at <= $2 OR buffered_fire_at IS NOT NULL) AND NOT (name = ANY(coalesce($3::text[], '{}')))
		ORDER BY next_fire_at LIMIT 1 FOR UPDATE SKIP LOCKED`, queue, now, skip)
	if err != nil {
		return nil, fmt.Errorf("reading due schedules: %w", translate(err))
	}
	return pgx.CollectRows(rows, scanSchedule)
}

// RunActive reports whether runID has not reached a terminal status.
func RunActive(ctx context.Context, db DBTX, runID uuid.UUID) (bool, error) {
	db = at(db, runID)
	var active bool
	err := db.QueryRow(ctx, `SELECT status IN ('pending', 'running', 'waiting', 'compensating') FROM pgdurable.workflow_runs WHERE run_id = $1`, runID).Scan(&active)
	if translate(err) == ErrNotFound {
		return false, nil
	}
	return active, translate(err)
}

// RecordFireParams is what became of schedule Schedule's fire at FireAt:
// its Outcome, the Reason of one skipped (nil otherwise), and the RunID
// of one started (nil otherwise).
type RecordFireParams struct {
	Schedule string
	FireAt   time.Time
	Outcome  string
	Reason   *string
	RunID    *uuid.UUID
}

// RecordFire records what became of a fire (a buffered fire is recorded
// again when it starts).
func RecordFire(ctx context.Context, db DBTX, p RecordFireParams) error {
	_, err := db.Exec(ctx, `INSERT INTO pgdurable.schedule_fires (schedule_name, fire_at, outcome, reason, run_id) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (schedule_name, fire_at) DO UPDATE SET outcome = excluded.outcome, reason = excluded.reason,
		run_id = excluded.run_id, recorded_at = now()`, p.Schedule, p.FireAt, p.Outcome, p.Reason, p.RunID)
	return translate(err)
}

// RecordTrigger records a manual trigger's fire (outcome started, runID)
// at at, or just after the schedule's latest fire recorded at or after at
// (an earlier trigger at the same clock reading), moved on by a
// microsecond more when that is a whole second (where a cron fire may be
// recorded, now or later: cron fire times fall on whole seconds), and
// returns that time: two round trips, however many triggers came at one
// reading. It never replaces another fire's record. The caller holds the
// schedule's row lock (LockSchedule), which every fire and trigger of the
// schedule takes, so no other record can take the time between the look
// and the insert.
func RecordTrigger(ctx context.Context, tx DBTX, name string, at time.Time, runID uuid.UUID) (time.Time, error) {
	at = at.Truncate(time.Microsecond)
	var latest *time.Time
	if err := tx.QueryRow(ctx, `SELECT max(fire_at) FROM pgdurable.schedule_fires WHERE schedule_name = $1 AND fire_at >= $2`,
		name, at).Scan(&latest); err != nil {
		return time.Time{}, fmt.Errorf("recording a trigger of schedule %q: %w", name, translate(err))
	}
	if latest != nil {
		at = latest.Add(time.Microsecond)
	}
	if at.Equal(at.Truncate(time.Second)) {
		at = at.Add(time.Microsecond)
	}
	_, err := tx.Exec(ctx, `INSERT INTO pgdurable.schedule_fires (schedule_name, fire_at, outcome, run_id) VALUES ($1, $2, 'started', $3)`,
		name, at, runID)
	if err != nil {
		return time.Time{}, fmt.Errorf("recording a trigger of schedule %q: %w", name, translate(err))
	}
	return at, nil
}

// AdvanceSchedule stores a schedule's state after its fires were handled.
func AdvanceSchedule(ctx context.Context, db DBTX, s *ScheduleRow) error {
	_, err := db.Exec(ctx, `UPDATE pgdurable.schedules SET next_fire_at = $2, last_fire_at = $3, last_run_id = $4, buffered_fire_at = $5
		WHERE name = $1`, s.Name, s.NextFireAt, s.LastFireAt, s.LastRunID, s.BufferedFireAt)
	return translate(err)
}

// ScheduleFire is one row of schedule_fires.
type ScheduleFire struct {
	FireAt     time.Time
	Outcome    string
	Reason     *string
	RunID      *uuid.UUID
	RecordedAt time.Time
}

// ListFires returns name's latest fires, newest first, up to limit.
func ListFires(ctx context.Context, db DBTX, name string, limit int) ([]ScheduleFire, error) {
	rows, err := db.Query(ctx, `SELECT fire_at, outcome, reason, run_id, recorded_at FROM pgdurable.schedule_fires
		WHERE schedule_name = $1 ORDER BY fire_at DESC LIMIT $2`, name, limit)
	if err != nil {
		return nil, translate(err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ScheduleFire, error) {
		var f ScheduleFire
		err := r.Scan(&f.FireAt, &f.Outcome, &f.Reason, &f.RunID, &f.RecordedAt)
		return f, err
	})
}
