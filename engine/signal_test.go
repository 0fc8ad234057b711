package engine_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

type approval struct {
	By string `json:"by"`
}

// awaitTwo waits for two "approve" signals and returns who sent them, in order.
var awaitTwo = engine.Define("await-two", func(ctx *engine.Context, _ int) ([]string, error) {
	var by []string
	for range 2 {
		a, err := engine.AwaitSignal[approval](ctx, "approve", 0)
		if err != nil {
			return nil, err
		}
		by = append(by, a.By)
	}
	return by, nil
}, nil)

// A signal sent before the run reaches AwaitSignal is buffered and
// received; a second one with the same name goes to the second wait, in
// the order sent, each consumed once.
func TestSignalsAreBufferedAndReceivedInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, awaitTwo)
	ctx := testCtx(t)
	res, err := awaitTwo.Start(ctx, b.engine, 0, &engine.StartOpts{WorkflowID: "order-7"})
	require.NoError(t, err)
	// Sent at once: the first probably before the run starts waiting.
	require.NoError(t, b.engine.Signal(ctx, res.RunID.String(), "approve", approval{By: "alice"}, nil))
	require.NoError(t, b.engine.Signal(ctx, "order-7", "approve", approval{By: "bob"}, nil)) // by workflow ID
	out, err := awaitTwo.Wait(ctx, b.engine, res.RunID, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, []string{"alice", "bob"}, out)
	var consumed int
	require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT count(*) FROM pgdurable.workflow_signals WHERE run_id = $1 AND consumed_seq IS NOT NULL`), res.RunID).Scan(&consumed))
	require.Equal(t, 2, consumed)
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Len(t, run.Signals, 2)
	require.Equal(t, 0, *run.Signals[0].ConsumedSeq)
	require.Equal(t, 1, *run.Signals[1].ConsumedSeq)
	require.JSONEq(t, `{"by": "bob"}`, string(run.Signals[1].Payload))
}

// A run waiting for a signal holds nothing and wakes when it arrives.
func TestSignalWakesAWaitingRun(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, awaitTwo)
	ctx := testCtx(t)
	res, err := awaitTwo.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	require.NoError(t, b.engine.Signal(ctx, res.RunID.String(), "approve", approval{By: "alice"}, nil))
	run := waitStatus(t, b.engine, res.RunID, engine.StatusWaiting, 10*time.Second)
	require.Equal(t, "approve", run.AwaitSignal)
	require.NoError(t, b.engine.Signal(ctx, res.RunID.String(), "other", 1, nil)) // another name: stays asleep
	time.Sleep(300 * time.Millisecond)
	run, err = b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusWaiting, run.Status)

	sent := time.Now()
	require.NoError(t, b.engine.Signal(ctx, res.RunID.String(), "approve", approval{By: "bob"}, nil))
	out, err := awaitTwo.Wait(ctx, b.engine, res.RunID, 5*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, []string{"alice", "bob"}, out)
	t.Logf("signal to completion: %s", time.Since(sent).Round(time.Millisecond))
}

// A wait with a timeout returns ErrTimeout once the timeout passes (on the
// engine's clock), not before, and the outcome is recorded.
func TestAwaitSignalTimesOut(t *testing.T) {
	t.Parallel()
	clock := enginetest.NewClock(clockStart)
	wf := engine.Define("await-timeout", func(ctx *engine.Context, _ int) (string, error) {
		_, err := engine.AwaitSignal[approval](ctx, "approve", 10*time.Minute)
		if errors.Is(err, engine.ErrTimeout) {
			return "timed out", nil
		}
		if err != nil {
			return "", err
		}
		return "approved", nil
	}, nil)
	b := setup(t, &engine.Config{Clock: clock}, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	dueAfter(t, b.engine, clock, res.RunID, 10*time.Minute)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "timed out", out)
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.True(t, run.Steps[0].TimedOut, "the record says the wait timed out")
	// A signal sent after the timeout finds the run finished.
	err = b.engine.Signal(ctx, res.RunID.String(), "approve", approval{By: "late"}, nil)
	require.ErrorIs(t, err, engine.ErrRunClosed)
}

// Bad signals are rejected with a precise error and change nothing.
func TestSignalRejectsBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, &engine.Config{MaxPayloadBytes: 100}, awaitTwo)
	ctx := testCtx(t)
	res, err := awaitTwo.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	id := res.RunID.String()
	require.ErrorIs(t, b.engine.Signal(ctx, "no-such-run", "approve", 1, nil), engine.ErrNotFound)
	require.ErrorIs(t, b.engine.Signal(ctx, "01a22c94-802a-7ed0-abb6-1a3a198a504e", "approve", 1, nil), engine.ErrNotFound)
	require.ErrorIs(t, b.engine.Signal(ctx, id, "", 1, nil), engine.ErrInvalidArgument)
	require.ErrorIs(t, b.engine.Signal(ctx, id, "approve", strings.Repeat("x", 200), nil), engine.ErrInvalidInput)
	require.ErrorIs(t, b.engine.Signal(ctx, id, "approve", "nul\x00", nil), engine.ErrInvalidInput)
	require.ErrorIs(t, b.engine.Signal(ctx, id, "approve", func() {}, nil), engine.ErrInvalidInput)
	require.ErrorIs(t, b.engine.SignalJSON(ctx, id, "approve", []byte(`{"by":`), nil), engine.ErrInvalidInput)

	// A signal in a transaction that rolls back never arrives.
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, b.engine.SignalTx(ctx, tx, id, "approve", approval{By: "ghost"}, nil))
	require.NoError(t, tx.Rollback(ctx))
	var n int
	require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT count(*) FROM pgdurable.workflow_signals WHERE run_id = $1`), res.RunID).Scan(&n))
	require.Zero(t, n)
}

