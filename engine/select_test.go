package engine_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
)

// SelectSignal takes the first of several signals: a run waiting for
// "approve" or "reject" wakes on either, records which, and a replay (the
// next delivery, after a sleep) takes the same branch even though the
// other signal arrived meanwhile.
func TestSelectSignalTakesTheFirstAndReplaysTheSameBranch(t *testing.T) {
	t.Parallel()
	wf := engine.Define("select-two", func(ctx *engine.Context, _ int) (string, error) {
		sig, payload, err := engine.SelectSignal(ctx, "decision", []string{"approve", "reject"}, 0)
		if err != nil {
			return "", err
		}
		if err := engine.Sleep(ctx, 2*time.Second); err != nil { // ends the delivery: the rest replays
			return "", err
		}
		var by string
		if err := json.Unmarshal(payload, &by); err != nil {
			return "", err
		}
		return sig + " by " + by, nil
	}, nil)
	b := setup(t, &engine.Config{SweepInterval: 50 * time.Millisecond}, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	waitStatus(t, b.engine, res.RunID, engine.StatusWaiting, 10*time.Second)
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, "approve, reject", run.AwaitSignal)
	require.Equal(t, []string{"approve", "reject"}, run.AwaitSignals)
	require.NoError(t, b.engine.Signal(ctx, res.RunID.String(), "reject", "ann", nil))
	waitFor := func() {
		for {
			r, err := b.engine.GetRun(ctx, res.RunID)
			require.NoError(t, err)
			if len(r.Steps) >= 2 {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor() // the select is recorded and the run sleeps
	require.NoError(t, b.engine.Signal(ctx, res.RunID.String(), "approve", "bob", nil))
	out, err := wf.Wait(ctx, b.engine, res.RunID, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "reject by ann", out)
	run, err = b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.GreaterOrEqual(t, run.Deliveries, 2)
	require.Len(t, run.Signals, 2)
	require.NotNil(t, run.Signals[0].ConsumedSeq, "reject consumed")
	require.Nil(t, run.Signals[1].ConsumedSeq, "approve left in the buffer")
}

// A signal and a timer racing, 100 runs: each run takes exactly one
// branch (the signal consumed, or the timeout with the signal left
// buffered), and its replay after a sleep takes the same.
func TestSelectSignalRaceHundredRuns(t *testing.T) {
	t.Parallel()
	wf := engine.Define("select-race-100", func(ctx *engine.Context, _ int) (string, error) {
		sig, _, err := engine.SelectSignal(ctx, "race", []string{"go"}, 250*time.Millisecond)
		if err != nil {
			return "timeout", nil
		}
		if err := engine.Sleep(ctx, 1100*time.Millisecond); err != nil { // the replay decides again, from the record
			return "", err
		}
		return sig, nil
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
		consumed := 0
		for _, s := range run.Signals {
			if s.ConsumedSeq != nil {
				consumed++
			}
		}
		switch out {
		case "go":
			require.Equal(t, 1, consumed, "the signal branch consumed it")
			require.GreaterOrEqual(t, run.Deliveries, 2, "replayed after the sleep")
		case "timeout":
			require.Zero(t, consumed, "the timer branch left it buffered")
		default:
			t.Fatalf("run %s: %q", id, out)
		}
	}
	t.Logf("branches taken: %v", counts)
	require.Equal(t, 100, counts["go"]+counts["timeout"])
}

// Bad selects are refused before they take a position.
func TestSelectSignalRefusesBadNames(t *testing.T) {
	t.Parallel()
	wf := engine.Define("select-bad", func(ctx *engine.Context, _ int) (string, error) {
		var errs []string
		for _, names := range [][]string{nil, {"a", "a"}, {"ok", "bad\x01name"}} {
			_, _, err := engine.SelectSignal(ctx, "s", names, time.Second)
			errs = append(errs, fmt.Sprint(err != nil))
		}
		return fmt.Sprint(errs), nil
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "[true true true]", out)
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Empty(t, run.Steps)
}
