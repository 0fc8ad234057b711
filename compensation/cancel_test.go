package compensation_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/activities"
	"github.com/pgdurable/pgdurable/compensation"
	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

type tripFixture struct {
	e             *engine.Engine
	wf            *engine.Workflow[int, string]
	flightStarted chan struct{}
	flightStopped chan time.Time
	bookings      atomic.Int64
	undos         chan string
}

// newTrip: reserve_hotel (undo cancel_hotel), charge (undo refund), then a
// 30 s book_flight activity that heartbeats every 500 ms.
func newTrip(t *testing.T, flightRetry *engine.RetryPolicy) *tripFixture {
	f := &tripFixture{flightStarted: make(chan struct{}, 1), flightStopped: make(chan time.Time, 1), undos: make(chan string, 10)}
	undo := func(name string) compensation.Undo[int] {
		return compensation.Undo[int]{Name: name, Fn: func(ctx context.Context, call activities.Call, _ int) error {
			if ctx.Err() != nil {
				return ctx.Err() // compensations must not run in a cancelled context
			}
			time.Sleep(50 * time.Millisecond)
			f.undos <- name
			return nil
		}}
	}
	flight := &activities.Activity[int, int]{
		Name: "book_flight",
		Fn: func(ctx context.Context, call activities.Call, n int) (int, error) {
			if flightRetry != nil {
				return 0, errors.New("airline unavailable")
			}
			f.flightStarted <- struct{}{}
			for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
				if err := call.Heartbeat(ctx); err != nil {
					f.flightStopped <- time.Now()
					return 0, err
				}
			}
			f.bookings.Add(1)
			return n, nil
		},
		HeartbeatTimeout: 5 * time.Second,
		RetryPolicy:      flightRetry,
	}
	f.wf = engine.Define("cancellable-trip", func(ctx *engine.Context, n int) (string, error) {
		saga := compensation.New(ctx)
		if _, err := compensation.Step(saga, "reserve_hotel", func(context.Context) (int, error) { return 1, nil }, undo("cancel_hotel"), nil); err != nil {
			return "", err
		}
		if _, err := compensation.Step(saga, "charge", func(context.Context) (int, error) { return 2, nil }, undo("refund"), nil); err != nil {
			return "", err
		}
		if _, err := activities.Execute(ctx, flight, n); err != nil {
			return "", err
		}
		return "booked", nil
	}, nil)
	f.e = enginetest.NewEngine(t, enginetest.NewDB(t), nil, true, f.wf)
	return f
}

func TestCancelStopsTheActivityAndCompensates(t *testing.T) {
	t.Parallel()
	f := newTrip(t, nil)
	ctx := context.Background()
	res, err := f.wf.Start(ctx, f.e, 1, nil)
	require.NoError(t, err)
	<-f.flightStarted
	time.Sleep(200 * time.Millisecond)

	cancelledAt := time.Now()
	require.NoError(t, f.e.Cancel(ctx, res.RunID))
	stopped := <-f.flightStopped
	t.Logf("the activity saw the cancellation %s after Cancel", stopped.Sub(cancelledAt).Round(time.Millisecond))
	require.Less(t, stopped.Sub(cancelledAt), time.Second, "at the activity's next heartbeat (every 500ms)")

	require.Equal(t, "refund", <-f.undos)
	require.NoError(t, f.e.Cancel(ctx, res.RunID), "a second cancel during compensation changes nothing")
	require.Equal(t, "cancel_hotel", <-f.undos)

	run := waitStatus(t, f.e, res.RunID, engine.StatusCancelled)
	require.Equal(t, engine.ClassCancelled, run.Error.Class)
	require.Zero(t, f.bookings.Load())
	var names []string
	for _, s := range run.Steps {
		names = append(names, string(s.Kind)+":"+s.Name+":"+string(s.Status))
	}
	require.Equal(t, []string{"step:reserve_hotel:completed", "step:charge:completed", "activity:book_flight:cancelled",
		"compensation:refund:completed", "compensation:cancel_hotel:completed"}, names)

	require.NoError(t, f.e.Cancel(ctx, res.RunID), "cancelling a cancelled run again is a no-op")
	require.ErrorIs(t, f.e.Cancel(ctx, [16]byte{1}), engine.ErrNotFound)
}

// A run waiting out a retry backoff is delivered at once when cancelled.
func TestCancelOfAWaitingRunCompensatesAtOnce(t *testing.T) {
	t.Parallel()
	f := newTrip(t, &engine.RetryPolicy{InitialInterval: time.Hour})
	ctx := context.Background()
	res, err := f.wf.Start(ctx, f.e, 1, nil)
	require.NoError(t, err)
	waitStatus(t, f.e, res.RunID, engine.StatusWaiting)
	start := time.Now()
	require.NoError(t, f.e.Cancel(ctx, res.RunID))
	waitStatus(t, f.e, res.RunID, engine.StatusCancelled)
	require.Less(t, time.Since(start), 5*time.Second)
	require.Equal(t, "refund", <-f.undos)
	require.Equal(t, "cancel_hotel", <-f.undos)
}
