package enginetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
)

// mockT records a helper's failure instead of ending the test, so a test
// can check that the helper failed and what it said.
type mockT struct {
	failed bool
	logs   []string
}

func (m *mockT) FailNow() { m.failed = true }
func (m *mockT) Helper()  {}
func (m *mockT) Logf(format string, args ...any) {
	m.logs = append(m.logs, fmt.Sprintf(format, args...))
}
func (m *mockT) message() string { return strings.Join(m.logs, "\n") }
func (m *mockT) requireFailed(t *testing.T) string {
	t.Helper()
	require.True(t, m.failed)
	return m.message()
}

type requireBundle struct {
	e                              *engine.Engine
	ok                             *engine.Workflow[string, string]
	fails, panics, sleeps, repeats *engine.Workflow[string, string]
}

// setupRequire starts an engine with a workflow for each way a run ends:
// ok completes after steps a and b, fails records a permanent failure of
// step charge and fails, panics parks the run as dead (reason panic) in
// step boom, sleeps waits an hour, repeats records step s twice.
func setupRequire(t *testing.T) *requireBundle {
	t.Helper()
	step := func(ctx *engine.Context, name string, fn func() (string, error)) (string, error) {
		return engine.Step(ctx, name, func(context.Context) (string, error) { return fn() }, nil)
	}
	b := &requireBundle{}
	b.ok = engine.Define("require-ok", func(ctx *engine.Context, in string) (string, error) {
		if _, err := step(ctx, "a", func() (string, error) { return "", nil }); err != nil {
			return "", err
		}
		return step(ctx, "b", func() (string, error) { return "done:" + in, nil })
	}, nil)
	b.fails = engine.Define("require-fails", func(ctx *engine.Context, _ string) (string, error) {
		return step(ctx, "charge", func() (string, error) { return "", engine.Permanent(errors.New("card declined")) })
	}, nil)
	b.panics = engine.Define("require-panics", func(ctx *engine.Context, _ string) (string, error) {
		return step(ctx, "boom", func() (string, error) { panic("kaboom") })
	}, nil)
	b.sleeps = engine.Define("require-sleeps", func(ctx *engine.Context, _ string) (string, error) {
		return "", engine.Sleep(ctx, time.Hour)
	}, nil)
	b.repeats = engine.Define("require-repeats", func(ctx *engine.Context, _ string) (string, error) {
		for range 2 {
			if _, err := step(ctx, "s", func() (string, error) { return "", nil }); err != nil {
				return "", err
			}
		}
		return "", nil
	}, nil)
	b.e = NewEngine(t, NewDB(t), &engine.Config{Logger: slog.New(slog.DiscardHandler)}, true, b.ok, b.fails, b.panics, b.sleeps, b.repeats)
	return b
}

func (b *requireBundle) start(t *testing.T, wf *engine.Workflow[string, string]) uuid.UUID {
	t.Helper()
	res, err := wf.Start(context.Background(), b.e, "x", nil)
	require.NoError(t, err)
	return res.RunID
}

func TestRequireRunStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupRequire(t)

	t.Run("Completed", func(t *testing.T) {
		id := b.start(t, b.ok)
		m := &mockT{}
		run := requireRunStatus(ctx, m, b.e, id, engine.StatusCompleted, 0)
		require.False(t, m.failed, m.message())
		require.Equal(t, engine.StatusCompleted, run.Status)
		require.Len(t, run.Steps, 2, "the run is returned in full")
		require.JSONEq(t, `"done:x"`, string(run.Output))
		require.Equal(t, "done:x", requireResult(ctx, m, b.e, b.ok, id, 0))
		require.False(t, m.failed, m.message())
	})

	t.Run("OtherTerminalStatusFailsAtOnce", func(t *testing.T) {
		id := b.start(t, b.fails)
		m := &mockT{}
		begin := time.Now()
		require.Nil(t, requireRunStatus(ctx, m, b.e, id, engine.StatusCompleted, time.Minute))
		require.Less(t, time.Since(begin), 30*time.Second, "a failed run cannot complete: no need to wait out the timeout")
		msg := m.requireFailed(t)
		require.Contains(t, msg, "pgdurable assertion failure")
		require.Contains(t, msg, fmt.Sprintf("run %s ended failed, want completed", id))
		require.Contains(t, msg, `workflow "require-fails", status failed`)
		require.Contains(t, msg, `0 "charge" step failed, 1 attempts, error: permanent: card declined`)
	})

	t.Run("DeadRunListsItsDeadJob", func(t *testing.T) {
		id := b.start(t, b.panics)
		m := &mockT{}
		require.Nil(t, requireRunStatus(ctx, m, b.e, id, engine.StatusCompleted, 0))
		msg := m.requireFailed(t)
		require.Contains(t, msg, "ended dead, want completed")
		require.Contains(t, msg, `reason panic, step "boom"`)
		require.Contains(t, msg, "kaboom")
	})

	t.Run("Timeout", func(t *testing.T) {
		id := b.start(t, b.sleeps)
		RequireRunStatus(ctx, t, b.e, id, engine.StatusWaiting, 0)
		m := &mockT{}
		require.Nil(t, requireRunStatus(ctx, m, b.e, id, engine.StatusCompleted, 100*time.Millisecond))
		msg := m.requireFailed(t)
		require.Contains(t, msg, fmt.Sprintf("run %s is waiting after 100ms, want completed", id))
		require.Contains(t, msg, `0 "sleep" sleep started`)
	})

	t.Run("ContextEnds", func(t *testing.T) {
		id := b.start(t, b.sleeps)
		RequireRunStatus(ctx, t, b.e, id, engine.StatusWaiting, 0)
		// Long enough for a first read on a loaded machine: the message
		// needs the status read before the context ended.
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		m := &mockT{}
		require.Nil(t, requireRunStatus(cctx, m, b.e, id, engine.StatusCompleted, time.Minute))
		require.Contains(t, m.requireFailed(t), "is waiting, want completed, when the context ended: context deadline exceeded")
	})

	t.Run("NoSuchRun", func(t *testing.T) {
		m := &mockT{}
		id := uuid.New()
		require.Nil(t, requireRunStatus(ctx, m, b.e, id, engine.StatusCompleted, 0))
		require.Contains(t, m.requireFailed(t), "no run "+id.String())
	})

	t.Run("ResultOfAnotherWorkflow", func(t *testing.T) {
		id := b.start(t, b.repeats)
		m := &mockT{}
		require.Empty(t, requireResult(ctx, m, b.e, b.ok, id, 0))
		require.Contains(t, m.requireFailed(t), fmt.Sprintf(`run %s is a run of workflow "require-repeats", not "require-ok"`, id))
	})
}

