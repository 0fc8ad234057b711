package maintenance_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgdurable/pgdurable/engine/internal/maintenance"
)

// Every test stops what it starts: no goroutine may remain.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeService records its passes in a log shared with the other services
// of a test; next says when it is due again.
type fakeService struct {
	name string
	log  *passLog
	next func(began, ended time.Time) time.Time
	run  func(ctx context.Context)
}

type passLog struct {
	mu     sync.Mutex
	passes []string
	at     []time.Time
	nexts  [][2]time.Time // the arguments of every Next call, in order
}

func (l *passLog) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.passes...)
}

func (s *fakeService) RunOnce(ctx context.Context) {
	s.log.mu.Lock()
	s.log.passes = append(s.log.passes, s.name)
	s.log.at = append(s.log.at, time.Now())
	s.log.mu.Unlock()
	if s.run != nil {
		s.run(ctx)
	}
}

func (s *fakeService) Next(began, ended time.Time) time.Time {
	s.log.mu.Lock()
	s.log.nexts = append(s.log.nexts, [2]time.Time{began, ended})
	s.log.mu.Unlock()
	return s.next(began, ended)
}

func everyTick(_, _ time.Time) time.Time { return time.Time{} }

// At each tick the due services run in the order given, one after the
// other: one due at every tick, one due at the first tick and then an
// hour after its pass began, one due an hour after the start.
func TestMaintainerRunsTheDueServicesInOrderAtEachTick(t *testing.T) {
	t.Parallel()
	log := &passLog{}
	hourly := func(began, ended time.Time) time.Time {
		if began.IsZero() {
			return time.Time{}
		}
		return began.Add(time.Hour)
	}
	later := func(_, ended time.Time) time.Time { return ended.Add(time.Hour) }
	m := &maintenance.Maintainer{Interval: 5 * time.Millisecond, Services: []maintenance.Service{
		&fakeService{name: "every", log: log, next: everyTick},
		&fakeService{name: "hourly", log: log, next: hourly},
		&fakeService{name: "later", log: log, next: later},
	}}
	m.Start(context.Background())
	require.Eventually(t, func() bool { return len(log.snapshot()) >= 4 }, 10*time.Second, time.Millisecond)
	m.Stop()
	passes := log.snapshot()
	require.Equal(t, []string{"every", "hourly", "every", "every"}, passes[:4])
	require.NotContains(t, passes, "later")
	require.Equal(t, 1, countOf(passes, "hourly"))

	// Each service's Next is asked once at the start (began zero), then
	// after each of its passes, with began <= ended.
	log.mu.Lock()
	defer log.mu.Unlock()
	for i, n := range log.nexts {
		if i < 3 {
			require.True(t, n[0].IsZero(), "the first Next calls are the start's")
			continue
		}
		require.False(t, n[0].IsZero())
		require.False(t, n[1].Before(n[0]))
	}
}

func countOf(list []string, s string) int {
	n := 0
	for _, v := range list {
		if v == s {
			n++
		}
	}
	return n
}

// Ticks come at least Interval/2 apart (Interval/2 plus a jitter of up
// to Interval), from the end of one tick's passes to the next tick.
func TestMaintainerSpacesItsTicks(t *testing.T) {
	t.Parallel()
	log := &passLog{}
	const interval = 40 * time.Millisecond
	m := &maintenance.Maintainer{Interval: interval, Services: []maintenance.Service{
		&fakeService{name: "every", log: log, next: everyTick},
	}}
	start := time.Now()
	m.Start(context.Background())
	require.Eventually(t, func() bool { return len(log.snapshot()) >= 5 }, 10*time.Second, time.Millisecond)
	m.Stop()
	log.mu.Lock()
	defer log.mu.Unlock()
	require.GreaterOrEqual(t, log.at[0].Sub(start), interval/2)
	for i := 1; i < len(log.at); i++ {
		require.GreaterOrEqual(t, log.at[i].Sub(log.at[i-1]), interval/2)
	}
}

// Stop cancels the context of the pass under way and returns once it has
// returned; no pass starts after.
func TestMaintainerStopWaitsForThePassUnderWay(t *testing.T) {
	t.Parallel()
	log := &passLog{}
	entered := make(chan struct{}, 1)
	var returned bool
	var mu sync.Mutex
	m := &maintenance.Maintainer{Interval: time.Millisecond, Services: []maintenance.Service{
		&fakeService{name: "blocking", log: log, next: everyTick, run: func(ctx context.Context) {
			select {
			case entered <- struct{}{}:
			default:
			}
			<-ctx.Done()
			time.Sleep(20 * time.Millisecond) // a pass that takes a while to wind down
			mu.Lock()
			returned = true
			mu.Unlock()
		}},
	}}
	m.Start(context.Background())
	<-entered
	m.Stop()
	mu.Lock()
	require.True(t, returned)
	mu.Unlock()
	require.Len(t, log.snapshot(), 1)
}

// Start's context gives the services its values, not its cancellation:
// only Stop stops them.
func TestMaintainerOutlivesStartsContext(t *testing.T) {
	t.Parallel()
	log := &passLog{}
	ctx, cancel := context.WithCancel(context.Background())
	m := &maintenance.Maintainer{Interval: time.Millisecond, Services: []maintenance.Service{
		&fakeService{name: "every", log: log, next: everyTick},
	}}
	m.Start(ctx)
	cancel()
	n := len(log.snapshot())
	require.Eventually(t, func() bool { return len(log.snapshot()) > n+2 }, 10*time.Second, time.Millisecond)
	m.Stop()
}

// Each service's own interval: the sweeps and the poller at every tick;
// the registry ProcessBeat after the start (the engine recorded the
// process then) and after each pass began; the pruner at the first tick
// and 30 to 90 s after each pass ended; the orphan sweeper at the first
// tick and min(Lease/2, 5 s) after each pass began.
func TestServiceIntervals(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	t1 := t0.Add(3 * time.Second)
	for _, s := range []maintenance.Service{&maintenance.LeaseSweeper{}, &maintenance.Scheduler{}, &maintenance.CancelPoller{}} {
		require.True(t, s.Next(time.Time{}, t0).IsZero())
		require.True(t, s.Next(t0, t1).IsZero())
	}

	reg := &maintenance.ProcessRegistry{}
	require.Equal(t, t0.Add(maintenance.ProcessBeat), reg.Next(time.Time{}, t0))
	require.Equal(t, t0.Add(maintenance.ProcessBeat), reg.Next(t0, t1))
	require.Equal(t, 10*time.Second, maintenance.ProcessBeat)
	require.Equal(t, 30*time.Second, maintenance.ProcessLive)

	p := &maintenance.Pruner{}
	require.Equal(t, t0, p.Next(time.Time{}, t0))
	for range 100 {
		next := p.Next(t0, t1)
		require.False(t, next.Before(t1.Add(30*time.Second)))
		require.True(t, next.Before(t1.Add(90*time.Second)))
	}

	o := &maintenance.OrphanSweeper{Lease: 4 * time.Second}
	require.True(t, o.Next(time.Time{}, t0).IsZero())
	require.Equal(t, t0.Add(2*time.Second), o.Next(t0, t1))
	o.Lease = time.Minute
	require.Equal(t, t0.Add(5*time.Second), o.Next(t0, t1))
}
