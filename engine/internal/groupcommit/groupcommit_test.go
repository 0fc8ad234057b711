package groupcommit

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Every caller gets its own result; no more batches than maxActive run at
// once; calls made while batches are in flight share the next one; no
// batch is larger than maxBatch.
func TestBatcherBatchesWhatQueuedAndAnswersEachCaller(t *testing.T) {
	t.Parallel()
	var inFlight, maxInFlight, batches, largest atomic.Int64
	g := &Batcher[int, int]{MaxActive: 2, MaxBatch: 16, Exec: func(calls []int) []int {
		n := inFlight.Add(1)
		for {
			m := maxInFlight.Load()
			if n <= m || maxInFlight.CompareAndSwap(m, n) {
				break
			}
		}
		batches.Add(1)
		for {
			m := largest.Load()
			if int64(len(calls)) <= m || largest.CompareAndSwap(m, int64(len(calls))) {
				break
			}
		}
		time.Sleep(2 * time.Millisecond) // a commit
		inFlight.Add(-1)
		out := make([]int, len(calls))
		for i, c := range calls {
			out[i] = c * 10
		}
		return out
	}}
	const callers = 400
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() { require.Equal(t, i*10, g.Do(i)) })
	}
	wg.Wait()
	require.LessOrEqual(t, maxInFlight.Load(), int64(2))
	require.LessOrEqual(t, largest.Load(), int64(16))
	require.Less(t, batches.Load(), int64(callers/2), "concurrent calls share batches")
	require.Zero(t, g.active, "every leader handed back")
	require.Empty(t, g.queue)
}

// One call at a time is a batch of one, run at once.
func TestBatcherAloneIsABatchOfOne(t *testing.T) {
	t.Parallel()
	var sizes []int
	g := &Batcher[int, int]{MaxActive: 2, MaxBatch: 16, Exec: func(calls []int) []int {
		sizes = append(sizes, len(calls))
		return calls
	}}
	for i := range 5 {
		require.Equal(t, i, g.Do(i))
	}
	require.Equal(t, []int{1, 1, 1, 1, 1}, sizes)
}

// A batch stops taking queued calls once their payloads would pass
// MaxBatchBytes; the leader's own call always goes.
func TestBatcherBoundsABatchByBytes(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var mu sync.Mutex
	var sizes []int
	g := &Batcher[int, int]{MaxActive: 1, MaxBatch: 100, Size: func(n int) int { return n },
		Exec: func(calls []int) []int {
			mu.Lock()
			sizes = append(sizes, len(calls))
			mu.Unlock()
			if calls[0] == 0 {
				<-release // hold the first batch while the rest queue
			}
			return calls
		}}
	var wg sync.WaitGroup
	wg.Go(func() { g.Do(0) })
	for !func() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.active == 1 }() {
		time.Sleep(time.Millisecond)
	}
	const big = MaxBatchBytes / 3 // three fit in no batch together with a fourth
	for range 6 {
		wg.Go(func() { g.Do(big) })
	}
	for !func() bool { g.mu.Lock(); defer g.mu.Unlock(); return len(g.queue) == 6 }() {
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	require.Equal(t, []int{1, 3, 3}, sizes)
}

// A batch whose exec panics fails each of its calls and leaves the
// batcher working for the next ones.
func TestBatcherSurvivesAPanickingBatch(t *testing.T) {
	t.Parallel()
	g := &Batcher[int, int]{MaxActive: 1, MaxBatch: 10,
		Exec: func(calls []int) []int {
			if calls[0] < 0 {
				panic("bug")
			}
			return calls
		},
		Failed: func(any) int { return -100 }}
	require.Equal(t, -100, g.Do(-1))
	require.Equal(t, 5, g.Do(5))
	require.Zero(t, g.active)
}
