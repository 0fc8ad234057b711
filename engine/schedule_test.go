package engine_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// tick is the workflow schedules start in these tests: one step.
var tick = engine.Define("tick", func(ctx *engine.Context, in int) (int, error) {
	return engine.Step(ctx, "tick", func(context.Context) (int, error) { return in, nil }, nil)
}, nil)

// handled waits until the scheduler has handled every fire up to the
// clock's time.
func handled(t *testing.T, e *engine.Engine, name string, clock *enginetest.Clock) {
	t.Helper()
	eventually(t, 20*time.Second, "the scheduler to handle "+name, func() bool {
		s, err := e.GetSchedule(context.Background(), name)
		require.NoError(t, err)
		return s.NextFireAt.After(clock.Now())
	})
}

// fires returns a schedule's fires, oldest first.
func fires(t *testing.T, e *engine.Engine, name string) []engine.ScheduleFire {
	t.Helper()
	fs, err := e.ListScheduleFires(context.Background(), name, 1000)
	require.NoError(t, err)
	for i, j := 0, len(fs)-1; i < j; i, j = i+1, j-1 {
		fs[i], fs[j] = fs[j], fs[i]
	}
	return fs
}

func TestScheduleValidation(t *testing.T) {
	t.Parallel()
	anyInput := engine.Define("any-input", func(_ *engine.Context, in map[string]any) (int, error) { return len(in), nil }, nil)
	b := setup(t, nil, tick, anyInput)
	ctx := testCtx(t)
	ok := engine.ScheduleSpec{Name: "nightly", Cron: "0 3 * * *", TimeZone: "Europe/Paris", Workflow: "tick", Input: []byte(`7`)}
	s, err := b.engine.CreateSchedule(ctx, ok)
	require.NoError(t, err)
	require.Equal(t, engine.OverlapSkip, s.Overlap)
	require.Equal(t, engine.DefaultCatchupWindow, s.CatchupWindow)
	_, err = b.engine.CreateSchedule(ctx, ok)
	require.ErrorIs(t, err, engine.ErrScheduleExists)

	for _, bad := range []struct {
		spec engine.ScheduleSpec
		want error
	}{
		{engine.ScheduleSpec{Name: "feb30", Cron: "0 0 30 2 *", Workflow: "tick"}, engine.ErrInvalidArgument},
		{engine.ScheduleSpec{Name: "tz", Cron: "@daily", TimeZone: "Mars/Olympus", Workflow: "tick"}, engine.ErrInvalidArgument},
		{engine.ScheduleSpec{Name: "six", Cron: "0 0 0 * * *", Workflow: "tick"}, engine.ErrInvalidArgument},
		{engine.ScheduleSpec{Name: "bad name!", Cron: "@daily", Workflow: "tick"}, engine.ErrInvalidArgument},
		{engine.ScheduleSpec{Name: "overlap", Cron: "@daily", Workflow: "tick", Overlap: "queue"}, engine.ErrInvalidArgument},
		{engine.ScheduleSpec{Name: "window", Cron: "@daily", Workflow: "tick", CatchupWindow: time.Millisecond}, engine.ErrInvalidArgument},
		{engine.ScheduleSpec{Name: "nowf", Cron: "@daily", Workflow: "nope"}, engine.ErrUnknownWorkflow},
		{engine.ScheduleSpec{Name: "input", Cron: "@daily", Workflow: "tick", Input: []byte(`"seven"`)}, engine.ErrInvalidInput},
		// Found by an attack pass:
		{engine.ScheduleSpec{Name: "..", Cron: "@daily", Workflow: "tick"}, engine.ErrInvalidArgument},
		{engine.ScheduleSpec{Name: "frac", Cron: "@every 1500ms", Workflow: "tick"}, engine.ErrInvalidArgument},
		{engine.ScheduleSpec{Name: "surrogate", Cron: "@daily", Workflow: "any-input", Input: []byte(`{"k": "\ud800"}`)}, engine.ErrInvalidInput},
	} {
		_, err := b.engine.CreateSchedule(ctx, bad.spec)
		require.ErrorIs(t, err, bad.want, bad.spec.Name)
	}
	for _, name := range []string{"a\x00b", "\xff", "..", "absent"} {
		_, err := b.engine.GetSchedule(ctx, name)
		require.ErrorIs(t, err, engine.ErrNotFound, "%q", name)
		require.ErrorIs(t, b.engine.DeleteSchedule(ctx, name), engine.ErrNotFound, "%q", name)
		_, err = b.engine.ListScheduleFires(ctx, name, 10)
		require.ErrorIs(t, err, engine.ErrNotFound, "%q", name)
	}
	list, err := b.engine.ListSchedules(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)

	ok.Cron = "0 4 * * *"
	s, err = b.engine.UpdateSchedule(ctx, ok)
	require.NoError(t, err)
	require.Equal(t, 4, s.NextFireAt.In(mustLoc(t, "Europe/Paris")).Hour())
	require.NoError(t, b.engine.PauseSchedule(ctx, "nightly"))
	require.NoError(t, b.engine.ResumeSchedule(ctx, "nightly"))
	require.NoError(t, b.engine.DeleteSchedule(ctx, "nightly"))
	require.ErrorIs(t, b.engine.DeleteSchedule(ctx, "nightly"), engine.ErrNotFound)
	_, err = b.engine.UpdateSchedule(ctx, ok)
	require.ErrorIs(t, err, engine.ErrNotFound)
}

