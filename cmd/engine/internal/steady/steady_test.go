package steady_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/cmd/engine/internal/steady"
)

// The window leaves out a slow start and a slow tail: 100 units, the
// first and last tenth each 300 ms apart from the rest, the 80 between
// them in two quick steps.
func TestWindowLeavesOutRampAndTail(t *testing.T) {
	var done atomic.Int64
	r, err := steady.While(context.Background(), &done, 100, func() error {
		go func() {
			time.Sleep(300 * time.Millisecond)
			done.Add(10)
			time.Sleep(5 * time.Millisecond)
			done.Add(40)
			time.Sleep(5 * time.Millisecond)
			done.Add(40)
			time.Sleep(300 * time.Millisecond)
			done.Add(10)
		}()
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 80, r.Units)
	require.GreaterOrEqual(t, r.Elapsed, 600*time.Millisecond)
	require.Less(t, r.Window, r.Elapsed/2, "neither the 300 ms ramp nor the 300 ms tail is in the window")
}

// A workload that completes at once is timed whole.
func TestAllAtOnce(t *testing.T) {
	var done atomic.Int64
	done.Store(5)
	r, err := steady.Wait(context.Background(), &done, 5)
	require.NoError(t, err)
	require.Equal(t, 5, r.Units)
	require.Positive(t, r.Window)
}

func TestWaitStopsWithItsContext(t *testing.T) {
	var done atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := steady.Wait(ctx, &done, 5)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}