// A cancelled run waiting for a signal wakes and ends cancelled.
func TestCancelWakesARunWaitingForASignal(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, awaitTwo)
	ctx := testCtx(t)
	res, err := awaitTwo.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	waitStatus(t, b.engine, res.RunID, engine.StatusWaiting, 10*time.Second)
	require.NoError(t, b.engine.Cancel(ctx, res.RunID))
	waitStatus(t, b.engine, res.RunID, engine.StatusCancelled, 10*time.Second)
	require.ErrorIs(t, b.engine.Signal(ctx, res.RunID.String(), "approve", approval{}, nil), engine.ErrRunClosed)
}

func ExampleAwaitSignal() {
	_ = engine.Define("expense", func(ctx *engine.Context, amount int) (string, error) {
		// Waits up to 3 days with no goroutine, connection or worker held;
		// Engine.Signal(ctx, runID, "approve", approval{By: "ann"}) wakes it.
		a, err := engine.AwaitSignal[approval](ctx, "approve", 72*time.Hour)
		if errors.Is(err, engine.ErrTimeout) {
			return "expired", nil
		}
		if err != nil {
			return "", err
		}
		return "approved by " + a.By, nil
	}, nil)
}

// Many senders at once while the run alternates between waiting and
// running: every signal is received exactly once, none lost to the race
// between a wait's look and its suspension.
func TestConcurrentSignalsAreEachReceivedOnce(t *testing.T) {
	t.Parallel()
	const n = 40
	wf := engine.Define("collect", func(ctx *engine.Context, _ int) ([]int, error) {
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
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- b.engine.Signal(ctx, res.RunID.String(), "item", i, nil) }()
	}
	for range n {
		require.NoError(t, <-errs)
	}
	out, err := wf.Wait(ctx, b.engine, res.RunID, 20*time.Millisecond)
	require.NoError(t, err)
	require.Len(t, out, n)
	seen := map[int]bool{}
	for _, v := range out {
		require.False(t, seen[v], "signal %d received twice", v)
		seen[v] = true
	}
	// Received in the order they were stored.
	rows, err := b.db.Pool.Query(ctx, b.db.SQL(`SELECT (payload #>> '{}')::int FROM pgdurable.workflow_signals WHERE run_id = $1 ORDER BY id`), res.RunID)
	require.NoError(t, err)
	var stored []int
	for rows.Next() {
		var v int
		require.NoError(t, rows.Scan(&v))
		stored = append(stored, v)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, stored, out)
}