func mustLoc(t *testing.T, name string) *time.Location {
	loc, err := time.LoadLocation(name)
	require.NoError(t, err)
	return loc
}

// Four engines, each with its own pool, share one schedule; engines are
// stopped and replaced mid-test, which moves River's leadership among
// them. Every fire time starts exactly one run, none is missing.
func TestScheduleFiresOncePerFireAcrossEngines(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	clock := enginetest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	newOwnEngine := func() *engine.Engine {
		pool, err := pgxpool.New(context.Background(), db.URL)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		e, err := engine.New(pool, &engine.Config{Clock: clock, Logger: quiet})
		require.NoError(t, err)
		require.NoError(t, e.Register(tick))
		require.NoError(t, e.Start(context.Background()))
		t.Cleanup(func() { _ = e.Stop(context.Background()) })
		return e
	}
	engines := []*engine.Engine{newOwnEngine(), newOwnEngine(), newOwnEngine(), newOwnEngine()}
	ctx := testCtx(t)
	_, err := engines[0].CreateSchedule(ctx, engine.ScheduleSpec{Name: "every-minute", Cron: "* * * * *", Workflow: "tick", Input: []byte(`1`),
		Overlap: engine.OverlapAllow}) // each fire starts a run even if the last one has not finished yet
	require.NoError(t, err)
	leaders := map[string]bool{}
	leader := func() {
		var id string
		if err := db.Pool.QueryRow(ctx, `SELECT leader_id FROM pgdurable.river_leader`).Scan(&id); err == nil {
			leaders[id] = true
		}
	}
	const n = 8
	for i := range n {
		clock.Advance(time.Minute)
		handled(t, engines[i%4], "every-minute", clock)
		leader()
		if i%2 == 1 { // replace one engine; each is replaced once, so River's leader is too
			require.NoError(t, engines[i/2].Stop(ctx))
			engines[i/2] = newOwnEngine()
		}
	}
	eventually(t, 20*time.Second, "a new River leader", func() bool { leader(); return len(leaders) >= 2 })
	t.Logf("River leaders during the test: %d", len(leaders))
	fs := fires(t, engines[0], "every-minute")
	require.Len(t, fs, n)
	for i, f := range fs {
		require.Equal(t, "started", f.Outcome)
		require.Equal(t, time.Date(2026, 1, 1, 0, i+1, 0, 0, time.UTC), f.FireAt)
	}
	var runs, distinct int
	require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT count(*), count(DISTINCT workflow_id) FROM pgdurable.workflow_runs WHERE schedule_name = 'every-minute'`)).Scan(&runs, &distinct))
	require.Equal(t, n, runs)
	require.Equal(t, n, distinct)
	var id string
	require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT workflow_id FROM pgdurable.workflow_runs WHERE schedule_name = 'every-minute' ORDER BY run_id LIMIT 1`)).Scan(&id))
	require.Equal(t, "schedule:every-minute:2026-01-01T00:01:00Z", id)
}

