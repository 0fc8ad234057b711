package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// replayed is a version of the workflow "replayed" (see steps).
func replayed(body func(ctx *engine.Context, in string) (string, error)) *engine.Workflow[string, string] {
	return engine.Define("replayed", body, nil)
}

func countedStep(ctx *engine.Context, calls *atomic.Int64, name string) error {
	_, err := engine.Step(ctx, name, func(context.Context) (string, error) {
		calls.Add(1)
		return name, nil
	}, nil)
	return err
}

// steps runs the named steps in order ("approve" is a wait for that
// signal, "patched-x" step x behind Patched(ctx, "x")); calls counts the
// steps' functions that ran.
func steps(calls *atomic.Int64, names ...string) func(ctx *engine.Context, in string) (string, error) {
	return func(ctx *engine.Context, in string) (string, error) {
		for _, n := range names {
			var err error
			switch n {
			case "approve":
				_, err = engine.AwaitSignal[string](ctx, "approve", time.Hour)
			case "patched-x":
				if engine.Patched(ctx, "x") {
					err = countedStep(ctx, calls, "x")
				}
			default:
				err = countedStep(ctx, calls, n)
			}
			if err != nil {
				return "", err
			}
		}
		return "done " + in, nil
	}
}

// Replay checks a workflow's current code against recorded histories:
// unchanged and correctly patched code passes; an inserted, removed or
// renamed step, a step past the end of a finished run, and another result
// fail, naming the position. No step's function runs in a replay.
func TestReplayCatchesChanges(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := testCtx(t)
	var live atomic.Int64
	v1 := replayed(steps(&live, "a", "b", "approve", "c"))
	e := newEngine(t, db, nil, true, v1)
	done, err := v1.Start(ctx, e, "one", nil)
	require.NoError(t, err)
	waiting, err := v1.Start(ctx, e, "two", nil)
	require.NoError(t, err)
	for _, r := range []*engine.StartResult{done, waiting} {
		enginetest.RequireRunStatus(ctx, t, e, r.RunID, engine.StatusWaiting, 0)
	}
	require.NoError(t, e.Signal(ctx, done.RunID.String(), "approve", "ann", nil))
	enginetest.RequireRunCompleted(ctx, t, e, done.RunID, 0)
	history := func(r *engine.StartResult) *engine.History {
		run, err := e.GetRun(ctx, r.RunID)
		require.NoError(t, err)
		h, err := engine.NewHistory(run)
		require.NoError(t, err)
		// Through JSON, as a file holds it.
		b, err := json.Marshal(h)
		require.NoError(t, err)
		var back engine.History
		require.NoError(t, json.Unmarshal(b, &back))
		return &back
	}
	completed, open := history(done), history(waiting)
	require.Len(t, completed.Steps, 4)
	require.Len(t, open.Steps, 3)

	var replays atomic.Int64
	replay := func(h *engine.History, names ...string) error {
		t.Helper()
		return engine.Replay(ctx, enginetest.NewDB(t).Pool, replayed(steps(&replays, names...)), h)
	}
	for _, h := range []*engine.History{completed, open} {
		require.NoError(t, replay(h, "a", "b", "approve", "c"), "unchanged")
		require.NoError(t, replay(h, "a", "patched-x", "b", "approve", "c"), "patched before a recorded step")
	}
	for _, tc := range []struct {
		name     string
		code     []string
		seq      int
		recorded string
	}{
		{"inserted", []string{"a", "x", "b", "approve", "c"}, 1, `step "b"`},
		{"removed", []string{"a", "approve", "c"}, 1, `step "b"`},
		{"renamed", []string{"a", "b2", "approve", "c"}, 1, `step "b"`},
		{"reordered", []string{"b", "a", "approve", "c"}, 0, `step "a"`},
	} {
		for _, h := range []*engine.History{completed, open} {
			err := replay(h, tc.code...)
			var re *engine.ReplayError
			require.True(t, errors.As(err, &re), "%s: %v", tc.name, err)
			require.Equal(t, tc.seq, re.Seq, tc.name)
			require.Equal(t, tc.recorded, re.Recorded, tc.name)
			require.Contains(t, re.Message, "step "+string(rune('0'+tc.seq))+" is recorded as", tc.name)
		}
	}
	// A step past the end: a finished run departs, a waiting one goes on.
	err = replay(completed, "a", "b", "approve", "c", "d")
	var re *engine.ReplayError
	require.True(t, errors.As(err, &re), "%v", err)
	require.Equal(t, 4, re.Seq)
	require.Contains(t, re.Message, `position 4: the code calls step "d", past the end of the history (the run ended completed after 4 steps)`)
	require.NoError(t, replay(open, "a", "b", "approve", "c", "d"))
	// Returning early: fewer steps than recorded.
	err = replay(completed, "a", "b", "approve")
	require.True(t, errors.As(err, &re), "%v", err)
	require.Contains(t, re.Message, "returned after 3 steps but 4 are recorded")
	// Another result.
	other := engine.Define("replayed", func(ctx *engine.Context, in string) (string, error) {
		if _, err := steps(&replays, "a", "b", "approve", "c")(ctx, in); err != nil {
			return "", err
		}
		return "changed " + in, nil
	}, nil)
	err = engine.Replay(ctx, enginetest.NewDB(t).Pool, other, completed)
	require.True(t, errors.As(err, &re), "%v", err)
	require.Equal(t, `the code returns "changed one" where the run returned "done one"`, re.Message)
	require.Zero(t, replays.Load(), "no step's function runs in a replay")

	// A history of another workflow, or format, is refused.
	wrong := *completed
	wrong.Workflow = "other"
	require.ErrorIs(t, engine.Replay(ctx, enginetest.NewDB(t).Pool, v1, &wrong), engine.ErrInvalidArgument)
	wrong = *completed
	wrong.Format = 99
	require.ErrorIs(t, engine.Replay(ctx, enginetest.NewDB(t).Pool, v1, &wrong), engine.ErrInvalidArgument)

	// A history that NewHistory could not have written is refused, as is
	// a database that holds runs (Replay needs a scratch one).
	for name, edit := range map[string]func(h *engine.History){
		"no steps":       func(h *engine.History) { h.Steps = nil },
		"unknown status": func(h *engine.History) { h.Status = "bogus" },
		"no input":       func(h *engine.History) { h.Input = nil },
		"same position":  func(h *engine.History) { h.Steps[1].Seq = h.Steps[0].Seq },
		"negative":       func(h *engine.History) { h.Steps[0].Seq = -1 },
		"far position":   func(h *engine.History) { h.Steps[3].Seq = 5000 },
		"unknown kind":   func(h *engine.History) { h.Steps[0].Kind = "magic" },
		"unknown status of a step": func(h *engine.History) {
			h.Steps[0].Status = "weird"
		},
		"bad name": func(h *engine.History) { h.Steps[0].Name = "" },
	} {
		bad := *completed
		bad.Steps = append([]engine.StepInfo(nil), completed.Steps...)
		edit(&bad)
		err := engine.Replay(ctx, enginetest.NewDB(t).Pool, v1, &bad)
		require.ErrorIs(t, err, engine.ErrInvalidArgument, name)
	}
	err = engine.Replay(ctx, db.Pool, v1, completed)
	require.ErrorIs(t, err, engine.ErrInvalidArgument)
	require.ErrorContains(t, err, "the database holds runs")

	// enginetest.ReplayDir replays a folder of exported histories.
	dir := t.TempDir()
	for name, h := range map[string]*engine.History{"completed.json": completed, "open.json": open} {
		b, err := json.MarshalIndent(h, "", "  ")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o600))
	}
	enginetest.ReplayDir(t, replayed(steps(&replays, "a", "patched-x", "b", "approve", "c")), dir)
}

