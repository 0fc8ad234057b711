package engine_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
)

// A step, activity or workflow result over MaxPayloadBytes is refused on
// its one attempt with ErrOutputTooLarge, which the workflow can catch;
// nothing oversized is stored. Before, a 5 MiB result was stored whole and
// loaded again on every replay.
func TestOversizedOutputsAreRefusedAndCatchable(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 5<<20)
	var calls int
	wf := engine.Define("big-output", func(ctx *engine.Context, _ int) (string, error) {
		var caught []string
		_, err := engine.Step(ctx, "step", func(context.Context) (string, error) { calls++; return big, nil }, nil)
		var se *engine.StepError
		if errors.Is(err, engine.ErrOutputTooLarge) && errors.As(err, &se) {
			caught = append(caught, string(se.Class))
		}
		_, err = engine.RunActivity(ctx, "activity", func(context.Context, *engine.ActivityAttempt) (string, error) { return big, nil }, nil)
		if errors.Is(err, engine.ErrOutputTooLarge) {
			caught = append(caught, "activity")
		}
		return strings.Join(caught, ","), nil
	}, nil)
	wfBig := engine.Define("big-workflow-output", func(ctx *engine.Context, _ int) (string, error) { return big, nil }, nil)
	b := setup(t, nil, wf, wfBig)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "output_too_large,activity", out)
	require.Equal(t, 1, calls, "not retried")
	var stored int
	require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT coalesce(max(octet_length(coalesce(output::text, '') || coalesce(error::text, ''))), 0)
		FROM pgdurable.workflow_steps WHERE run_id = $1`), res.RunID).Scan(&stored))
	require.Less(t, stored, 64<<10, "nothing oversized is stored")

	res, err = wfBig.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	run := waitStatus(t, b.engine, res.RunID, engine.StatusDead, 10*time.Second)
	require.ErrorIs(t, run.Error.Err(), engine.ErrOutputTooLarge)
	require.Empty(t, run.Output)
}

// Signals are bounded per run, by count and by bytes (consumed ones count:
// they are kept for replays), so a run's view never grows without bound.
func TestSignalsAreBoundedPerRun(t *testing.T) {
	t.Parallel()
	wf := engine.Define("signal-bound", func(ctx *engine.Context, _ int) (string, error) {
		return engine.AwaitSignal[string](ctx, "never", 0)
	}, nil)
	b := setup(t, &engine.Config{MaxSignalsPerRun: 3, MaxSignalBytesPerRun: 64}, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	for range 3 {
		require.NoError(t, b.engine.Signal(ctx, res.RunID.String(), "other", "x", nil))
	}
	err = b.engine.Signal(ctx, res.RunID.String(), "other", "x", nil)
	require.ErrorIs(t, err, engine.ErrLimitExceeded)
	require.ErrorContains(t, err, "holds 3 signals")

	res2, err := wf.Start(ctx, b.engine, 1, nil)
	require.NoError(t, err)
	require.NoError(t, b.engine.Signal(ctx, res2.RunID.String(), "other", strings.Repeat("y", 40), nil))
	err = b.engine.Signal(ctx, res2.RunID.String(), "other", strings.Repeat("y", 40), nil)
	require.ErrorIs(t, err, engine.ErrLimitExceeded)
	require.ErrorContains(t, err, "64-byte bound")
	run, err := b.engine.GetRun(ctx, res2.RunID)
	require.NoError(t, err)
	require.Len(t, run.Signals, 1)
}

// A client's JSON is checked for what would make it two values: an object
// with keys equal but for case is validated as one value and run as
// another (encoding/json matches field names regardless of case, jsonb
// reorders keys), so it is refused, as is JSON nested deeper than 128
// levels (found by an attack pass: an order validated with amount 5000
// was charged 1).
func TestClientJSONThatDecodesTwoWaysIsRefused(t *testing.T) {
	t.Parallel()
	wf := engine.Define("shape", func(ctx *engine.Context, o order) (int, error) { return o.Amount, nil }, nil)
	waiter := engine.Define("shape-signal", func(ctx *engine.Context, _ int) (string, error) {
		return engine.AwaitSignal[string](ctx, "s", 0)
	}, nil)
	b := setup(t, nil, wf, waiter)
	ctx := testCtx(t)
	for _, in := range []string{
		`{"id": "o", "amount": 1, "AMOUNT": 5000}`,
		`{"id": "o", "nested": {"x": 1, "X": 2}, "amount": 1}`,
		`{"id": "o", "Amount": 2, "amount": 1}`,
		strings.Repeat("[", 129) + strings.Repeat("]", 129),
	} {
		_, err := b.engine.StartJSON(ctx, "shape", []byte(in), nil)
		require.ErrorIs(t, err, engine.ErrInvalidInput, in)
	}
	res, err := b.engine.StartJSON(ctx, "shape", []byte(`{"id": "o", "amount": 7, "list": [{"a": 1}, {"a": 2}]}`), nil)
	require.NoError(t, err, "equal keys in different objects are fine")
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 7, out)

	sig, err := waiter.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	require.ErrorIs(t, b.engine.SignalJSON(ctx, sig.RunID.String(), "s", []byte(strings.Repeat("[", 200)+strings.Repeat("]", 200)), nil), engine.ErrInvalidInput)
	require.ErrorIs(t, b.engine.SignalJSON(ctx, sig.RunID.String(), "s", []byte(`1e999999`), nil), engine.ErrInvalidInput, "a number PostgreSQL cannot store")
}

// Names an operator reads (workflow IDs, signal names) carry no invisible
// characters: no bidi override, zero-width character, line separator or
// white space at either end (found by an attack pass: "evil\u202estep").
func TestNamesRefuseInvisibleCharacters(t *testing.T) {
	t.Parallel()
	wf := echoWorkflow("names")
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	for _, id := range []string{"order\u202eevil", "order\u200b1", "\ufefforder", "order\u2028x", " order", "order "} {
		_, err := wf.Start(ctx, b.engine, 1, &engine.StartOpts{WorkflowID: id})
		require.ErrorIs(t, err, engine.ErrInvalidInput, "%q", id)
	}
	_, err := wf.Start(ctx, b.engine, 1, &engine.StartOpts{WorkflowID: "order\u00a0with nbsp and ünïcode"})
	require.NoError(t, err, "visible characters, spaces inside included, are fine")
}