// An engine down for 30 minutes under "@every 5m": with a 1 h catch-up
// window the 6 missed fires start after the restart, in order; with 10 m,
// the 2 younger than 10 minutes start and 4 are recorded as skipped.
func TestScheduleCatchesUpAfterDowntime(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		window           time.Duration
		started, skipped int
	}{{time.Hour, 6, 0}, {10 * time.Minute, 2, 4}} {
		db := enginetest.NewDB(t)
		clock := enginetest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		cfg := &engine.Config{Clock: clock, Logger: quiet}
		admin := newEngine(t, db, cfg, false, tick) // not started: it is the engine that is down
		ctx := testCtx(t)
		_, err := admin.CreateSchedule(ctx, engine.ScheduleSpec{Name: "five", Cron: "@every 5m", Workflow: "tick",
			Overlap: engine.OverlapAllow, CatchupWindow: c.window})
		require.NoError(t, err)
		clock.Advance(30 * time.Minute)
		worker := newEngine(t, db, cfg, true, tick)
		handled(t, worker, "five", clock)

		var started, skipped []engine.ScheduleFire
		for _, f := range fires(t, worker, "five") {
			if f.Outcome == "started" {
				started = append(started, f)
			} else {
				require.Equal(t, "missed", f.Reason)
				skipped = append(skipped, f)
			}
		}
		require.Len(t, started, c.started, c.window)
		require.Len(t, skipped, c.skipped, c.window)
		// Started in order: run IDs (UUID v7) follow fire times.
		rows, err := db.Pool.Query(ctx, db.SQL(`SELECT workflow_id FROM pgdurable.workflow_runs WHERE schedule_name = 'five' ORDER BY run_id`))
		require.NoError(t, err)
		var i int
		for rows.Next() {
			var id string
			require.NoError(t, rows.Scan(&id))
			require.Equal(t, engine.ScheduleWorkflowID("five", started[i].FireAt), id)
			i++
		}
		require.NoError(t, rows.Err())
		require.Equal(t, c.started, i)
	}
}

// ISC cron's DST rule in America/New_York across both 2026 changes
// (8 March, 1 November): fixed-hour schedules fire once per local day,
// and "0 * * * *" fires 25 times on the fall-back day, 3600 s apart.
func TestScheduleDaylightSaving(t *testing.T) {
	t.Parallel()
	ny := mustLoc(t, "America/New_York")
	for _, c := range []struct {
		cron, name string
		from, to   time.Time
		want       int
	}{
		{"30 2 * * *", "spring-0230", time.Date(2026, 3, 6, 0, 0, 0, 0, ny), time.Date(2026, 3, 10, 0, 0, 0, 0, ny), 4},
		{"30 1 * * *", "spring-0130", time.Date(2026, 3, 6, 0, 0, 0, 0, ny), time.Date(2026, 3, 10, 0, 0, 0, 0, ny), 4},
		{"30 2 * * *", "fall-0230", time.Date(2026, 10, 30, 0, 0, 0, 0, ny), time.Date(2026, 11, 3, 0, 0, 0, 0, ny), 4},
		{"30 1 * * *", "fall-0130", time.Date(2026, 10, 30, 0, 0, 0, 0, ny), time.Date(2026, 11, 3, 0, 0, 0, 0, ny), 4},
		{"0 * * * *", "fall-hourly", time.Date(2026, 11, 1, 0, 0, 0, 0, ny).Add(-time.Second), time.Date(2026, 11, 2, 0, 0, 0, 0, ny).Add(-time.Second), 25},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db := enginetest.NewDB(t)
			clock := enginetest.NewClock(c.from)
			cfg := &engine.Config{Clock: clock, Logger: quiet}
			e := newEngine(t, db, cfg, true, tick)
			ctx := testCtx(t)
			_, err := e.CreateSchedule(ctx, engine.ScheduleSpec{Name: c.name, Cron: c.cron, TimeZone: "America/New_York",
				Workflow: "tick", Overlap: engine.OverlapAllow, CatchupWindow: 7 * 24 * time.Hour})
			require.NoError(t, err)
			clock.Set(c.to)
			handled(t, e, c.name, clock)
			fs := fires(t, e, c.name)
			require.Len(t, fs, c.want)
			days := map[string]int{}
			for i, f := range fs {
				require.Equal(t, "started", f.Outcome)
				days[f.FireAt.In(ny).Format("2006-01-02")]++
				if c.want == 25 && i > 0 {
					require.Equal(t, time.Hour, f.FireAt.Sub(fs[i-1].FireAt))
				}
			}
			if c.want == 4 {
				require.Len(t, days, 4, "one run per local day: %v", fs)
			}
			var runs int
			require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT count(*) FROM pgdurable.workflow_runs WHERE schedule_name = $1`), c.name).Scan(&runs))
			require.Equal(t, c.want, runs)
		})
	}
}

// Overlap: skip drops a fire while the previous run is active; buffer_one
// keeps one and starts it when the active run ends, skipping the rest.
func TestScheduleOverlapPolicies(t *testing.T) {
	t.Parallel()
	hold := engine.Define("hold", func(ctx *engine.Context, _ int) (int, error) {
		return engine.AwaitSignal[int](ctx, "release", 0)
	}, nil)
	for _, policy := range []string{engine.OverlapSkip, engine.OverlapBufferOne} {
		db := enginetest.NewDB(t)
		clock := enginetest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		e := newEngine(t, db, &engine.Config{Clock: clock, Logger: quiet}, true, hold)
		ctx := testCtx(t)
		_, err := e.CreateSchedule(ctx, engine.ScheduleSpec{Name: "p", Cron: "* * * * *", Workflow: "hold", Overlap: policy})
		require.NoError(t, err)
		for range 3 { // fire 1 starts a run that waits; fires 2 and 3 overlap it
			clock.Advance(time.Minute)
			handled(t, e, "p", clock)
		}
		first := engine.ScheduleWorkflowID("p", time.Date(2026, 1, 1, 0, 1, 0, 0, time.UTC))
		require.NoError(t, e.Signal(ctx, first, "release", 1, nil))
		second := engine.ScheduleWorkflowID("p", time.Date(2026, 1, 1, 0, 2, 0, 0, time.UTC))
		fs := func() []string {
			var out []string
			for _, f := range fires(t, e, "p") {
				out = append(out, f.Outcome+":"+f.Reason)
			}
			return out
		}
		if policy == engine.OverlapSkip {
			require.Equal(t, []string{"started:", "skipped:overlap", "skipped:overlap"}, fs())
			continue
		}
		// buffer_one: fire 2 waits and starts once run 1 ends; fire 3 is skipped.
		eventually(t, 20*time.Second, "the buffered fire to start", func() bool {
			return len(fs()) == 3 && fs()[1] == "started:"
		})
		require.Equal(t, []string{"started:", "started:", "skipped:overlap"}, fs())
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT count(*) FROM pgdurable.workflow_runs WHERE workflow_id = $1`), second).Scan(&n))
		require.Equal(t, 1, n)
	}
}