func TestRequireSteps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupRequire(t)
	id := b.start(t, b.ok)
	RequireRunCompleted(ctx, t, b.e, id, 0)

	m := &mockT{}
	steps := requireSteps(ctx, m, b.e, id, []string{"a", "b"})
	require.False(t, m.failed, m.message())
	require.Len(t, steps, 2)

	m = &mockT{}
	require.Nil(t, requireSteps(ctx, m, b.e, id, []string{"a", "c"}))
	msg := m.requireFailed(t)
	require.Contains(t, msg, fmt.Sprintf(`run %s recorded steps ["a" "b"], want ["a" "c"]`, id))
	require.Contains(t, msg, `1 "b" step completed, 1 attempts`)
}

func TestRequireStepRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupRequire(t)
	ok := b.start(t, b.ok)
	RequireRunCompleted(ctx, t, b.e, ok, 0)

	t.Run("Found", func(t *testing.T) {
		m := &mockT{}
		s := requireStepRecorded(ctx, m, b.e, ok, "b", &RequireStepOpts{Kind: engine.KindStep, Status: engine.StepCompleted, Attempts: 1})
		require.False(t, m.failed, m.message())
		require.Equal(t, 1, s.Seq)
		require.JSONEq(t, `"done:x"`, string(s.Output))
	})

	t.Run("Missing", func(t *testing.T) {
		m := &mockT{}
		require.Nil(t, requireStepRecorded(ctx, m, b.e, ok, "c", nil))
		msg := m.requireFailed(t)
		require.Contains(t, msg, fmt.Sprintf(`run %s recorded no step "c"; its steps:`, ok))
		require.Contains(t, msg, `0 "a" step completed`)
	})

	t.Run("OptsDiffer", func(t *testing.T) {
		m := &mockT{}
		require.Nil(t, requireStepRecorded(ctx, m, b.e, ok, "a", &RequireStepOpts{Kind: engine.KindActivity, Status: engine.StepFailed, Attempts: 3}))
		require.Contains(t, m.requireFailed(t), `step "a" (seq 0) of run `+ok.String()+` has kind step, want activity, status completed, want failed, 1 attempts, want 3`)
	})

	t.Run("Ambiguous", func(t *testing.T) {
		id := b.start(t, b.repeats)
		RequireRunCompleted(ctx, t, b.e, id, 0)
		m := &mockT{}
		require.Nil(t, requireStepRecorded(ctx, m, b.e, id, "s", nil))
		require.Contains(t, m.requireFailed(t), `recorded 2 steps named "s" (RequireSteps checks them all)`)
	})
}

func TestRequireDeadJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupRequire(t)
	dead := b.start(t, b.panics)
	RequireRunStatus(ctx, t, b.e, dead, engine.StatusDead, 0)

	m := &mockT{}
	j := requireDeadJob(ctx, m, b.e, dead, &RequireDeadJobOpts{Reason: engine.ReasonPanic, StepName: "boom"})
	require.False(t, m.failed, m.message())
	require.Equal(t, dead, j.RunID)

	m = &mockT{}
	require.Nil(t, requireDeadJob(ctx, m, b.e, dead, &RequireDeadJobOpts{Reason: engine.ReasonRetriesExhausted, StepName: "other"}))
	require.Contains(t, m.requireFailed(t), fmt.Sprintf(`run %s has a dead job with reason panic, want retries_exhausted, step "boom", want "other"`, dead))

	ok := b.start(t, b.ok)
	RequireRunCompleted(ctx, t, b.e, ok, 0)
	m = &mockT{}
	require.Nil(t, requireDeadJob(ctx, m, b.e, ok, nil))
	msg := m.requireFailed(t)
	require.Contains(t, msg, fmt.Sprintf("run %s has no open dead job", ok))
	require.Contains(t, msg, "status completed")
}
