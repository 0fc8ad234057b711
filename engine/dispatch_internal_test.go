package engine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A process holds as many runs as its workers would start within about a
// second, at the speed its deliveries have had, within its floor and
// ceiling.
func TestMaxHeldFollowsDeliveryTime(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		deliveries []time.Duration
		want       int
	}{
		{"before any delivery ended", nil, 1000},
		{"50 ms deliveries: 100 workers start 2,000 runs a second", []time.Duration{50 * time.Millisecond}, 2000},
		{"slow deliveries keep the floor", []time.Duration{10 * time.Second}, 1000},
		{"fast deliveries stop at the ceiling", []time.Duration{time.Millisecond}, 10000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &Engine{cfg: Config{MaxWorkers: 100}}
			for _, d := range tc.deliveries {
				e.deliveryTime.add(d)
			}
			require.Equal(t, tc.want, e.maxHeld())
		})
	}
}

// The average weighs each new delivery 1/16, so one outlier moves it a
// little and a lasting change moves it all the way.
func TestMovingAverage(t *testing.T) {
	t.Parallel()
	var m movingAverage
	m.add(100 * time.Millisecond)
	m.add(1700 * time.Millisecond)
	require.Equal(t, 200*time.Millisecond, m.get())
	for range 200 {
		m.add(10 * time.Millisecond)
	}
	require.InDelta(t, float64(10*time.Millisecond), float64(m.get()), float64(time.Millisecond))
}