// Schedules defined in code are saved at every start-up: SaveSchedule with
// an unchanged expression keeps the next fire time, so the fires missed
// while the process was down are still caught up; a new expression fires
// from now on. A paused schedule stays paused.
func TestSaveScheduleKeepsCatchUpForAnUnchangedExpression(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := enginetest.NewClock(t0)
	e := newEngine(t, db, &engine.Config{Clock: clock, Logger: quiet}, false, tick)
	ctx := testCtx(t)
	spec := engine.ScheduleSpec{Name: "coded", Cron: "@every 5m", Workflow: "tick", Overlap: engine.OverlapAllow}
	s, err := e.SaveSchedule(ctx, spec) // creates
	require.NoError(t, err)
	require.Equal(t, t0.Add(5*time.Minute), s.NextFireAt)

	clock.Advance(30 * time.Minute) // down
	spec.Input = []byte(`3`)        // a new input, same expression
	s, err = e.SaveSchedule(ctx, spec)
	require.NoError(t, err)
	require.Equal(t, t0.Add(5*time.Minute), s.NextFireAt, "the missed fires stay due")
	require.JSONEq(t, `3`, string(s.Input))

	spec.Cron = "@every 10m"
	s, err = e.SaveSchedule(ctx, spec)
	require.NoError(t, err)
	require.Equal(t, clock.Now().Add(10*time.Minute), s.NextFireAt, "a new expression fires from now")

	// An operator pauses it; the next deploy saves it from code again.
	require.NoError(t, e.PauseSchedule(ctx, "coded"))
	s, err = e.SaveSchedule(ctx, spec)
	require.NoError(t, err)
	require.True(t, s.Paused, "saving from code does not resume a paused schedule")
	require.NoError(t, e.ResumeSchedule(ctx, "coded"))
	spec.Paused = true
	s, err = e.UpdateSchedule(ctx, spec)
	require.NoError(t, err)
	require.True(t, s.Paused, "an update can pause")
}

