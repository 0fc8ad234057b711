package engine_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
)

// collect waits for n "item" signals and returns their payloads in order.
var collect = engine.Define("collect", func(ctx *engine.Context, n int) ([]int, error) {
	var got []int
	for range n {
		v, err := engine.AwaitSignal[int](ctx, "item", 0)
		if err != nil {
			return nil, err
		}
		got = append(got, v)
	}
	return got, nil
}, nil)

// Twenty concurrent SignalWithStart calls for one workflow ID start one
// run, and the run receives all twenty signals, each once.
func TestSignalWithStartFromTwentyCallersGivesOneRunAndTwentySignals(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, collect)
	ctx := testCtx(t)
	type result struct {
		res *engine.StartResult
		err error
	}
	results := make(chan result, 20)
	for i := range 20 {
		go func() {
			res, err := collect.SignalWithStart(ctx, b.engine, engine.SignalWithStartParams[int]{Input: 20, Opts: &engine.StartOpts{WorkflowID: "cart-1"}, Signal: "item", Payload: i, SignalOpts: nil})
			results <- result{res, err}
		}()
	}
	runID := make(map[uuid.UUID]int)
	created := 0
	for range 20 {
		r := <-results
		require.NoError(t, r.err)
		runID[r.res.RunID]++
		if !r.res.Existing {
			created++
		}
	}
	require.Len(t, runID, 1, "one run")
	require.Equal(t, 1, created, "one caller started it")
	var id uuid.UUID
	for k := range runID {
		id = k
	}
	out, err := collect.Wait(ctx, b.engine, id, 20*time.Millisecond)
	require.NoError(t, err)
	require.Len(t, out, 20)
	seen := map[int]bool{}
	for _, v := range out {
		seen[v] = true
	}
	require.Len(t, seen, 20, "each signal received once")
}

// SignalWithStart signals a run that exists, whatever input it is given;
// needs a workflow ID; refuses a finished run; takes a signal key.
func TestSignalWithStartSignalsAnExistingRun(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, collect)
	ctx := testCtx(t)
	first, err := collect.Start(ctx, b.engine, 2, &engine.StartOpts{WorkflowID: "cart-2"})
	require.NoError(t, err)
	key := &engine.SignalOpts{Key: "k"}
	res, err := collect.SignalWithStart(ctx, b.engine, engine.SignalWithStartParams[int]{Input: 99, Opts: &engine.StartOpts{WorkflowID: "cart-2"}, Signal: "item", Payload: 1, SignalOpts: key})
	require.NoError(t, err)
	require.True(t, res.Existing)
	require.Equal(t, first.RunID, res.RunID)
	_, err = collect.SignalWithStart(ctx, b.engine, engine.SignalWithStartParams[int]{Input: 99, Opts: &engine.StartOpts{WorkflowID: "cart-2"}, Signal: "item", Payload: 1, SignalOpts: key})
	require.NoError(t, err, "a retry with the key")
	_, err = collect.SignalWithStart(ctx, b.engine, engine.SignalWithStartParams[int]{Input: 2, Opts: &engine.StartOpts{WorkflowID: "cart-2"}, Signal: "item", Payload: 2, SignalOpts: nil})
	require.NoError(t, err)
	out, err := collect.Wait(ctx, b.engine, first.RunID, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, []int{1, 2}, out)

	_, err = collect.SignalWithStart(ctx, b.engine, engine.SignalWithStartParams[int]{Input: 2, Opts: &engine.StartOpts{WorkflowID: "cart-2"}, Signal: "item", Payload: 3, SignalOpts: nil})
	require.ErrorIs(t, err, engine.ErrRunClosed)
	_, err = collect.SignalWithStart(ctx, b.engine, engine.SignalWithStartParams[int]{Input: 2, Opts: nil, Signal: "item", Payload: 3, SignalOpts: nil})
	require.ErrorIs(t, err, engine.ErrInvalidArgument)
	_, err = collect.SignalWithStart(ctx, b.engine, engine.SignalWithStartParams[int]{Input: 2, Opts: &engine.StartOpts{WorkflowID: "cart-3"}, Signal: "", Payload: 3, SignalOpts: nil})
	require.ErrorIs(t, err, engine.ErrInvalidArgument)
	_, err = b.engine.FindRun(ctx, "cart-3")
	require.ErrorIs(t, err, engine.ErrNotFound, "a refused signal starts nothing")
}
