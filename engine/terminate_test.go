package engine_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
)

// Terminate ends a running run at once: no compensation runs, the step
// running finishes without its record landing, the run's error says who
// and why, a retry succeeds, and a finished run is refused.
func TestTerminateEndsARunningRunAtOnceWithoutCompensating(t *testing.T) {
	t.Parallel()
	var undos, after atomic.Int64
	inStep := make(chan struct{})
	wf := engine.Define("terminate-me", func(ctx *engine.Context, _ int) (int, error) {
		if _, err := engine.Step(ctx, "first", func(context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return 0, err
		}
		if err := ctx.Compensate(engine.Undo{Name: "undo-first", Fn: func(context.Context, *engine.ActivityAttempt) error {
			undos.Add(1)
			return nil
		}}); err != nil {
			return 0, err
		}
		_, err := engine.Step(ctx, "slow", func(sctx context.Context) (int, error) {
			close(inStep)
			<-sctx.Done() // the termination stops the delivery
			return 0, sctx.Err()
		}, nil)
		if err != nil {
			return 0, err
		}
		after.Add(1)
		return 2, nil
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	<-inStep
	require.NoError(t, b.engine.Terminate(ctx, res.RunID, &engine.TerminateOpts{Reason: "stuck on bug 42", By: "ann"}))
	_, err = wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	var runErr *engine.RunError
	require.ErrorAs(t, err, &runErr)
	require.Equal(t, engine.StatusTerminated, runErr.Status)
	require.Equal(t, engine.ClassTerminated, runErr.Info.Class)
	require.Equal(t, "terminated by ann: stuck on bug 42", runErr.Info.Message)
	time.Sleep(300 * time.Millisecond) // nothing more runs
	require.Zero(t, undos.Load(), "no compensation")
	require.Zero(t, after.Load())
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusTerminated, run.Status)
	require.Len(t, run.Steps, 1, "the step that was running left no record")

	require.NoError(t, b.engine.Terminate(ctx, res.RunID, &engine.TerminateOpts{Reason: "again"}), "a retry succeeds")
	require.ErrorIs(t, b.engine.Terminate(ctx, res.RunID, &engine.TerminateOpts{}), engine.ErrInvalidArgument)
	require.ErrorIs(t, b.engine.Terminate(ctx, res.RunID, nil), engine.ErrInvalidArgument, "a reason is required")
}

// A terminated child wakes its waiting parent, whose Get returns a
// *ChildError with status terminated; a dead run terminated has its dead
// job resolved; a completed run is refused with ErrRunClosed.
func TestTerminateAChildADeadRunAndAFinishedOne(t *testing.T) {
	t.Parallel()
	child := engine.Define("terminate-kid", func(ctx *engine.Context, _ int) (int, error) {
		return engine.AwaitSignal[int](ctx, "never", 0)
	}, nil)
	parent := engine.Define("terminate-parent", func(ctx *engine.Context, _ int) (string, error) {
		_, err := engine.ChildWorkflow(ctx, child, 0, &engine.ChildOpts{WorkflowID: "the-kid"})
		var ce *engine.ChildError
		if !errors.As(err, &ce) {
			return "", err
		}
		return string(ce.Status), nil
	}, nil)
	dies := engine.Define("terminate-dead", func(ctx *engine.Context, _ int) (int, error) {
		return engine.Step(ctx, "boom", func(context.Context) (int, error) { panic("boom") }, nil)
	}, nil)
	quick := engine.Define("terminate-quick", func(ctx *engine.Context, _ int) (int, error) { return 1, nil }, nil)
	b := setup(t, nil, parent, child, dies, quick)
	ctx := testCtx(t)
	res, err := parent.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		id, err := b.engine.FindRun(ctx, "the-kid")
		if err != nil {
			return false
		}
		run, err := b.engine.GetRun(ctx, id)
		return err == nil && run.Status == engine.StatusWaiting
	}, 10*time.Second, 10*time.Millisecond)
	kid, err := b.engine.FindRun(ctx, "the-kid")
	require.NoError(t, err)
	require.NoError(t, b.engine.Terminate(ctx, kid, &engine.TerminateOpts{Reason: "test"}))
	out, err := parent.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "terminated", out)

	dead, err := dies.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	waitStatus(t, b.engine, dead.RunID, engine.StatusDead, 10*time.Second)
	require.NoError(t, b.engine.Terminate(ctx, dead.RunID, &engine.TerminateOpts{Reason: "poison", By: "bob"}))
	jobs, _, err := b.engine.ListDeadJobs(ctx, engine.ListDeadJobsParams{RunID: dead.RunID})
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	require.NotNil(t, jobs[0].ResolvedAt)

	q, err := quick.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	_, err = quick.Wait(ctx, b.engine, q.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	err = b.engine.Terminate(ctx, q.RunID, &engine.TerminateOpts{Reason: "late"})
	require.ErrorIs(t, err, engine.ErrRunClosed)
	require.ErrorContains(t, err, "is completed")
}

