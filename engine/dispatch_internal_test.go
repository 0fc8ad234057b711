package engine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A process holds as many runs as its workers would start within about a
// second, at the speed its deliveries have had (or, when those running now
// have all run longer, at their age so far), up to its ceiling; nothing
// before any delivery has ended, however many workers it has.
func TestMaxHeldFollowsDeliveryTime(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		deliveries []time.Duration
		running    []time.Duration // ages of the deliveries running now
		want       int
	}{
		{"before any delivery ended", nil, nil, 0},
		{"before any delivery ended, with deliveries running", nil, []time.Duration{time.Millisecond}, 0},
		{"50 ms deliveries: 100 workers start 2,000 runs a second", []time.Duration{50 * time.Millisecond}, nil, 2000},
		{"10 s deliveries: 10 runs a second", []time.Duration{10 * time.Second}, nil, 10},
		{"a minute's deliveries: one", []time.Duration{time.Minute}, nil, 1},
		{"fast deliveries stop at the ceiling", []time.Duration{time.Millisecond}, nil, 10000},
		{"running ones younger than the average do not count", []time.Duration{50 * time.Millisecond},
			[]time.Duration{time.Millisecond, 10 * time.Second}, 2000},
		{"all running longer than the average: their age counts", []time.Duration{50 * time.Millisecond},
			[]time.Duration{500 * time.Millisecond, 10 * time.Second}, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &Engine{cfg: Config{MaxWorkers: 100}}
			for _, d := range tc.deliveries {
				e.deliveryTime.add(d)
			}
			for i, age := range tc.running {
				e.live.Store(i, &delivery{claimedAt: time.Now().Add(-age)})
			}
			require.InDelta(t, tc.want, e.maxHeld(), float64(tc.want)/50+1)
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

// A ticket waits about ten minutes in all for a run that is not visible,
// its first looks a few milliseconds apart.
func TestMissingRunRetryWaitsAboutTenMinutes(t *testing.T) {
	var total time.Duration
	for n := range missingRunSnoozes {
		total += missingRunRetry(n)
	}
	if missingRunRetry(0) != 20*time.Millisecond || total < 9*time.Minute || total > 11*time.Minute {
		t.Fatalf("first wait %s, total %s; want 20ms and about 10m", missingRunRetry(0), total)
	}
}
