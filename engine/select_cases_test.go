package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
)

// First returns the first parallel step to finish; the replay (after a
// sleep ends the first delivery) returns the same one although by then
// every step has finished, and no step runs again.
func TestFirstReturnsTheFirstFutureAndReplaysTheSameOne(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	type out struct {
		Index int `json:"index"`
		Value int `json:"value"`
	}
	wf := engine.Define("select-first", func(ctx *engine.Context, _ int) (out, error) {
		fs := make([]*engine.Future[int], 3)
		for i := range fs {
			fs[i] = engine.Go(ctx, fmt.Sprint("racer", i), func(context.Context) (int, error) {
				calls.Add(1)
				time.Sleep(time.Duration(3-i) * 150 * time.Millisecond) // the last one finishes first
				return i * 100, nil
			}, nil)
		}
		i, v, err := engine.First(ctx, "fastest", fs)
		if err != nil {
			return out{}, err
		}
		if _, err := engine.All(ctx, fs); err != nil {
			return out{}, err
		}
		if err := engine.Sleep(ctx, 2*time.Second); err != nil { // ends this delivery: the next replays
			return out{}, err
		}
		return out{Index: i, Value: v}, nil
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	got, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, out{Index: 2, Value: 200}, got)
	require.Equal(t, int64(3), calls.Load(), "no step ran again on replay")
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.KindSelect, run.Steps[3].Kind)
	require.Equal(t, "fastest", run.Steps[3].Name)
	require.GreaterOrEqual(t, run.Deliveries, 2)
}

// A Select over a child run, a signal and a timer: the run suspends
// (waiting, its await listing the signal and the child) and the signal
// wins; the next Select's timer beats a child that waits for ever; a
// third Select's child wins once it ends. Each outcome is recorded.
func TestSelectOverAChildASignalAndATimer(t *testing.T) {
	t.Parallel()
	child := engine.Define("select-child", func(ctx *engine.Context, _ int) (string, error) {
		return engine.AwaitSignal[string](ctx, "finish", 0)
	}, nil)
	wf := engine.Define("select-mixed", func(ctx *engine.Context, _ int) ([]string, error) {
		c, err := engine.StartChild(ctx, child, 0, nil)
		if err != nil {
			return nil, err
		}
		var got []string
		sel, err := engine.Select(ctx, "first", engine.OnChild(c), engine.OnSignal("poke"), engine.OnTimer(time.Hour))
		if err != nil {
			return nil, err
		}
		got = append(got, fmt.Sprintf("%d:%s:%s", sel.Index, sel.Signal, sel.Payload))
		sel, err = engine.Select(ctx, "second", engine.OnChild(c), engine.OnTimer(300*time.Millisecond))
		if err != nil {
			return nil, err
		}
		got = append(got, fmt.Sprint(sel.Index))
		sel, err = engine.Select(ctx, "third", engine.OnChild(c), engine.OnSignal("never"))
		if err != nil {
			return nil, err
		}
		v, err := c.Get(ctx)
		if err != nil {
			return nil, err
		}
		return append(got, fmt.Sprint(sel.Index, ":", v)), nil
	}, nil)
	b := setup(t, &engine.Config{SweepInterval: 50 * time.Millisecond}, wf, child)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		run, err := b.engine.GetRun(ctx, res.RunID)
		require.NoError(t, err)
		return run.Status == engine.StatusWaiting && len(run.AwaitChildren) == 1 && run.AwaitSignal == "poke"
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, b.engine.Signal(ctx, res.RunID.String(), "poke", "hi", nil))
	require.Eventually(t, func() bool {
		run, err := b.engine.GetRun(ctx, res.RunID)
		require.NoError(t, err)
		return len(run.Steps) >= 3 && run.Steps[2].Status == engine.StepCompleted // the timer won
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, b.engine.Signal(ctx, fmt.Sprintf("%s:0", res.RunID), "finish", "done", nil))
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, []string{`1:poke:"hi"`, "1", "0:done"}, out)
}