// A termination's reason and by, and a dead job's by and note, are read
// by operators in lists, logs and the web UI: they refuse control
// characters (terminal escapes), characters that reorder or hide what is
// around them (bidi overrides and isolates) and line or paragraph
// separators; reason and by are one line (no newline or tab), a note may
// hold several (found by an attack pass: a reason with "\x1b[2J", "\n" and
// U+202E was kept and logged).
func TestTerminateAndDeadJobTextRefuseControlAndBidiCharacters(t *testing.T) {
	t.Parallel()
	wf := engine.Define("terminate-text", func(ctx *engine.Context, _ int) (int, error) {
		return engine.AwaitSignal[int](ctx, "never", 0)
	}, nil)
	dies := engine.Define("terminate-text-dead", func(ctx *engine.Context, _ int) (int, error) {
		return engine.Step(ctx, "boom", func(context.Context) (int, error) { panic("boom") }, nil)
	}, nil)
	b := setup(t, nil, wf, dies)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	bad := []string{"a\x1b[2Jb", "first\nforged second line", "tab\there", "a\u2028b", "a\u2029b", "evil\u202egnp.exe",
		"\u202aembedded", "\u2066isolate\u2069", "nul\x00", "c1\u009b2J"}
	for _, s := range bad {
		err := b.engine.Terminate(ctx, res.RunID, &engine.TerminateOpts{Reason: s})
		require.ErrorIs(t, err, engine.ErrInvalidArgument, "reason %q", s)
		err = b.engine.Terminate(ctx, res.RunID, &engine.TerminateOpts{Reason: "ok", By: s})
		require.ErrorIs(t, err, engine.ErrInvalidArgument, "by %q", s)
	}
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.NotEqual(t, engine.StatusTerminated, run.Status, "nothing was terminated")

	dead, err := dies.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	waitStatus(t, b.engine, dead.RunID, engine.StatusDead, 10*time.Second)
	jobs, _, err := b.engine.ListDeadJobs(ctx, engine.ListDeadJobsParams{RunID: dead.RunID})
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	for _, s := range bad {
		_, err := b.engine.DiscardDeadJob(ctx, jobs[0].ID, &engine.ResolveOpts{By: s})
		require.ErrorIs(t, err, engine.ErrInvalidArgument, "by %q", s)
		if s == "first\nforged second line" || s == "tab\there" {
			continue // a note may hold several lines
		}
		_, err = b.engine.DiscardDeadJob(ctx, jobs[0].ID, &engine.ResolveOpts{Note: s})
		require.ErrorIs(t, err, engine.ErrInvalidArgument, "note %q", s)
	}
	_, err = b.engine.DiscardDeadJob(ctx, jobs[0].ID, &engine.ResolveOpts{By: "ann (ünïcode)", Note: "line one\n\tline two"})
	require.NoError(t, err, "visible text, and a note on several lines, are fine")

	require.NoError(t, b.engine.Terminate(ctx, res.RunID, &engine.TerminateOpts{Reason: "stuck on bug «42» — see ticket", By: "ann ünïcode"}))
	run, err = b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, "terminated by ann ünïcode: stuck on bug «42» — see ticket", run.Error.Message)
}

// An activity in flight when its run is terminated may still take effect,
// and nothing undoes it: its step stays started, with its request ID, and
// Run.UnsettledSteps names it for an operator to check.
func TestTerminateLeavesAnActivityInFlightUnsettled(t *testing.T) {
	t.Parallel()
	var charged atomic.Int64
	inCall, release := make(chan struct{}), make(chan struct{})
	wf := engine.Define("terminate-in-flight", func(ctx *engine.Context, _ int) (string, error) {
		if _, err := engine.Step(ctx, "reserve", func(context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return "", err
		}
		return engine.RunActivity(ctx, "charge", func(context.Context, *engine.ActivityAttempt) (string, error) {
			close(inCall)
			<-release
			charged.Add(1)
			return "ch_1", nil
		}, nil)
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	<-inCall
	require.NoError(t, b.engine.Terminate(ctx, res.RunID, &engine.TerminateOpts{Reason: "stuck", By: "ann"}))
	close(release)
	require.Eventually(t, func() bool { return charged.Load() == 1 }, 10*time.Second, 10*time.Millisecond)
	time.Sleep(300 * time.Millisecond) // its record would land now, and is refused
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusTerminated, run.Status)
	unsettled := run.UnsettledSteps()
	require.Len(t, unsettled, 1)
	require.Equal(t, "charge", unsettled[0].Name)
	require.Equal(t, engine.KindActivity, unsettled[0].Kind)
	require.Equal(t, engine.StepStarted, unsettled[0].Status)
	require.NotNil(t, unsettled[0].RequestID)
}
