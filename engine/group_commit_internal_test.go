package engine

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
func TestGroupCommitBatchesWhatQueuedAndAnswersEachCaller(t *testing.T) {
	t.Parallel()
	var inFlight, maxInFlight, batches, largest atomic.Int64
	g := &groupCommit[int, int]{maxActive: 2, maxBatch: 16, exec: func(calls []int) []int {
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
		wg.Go(func() { require.Equal(t, i*10, g.do(i)) })
	}
	wg.Wait()
	require.LessOrEqual(t, maxInFlight.Load(), int64(2))
	require.LessOrEqual(t, largest.Load(), int64(16))
	require.Less(t, batches.Load(), int64(callers/2), "concurrent calls share batches")
	require.Zero(t, g.active, "every leader handed back")
	require.Empty(t, g.queue)
}

// One call at a time is a batch of one, run at once.
func TestGroupCommitAloneIsABatchOfOne(t *testing.T) {
	t.Parallel()
	var sizes []int
	g := &groupCommit[int, int]{maxActive: 2, maxBatch: 16, exec: func(calls []int) []int {
		sizes = append(sizes, len(calls))
		return calls
	}}
	for i := range 5 {
		require.Equal(t, i, g.do(i))
	}
	require.Equal(t, []int{1, 1, 1, 1, 1}, sizes)
}