func TestTriggerScheduleStartsARunNowEvenPaused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, tick)
	ctx := testCtx(t)
	_, err := b.engine.CreateSchedule(ctx, engine.ScheduleSpec{Name: "nightly", Cron: "0 3 * * *", Workflow: "tick", Input: []byte(`5`), Paused: true})
	require.NoError(t, err)
	before, err := b.engine.GetSchedule(ctx, "nightly")
	require.NoError(t, err)

	res, err := b.engine.TriggerSchedule(ctx, "nightly")
	require.NoError(t, err)
	require.Contains(t, res.WorkflowID, "schedule:nightly:trigger:")
	run := waitStatus(t, b.engine, res.RunID, engine.StatusCompleted, 20*time.Second)
	require.JSONEq(t, `5`, string(run.Output))
	require.Equal(t, "nightly", run.ScheduleName)

	after, err := b.engine.GetSchedule(ctx, "nightly")
	require.NoError(t, err)
	require.True(t, after.Paused, "a trigger does not resume the schedule")
	require.Equal(t, before.NextFireAt, after.NextFireAt, "the next cron fire is unchanged")
	require.Equal(t, res.RunID, *after.LastRunID)
	fs := fires(t, b.engine, "nightly")
	require.Len(t, fs, 1)
	require.Equal(t, engine.FireStarted, fs[0].Outcome)
	require.Equal(t, res.RunID, *fs[0].RunID)

	// A second trigger starts a second run.
	res2, err := b.engine.TriggerSchedule(ctx, "nightly")
	require.NoError(t, err)
	require.NotEqual(t, res.RunID, res2.RunID)

	_, err = b.engine.TriggerSchedule(ctx, "absent")
	require.ErrorIs(t, err, engine.ErrNotFound)
	_, err = b.engine.TriggerSchedule(ctx, "..")
	require.ErrorIs(t, err, engine.ErrNotFound)
}

// Two triggers at one clock reading (a fake clock, or two operators in the
// same instant) start two runs, each under a workflow ID of its own, and
// both are in the fires; a trigger at the very time of a cron fire keeps
// the cron fire's run and record too. Before, the second trigger got the
// first one's workflow ID and so returned its run, and its fire record
// replaced the first's.
func TestTriggerScheduleTwiceAtOneClockReading(t *testing.T) {
	t.Parallel()
	clock := enginetest.NewClock(time.Date(2026, 1, 1, 0, 0, 30, 0, time.UTC))
	b := setup(t, &engine.Config{Clock: clock, Logger: quiet}, tick)
	ctx := testCtx(t)
	_, err := b.engine.CreateSchedule(ctx, engine.ScheduleSpec{Name: "minutely", Cron: "* * * * *", Workflow: "tick",
		Input: []byte(`3`), Overlap: engine.OverlapAllow})
	require.NoError(t, err)

	first, err := b.engine.TriggerSchedule(ctx, "minutely")
	require.NoError(t, err)
	second, err := b.engine.TriggerSchedule(ctx, "minutely")
	require.NoError(t, err)
	require.False(t, second.Existing, "the second trigger starts a run of its own")
	require.NotEqual(t, first.RunID, second.RunID)
	require.NotEqual(t, first.WorkflowID, second.WorkflowID)
	for _, res := range []*engine.StartResult{first, second} {
		rest, ok := strings.CutPrefix(res.WorkflowID, "schedule:minutely:trigger:")
		require.True(t, ok, res.WorkflowID)
		_, err := uuid.Parse(rest)
		require.NoError(t, err, "a manual trigger's workflow ID ends in a UUID: %s", res.WorkflowID)
		waitStatus(t, b.engine, res.RunID, engine.StatusCompleted, 20*time.Second)
	}

	// At the cron fire time itself: the trigger and the fire each start a
	// run and keep their record, whichever the scheduler handles first.
	clock.Set(time.Date(2026, 1, 1, 0, 1, 0, 0, time.UTC))
	third, err := b.engine.TriggerSchedule(ctx, "minutely")
	require.NoError(t, err)
	handled(t, b.engine, "minutely", clock)
	fs := fires(t, b.engine, "minutely")
	require.Len(t, fs, 4, "three triggers and one cron fire: %+v", fs)
	runs := map[uuid.UUID]bool{}
	for _, f := range fs {
		require.Equal(t, engine.FireStarted, f.Outcome)
		require.NotNil(t, f.RunID)
		runs[*f.RunID] = true
	}
	require.Len(t, runs, 4, "four fires, four runs")
	for _, res := range []*engine.StartResult{first, second, third} {
		require.True(t, runs[res.RunID], "trigger run %s is in the fires", res.RunID)
	}
	cron, err := b.engine.FindRun(ctx, engine.ScheduleWorkflowID("minutely", clock.Now()))
	require.NoError(t, err, "the cron fire keeps its fire-time workflow ID")
	require.True(t, runs[cron])
}