// A pair of same-named steps swapped is invisible to names alone; with
// StepOpts.Input, the recorded hash catches it, in a replay test and in a
// live run alike, naming the position.
func TestReplayCatchesReorderedStepsByTheirInput(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := testCtx(t)
	reserve := func(items []string, withInput bool) *engine.Workflow[string, string] {
		return engine.Define("reserve-items", func(ctx *engine.Context, _ string) (string, error) {
			for _, it := range items {
				var opts *engine.StepOpts
				if withInput {
					opts = &engine.StepOpts{Input: it}
				}
				if _, err := engine.Step(ctx, "reserve", func(context.Context) (string, error) { return it, nil }, opts); err != nil {
					return "", err
				}
			}
			_, err := engine.AwaitSignal[string](ctx, "ship", time.Hour)
			return "shipped", err
		}, nil)
	}
	v1 := reserve([]string{"tee", "mug"}, true)
	e := newEngine(t, db, nil, true, v1)
	r, err := v1.Start(ctx, e, "", nil)
	require.NoError(t, err)
	enginetest.RequireRunStatus(ctx, t, e, r.RunID, engine.StatusWaiting, 0)
	run, err := e.GetRun(ctx, r.RunID)
	require.NoError(t, err)
	require.NotNil(t, run.Steps[0].InputHash)
	require.NotEqual(t, *run.Steps[0].InputHash, *run.Steps[1].InputHash)
	h, err := engine.NewHistory(run)
	require.NoError(t, err)

	err = engine.Replay(ctx, enginetest.NewDB(t).Pool, reserve([]string{"mug", "tee"}, true), h)
	var re *engine.ReplayError
	require.True(t, errors.As(err, &re), "%v", err)
	require.Equal(t, 0, re.Seq)
	require.Contains(t, re.Message, `step 0 "reserve" is recorded with another input`)
	require.NoError(t, engine.Replay(ctx, enginetest.NewDB(t).Pool, reserve([]string{"tee", "mug"}, true), h), "unchanged")
	require.NoError(t, engine.Replay(ctx, enginetest.NewDB(t).Pool, reserve([]string{"mug", "tee"}, false), h),
		"without inputs, names alone cannot tell")

	// Live: the swapped code deployed under the waiting run parks it.
	require.NoError(t, e.Stop(ctx))
	swapped := newEngine(t, db, nil, true, reserve([]string{"mug", "tee"}, true))
	require.NoError(t, swapped.Signal(ctx, r.RunID.String(), "ship", "now", nil))
	enginetest.RequireRunStatus(ctx, t, swapped, r.RunID, engine.StatusDead, 0)
	job := enginetest.RequireDeadJob(ctx, t, swapped, r.RunID, &enginetest.RequireDeadJobOpts{Reason: engine.ReasonNonDeterminism})
	require.Equal(t, 0, *job.Seq)
	require.Contains(t, job.ErrorMessage, "steps of this name were reordered")

	// An input json.Marshal rejects is refused, and nothing is recorded.
	bad := engine.Define("bad-input", func(ctx *engine.Context, _ string) (string, error) {
		return engine.Step(ctx, "s", func(context.Context) (string, error) { return "", nil }, &engine.StepOpts{Input: func() {}})
	}, nil)
	be := newEngine(t, db, nil, true, bad)
	br, err := bad.Start(ctx, be, "", nil)
	require.NoError(t, err)
	_, err = bad.Wait(ctx, be, br.RunID, 10*time.Millisecond)
	require.ErrorContains(t, err, "StepOpts.Input")
}