// A wait the run's cancellation ends is recorded as cancelled, like a step
// the cancellation stops, so a finished run shows no wait still started.
func TestCancelledWaitIsRecordedCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, awaitTwo)
	ctx := testCtx(t)
	res, err := awaitTwo.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	waitStatus(t, b.engine, res.RunID, engine.StatusWaiting, 10*time.Second)
	require.NoError(t, b.engine.Cancel(ctx, res.RunID))
	run := waitStatus(t, b.engine, res.RunID, engine.StatusCancelled, 10*time.Second)
	require.Len(t, run.Steps, 1)
	require.Equal(t, engine.StepCancelled, run.Steps[0].Status)
	require.Equal(t, engine.KindSignal, run.Steps[0].Kind)
	require.Nil(t, run.Steps[0].NextAttemptAt, "no deadline left on a wait that ended")
	require.NotNil(t, run.Steps[0].CompletedAt)
}

// A keyed signal sent 5 times (a client retrying) is stored and received
// once, also once the run has finished; the key with another payload is a
// conflict; a bad key is refused.
func TestSignalKeySentFiveTimesIsReceivedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, awaitTwo)
	ctx := testCtx(t)
	res, err := awaitTwo.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	key := &engine.SignalOpts{Key: "req-1"}
	for range 5 {
		require.NoError(t, b.engine.Signal(ctx, res.RunID.String(), "approve", approval{By: "alice"}, key))
	}
	err = b.engine.Signal(ctx, res.RunID.String(), "approve", approval{By: "mallory"}, key)
	require.ErrorIs(t, err, engine.ErrSignalKeyConflict)
	err = b.engine.Signal(ctx, res.RunID.String(), "reject", approval{By: "alice"}, key)
	require.ErrorIs(t, err, engine.ErrSignalKeyConflict, "the same key for another signal name")
	_, err = awaitTwo.Result(ctx, b.engine, res.RunID)
	require.ErrorIs(t, err, engine.ErrRunNotFinished, "one signal received: the second wait still waits")

	require.NoError(t, b.engine.Signal(ctx, res.RunID.String(), "approve", approval{By: "bob"}, &engine.SignalOpts{Key: "req-2"}))
	out, err := awaitTwo.Wait(ctx, b.engine, res.RunID, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, []string{"alice", "bob"}, out)
	// The run finished: a retry of an accepted signal is still accepted; a new one is refused.
	require.NoError(t, b.engine.Signal(ctx, res.RunID.String(), "approve", approval{By: "bob"}, &engine.SignalOpts{Key: "req-2"}))
	require.ErrorIs(t, b.engine.Signal(ctx, res.RunID.String(), "approve", approval{By: "bob"}, &engine.SignalOpts{Key: "req-3"}), engine.ErrRunClosed)

	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Len(t, run.Signals, 2)
	require.Equal(t, "req-1", run.Signals[0].Key)
	require.Equal(t, "req-2", run.Signals[1].Key)
	require.ErrorIs(t, b.engine.Signal(ctx, res.RunID.String(), "approve", nil, &engine.SignalOpts{Key: strings.Repeat("k", 201)}), engine.ErrInvalidArgument)
}

// Concurrent senders of one key store one signal.
func TestConcurrentSendersOfOneSignalKeyStoreOneSignal(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, awaitTwo)
	ctx := testCtx(t)
	res, err := awaitTwo.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	errs := make(chan error, 20)
	for range 20 {
		go func() {
			errs <- b.engine.Signal(ctx, res.RunID.String(), "approve", approval{By: "alice"}, &engine.SignalOpts{Key: "same"})
		}()
	}
	for range 20 {
		require.NoError(t, <-errs)
	}
	var n int
	require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT count(*) FROM pgdurable.workflow_signals WHERE run_id = $1`), res.RunID).Scan(&n))
	require.Equal(t, 1, n)
}