// Malformed selects are refused before anything is recorded.
func TestSelectRefusesMalformedCases(t *testing.T) {
	t.Parallel()
	wf := engine.Define("select-bad", func(ctx *engine.Context, _ int) ([]string, error) {
		var msgs []string
		for _, cases := range [][]engine.SelectCase{
			nil,
			{engine.OnSignal("a"), engine.OnSignal("a")},
			{engine.OnTimer(-time.Second)},
			{{}},
			{engine.OnFuture[int](nil)},
			{engine.OnSignal("bad\x00name")},
		} {
			_, err := engine.Select(ctx, "s", cases...)
			if !errors.Is(err, engine.ErrInvalidArgument) {
				return nil, fmt.Errorf("want ErrInvalidArgument, got %v", err)
			}
			msgs = append(msgs, err.Error())
		}
		return msgs, nil
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Len(t, out, 6)
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Empty(t, run.Steps)
}

// A run suspended in a Select that is cancelled wakes at once, records the
// Select as cancelled and ends cancelled; a Select of timers alone waits
// for nothing but its earliest timer.
func TestCancelledSelectAndATimersOnlySelect(t *testing.T) {
	t.Parallel()
	wf := engine.Define("select-cancel", func(ctx *engine.Context, timersOnly bool) (int, error) {
		if timersOnly {
			sel, err := engine.Select(ctx, "timers", engine.OnTimer(time.Hour), engine.OnTimer(1200*time.Millisecond))
			return sel.Index, err
		}
		sel, err := engine.Select(ctx, "wait", engine.OnSignal("never"), engine.OnTimer(time.Hour))
		return sel.Index, err
	}, nil)
	b := setup(t, &engine.Config{SweepInterval: 50 * time.Millisecond}, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, false, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		run, err := b.engine.GetRun(ctx, res.RunID)
		require.NoError(t, err)
		return run.Status == engine.StatusWaiting && run.AwaitSignal == "never"
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, b.engine.Cancel(ctx, res.RunID))
	_, err = wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.ErrorIs(t, err, engine.ErrCancelled)
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StepCancelled, run.Steps[0].Status)

	res, err = wf.Start(ctx, b.engine, true, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		run, err := b.engine.GetRun(ctx, res.RunID)
		require.NoError(t, err)
		return run.Status == engine.StatusWaiting && run.WakeAt != nil
	}, 10*time.Second, 10*time.Millisecond)
	run, err = b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Empty(t, run.AwaitSignal)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 1, out, "the earliest timer wins")
}

// Select's signal and timer racing, 100 runs: each run takes exactly one
// branch (the signal taken, or the timer with the signal left buffered),
// and its replay after a sleep takes the same.
func TestSelectSignalAndTimerRaceHundredRuns(t *testing.T) {
	t.Parallel()
	wf := engine.Define("select-cases-race", func(ctx *engine.Context, _ int) (string, error) {
		sel, err := engine.Select(ctx, "race", engine.OnSignal("go"), engine.OnTimer(250*time.Millisecond))
		if err != nil {
			return "", err
		}
		if err := engine.Sleep(ctx, 1100*time.Millisecond); err != nil { // the replay decides again, from the record
			return "", err
		}
		return []string{"go", "timeout"}[sel.Index], nil
	}, nil)
	b := setup(t, &engine.Config{SweepInterval: 50 * time.Millisecond}, wf)
	ctx := testCtx(t)
	ids := make([]uuid.UUID, 100)
	for i := range ids {
		res, err := wf.Start(ctx, b.engine, i, nil)
		require.NoError(t, err)
		ids[i] = res.RunID
	}
	time.Sleep(200 * time.Millisecond)
	for _, id := range ids {
		go func() { _ = b.engine.Signal(ctx, id.String(), "go", nil, nil) }() // races the 250 ms timer
	}
	counts := map[string]int{}
	for _, id := range ids {
		out, err := wf.Wait(ctx, b.engine, id, 20*time.Millisecond)
		require.NoError(t, err)
		counts[out]++
		run, err := b.engine.GetRun(ctx, id)
		require.NoError(t, err)
		require.GreaterOrEqual(t, run.Deliveries, 2, "replayed after the sleep")
		consumed := 0
		for _, s := range run.Signals {
			if s.ConsumedSeq != nil {
				consumed++
			}
		}
		if out == "go" {
			require.Equal(t, 1, consumed, "the signal branch took it")
		} else {
			require.Zero(t, consumed, "the timer branch left it buffered")
		}
	}
	t.Logf("branches taken: %v", counts)
	require.Equal(t, 100, counts["go"]+counts["timeout"])
}
