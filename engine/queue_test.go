package engine_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// queueEngine is an engine on db serving queues, with wfs registered,
// started, and stopped when the test ends.
func queueEngine(t *testing.T, db *enginetest.DB, cfg *engine.Config, queues map[string]engine.QueueOpts, wfs ...engine.Registration) *engine.Engine {
	t.Helper()
	e := newEngine(t, db, cfg, false, wfs...)
	for name, opts := range queues {
		require.NoError(t, e.RegisterQueue(name, opts))
	}
	require.NoError(t, e.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.StopAndCancel(ctx); err != nil {
			t.Errorf("stopping engine: %v", err)
		}
	})
	return e
}

// runningOf counts the runs of queue that hold a live lease, as the
// database has them.
func runningOf(t *testing.T, db *enginetest.DB, queue string) int {
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), db.SQL(runningQuery), queue).Scan(&n))
	return n
}

// sampleMax samples the count query every 10 ms on db until the
// returned func is called, which returns the largest count seen. The test's
// end stops it too.
func sampleMax(t *testing.T, db *enginetest.DB, query string, args ...any) func() int {
	stop, out := make(chan struct{}), make(chan int, 1)
	go func() {
		most := 0
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			var n int
			if err := db.Pool.QueryRow(context.Background(), db.SQL(query), args...).Scan(&n); err == nil {
				most = max(most, n)
			}
			select {
			case <-stop:
				out <- most
				return
			case <-tick.C:
			}
		}
	}()
	var once sync.Once
	result := func() int {
		once.Do(func() { close(stop) })
		return <-out
	}
	t.Cleanup(func() { once.Do(func() { close(stop) }) })
	return result
}

// runningQuery counts the runs of a queue ($1) that hold a live lease.
const runningQuery = `SELECT count(*) FROM pgdurable.workflow_runs
WHERE flow_queue = $1 AND owner_token IS NOT NULL AND lease_expires_at >= now()`

type keyed struct {
	Key string `json:"key"`
	N   int    `json:"n"`
}

func TestQueueConcurrencyLimitHolds(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := enginetest.NewDB(t)
	var live, most atomic.Int64
	wf := engine.Define("limited", func(ctx *engine.Context, in keyed) (int, error) {
		return engine.Step(ctx, "work", func(context.Context) (int, error) {
			n := live.Add(1)
			defer live.Add(-1)
			for {
				m := most.Load()
				if n <= m || most.CompareAndSwap(m, n) {
					break
				}
			}
			time.Sleep(30 * time.Millisecond)
			return in.N, nil
		}, nil)
	}, &engine.WorkflowOpts{Queue: "limited"})
	e := queueEngine(t, db, nil, map[string]engine.QueueOpts{"limited": {Concurrency: 3, Workers: 10}}, wf)
	sampled := sampleMax(t, db, runningQuery, "limited")
	var ids []uuid.UUID
	for i := range 30 {
		res, err := wf.Start(ctx, e, keyed{N: i}, nil)
		require.NoError(t, err)
		ids = append(ids, res.RunID)
	}
	for _, id := range ids {
		waitStatus(t, e, id, engine.StatusCompleted, 30*time.Second)
	}
	require.LessOrEqual(t, sampled(), 3, "runs holding a lease at once")
	require.Equal(t, int64(3), most.Load(), "steps running at once")
}

func TestQueueKeyConcurrencyIsOneAtATimeInStartOrder(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := enginetest.NewDB(t)
	var mu sync.Mutex
	running := map[string]bool{}
	var order []keyed
	var overlap atomic.Bool
	wf := engine.Define("per-key", func(ctx *engine.Context, in keyed) (int, error) {
		return engine.Step(ctx, "work", func(context.Context) (int, error) {
			mu.Lock()
			if running[in.Key] {
				overlap.Store(true)
			}
			running[in.Key] = true
			order = append(order, in)
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
			mu.Lock()
			running[in.Key] = false
			mu.Unlock()
			return in.N, nil
		}, nil)
	}, &engine.WorkflowOpts{Queue: "per-key", QueueKey: engine.KeyOf(func(in keyed) string { return in.Key })})
	e := queueEngine(t, db, nil, map[string]engine.QueueOpts{"per-key": {KeyConcurrency: 1, Workers: 8}}, wf)
	var ids []uuid.UUID
	for k := range 5 {
		for n := range 10 {
			res, err := wf.Start(ctx, e, keyed{Key: fmt.Sprint("k", k), N: n}, nil)
			require.NoError(t, err)
			ids = append(ids, res.RunID)
		}
	}
	for _, id := range ids {
		waitStatus(t, e, id, engine.StatusCompleted, 30*time.Second)
	}
	require.False(t, overlap.Load(), "two runs of one key ran at once")
	last := map[string]int{}
	for _, o := range order {
		prev, ok := last[o.Key]
		require.True(t, !ok || o.N == prev+1, "key %s ran %d after %d", o.Key, o.N, prev)
		last[o.Key] = o.N
	}
}

func TestQueueDeduplicationGivesOneRunUntilItEnds(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := enginetest.NewDB(t)
	release := make(chan struct{})
	wf := engine.Define("dedup", func(ctx *engine.Context, in keyed) (int, error) {
		return engine.Step(ctx, "wait", func(context.Context) (int, error) { <-release; return in.N, nil }, nil)
	}, &engine.WorkflowOpts{Queue: "dedup"})
	e := queueEngine(t, db, nil, map[string]engine.QueueOpts{"dedup": {}}, wf)
	results := make(chan *engine.StartResult, 20)
	errs := make(chan error, 20)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := wf.Start(ctx, e, keyed{N: i}, &engine.StartOpts{DeduplicationID: "order-1"})
			if err != nil {
				errs <- err
				return
			}
			results <- res
		}()
	}
	wg.Wait()
	close(results)
	close(errs)
	require.Len(t, results, 1, "one start makes the run")
	for err := range errs {
		require.ErrorIs(t, err, engine.ErrDuplicate)
	}
	first := <-results
	again, err := wf.Start(ctx, e, keyed{N: 99}, &engine.StartOpts{DeduplicationID: "order-1", ReturnDuplicate: true})
	require.NoError(t, err)
	require.Equal(t, first.RunID, again.RunID)
	require.Equal(t, first.WorkflowID, again.WorkflowID, "the found run's workflow ID")
	require.True(t, again.Deduplicated)
	close(release)
	waitStatus(t, e, first.RunID, engine.StatusCompleted, 10*time.Second)
	next, err := wf.Start(ctx, e, keyed{N: 100}, &engine.StartOpts{DeduplicationID: "order-1"})
	require.NoError(t, err, "the ID is free once its run ended")
	require.NotEqual(t, first.RunID, next.RunID)
	waitStatus(t, e, next.RunID, engine.StatusCompleted, 10*time.Second)
}

func TestQueuePrioritiesGoFirstAndLowOnesAge(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := enginetest.NewDB(t)
	var mu sync.Mutex
	var order []int
	gate := make(chan struct{})
	wf := engine.Define("prio", func(ctx *engine.Context, in keyed) (int, error) {
		return engine.Step(ctx, "work", func(context.Context) (int, error) {
			if in.N == 0 {
				<-gate
			}
			mu.Lock()
			order = append(order, in.N)
			mu.Unlock()
			return in.N, nil
		}, nil)
	}, &engine.WorkflowOpts{Queue: "prio"})
	e := queueEngine(t, db, nil, map[string]engine.QueueOpts{"prio": {Concurrency: 1, PriorityAging: -1}}, wf)
	blocker, err := wf.Start(ctx, e, keyed{N: 0}, nil)
	require.NoError(t, err)
	eventually(t, 5*time.Second, "the blocker runs", func() bool { return runningOf(t, db, "prio") == 1 })
	var ids []uuid.UUID
	for i := 1; i <= 3; i++ { // low priority, started first
		res, err := wf.Start(ctx, e, keyed{N: i}, &engine.StartOpts{Priority: -1})
		require.NoError(t, err)
		ids = append(ids, res.RunID)
	}
	for i := 4; i <= 6; i++ {
		res, err := wf.Start(ctx, e, keyed{N: i}, &engine.StartOpts{Priority: 5})
		require.NoError(t, err)
		ids = append(ids, res.RunID)
	}
	close(gate)
	waitStatus(t, e, blocker.RunID, engine.StatusCompleted, 10*time.Second)
	for _, id := range ids {
		waitStatus(t, e, id, engine.StatusCompleted, 10*time.Second)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int{0, 4, 5, 6, 1, 2, 3}, order)
}

func TestQueueStartOptionsAreChecked(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := enginetest.NewDB(t)
	plain := engine.Define("plain", func(ctx *engine.Context, in keyed) (int, error) { return in.N, nil }, nil)
	e := newEngine(t, db, nil, false, plain)
	for _, opts := range []*engine.StartOpts{
		{DeduplicationID: "x"},
		{Priority: 3},
		{Queue: "q", Priority: engine.MaxPriority + 1},
		{Queue: "q", KeyWeight: -1},
		{Queue: "q", QueueKey: string(make([]byte, engine.MaxQueueKeyBytes+1))},
		{Queue: " q"},
		{Queue: "q", KeyWeight: 5e-324}, // its fair-queuing step, 1/weight, is infinite
		{Queue: "q", KeyWeight: engine.MinKeyWeight / 2},
		{Queue: "q", QueueKey: "a\x00b"},
		{Queue: "q", DeduplicationID: "a\x00b"},
		{Debounce: &engine.Debounce{Key: "a\x00b", Window: time.Second}},
		{Debounce: &engine.Debounce{Key: "k", Window: 10 * time.Second, MaxWait: time.Nanosecond}},
	} {
		_, err := plain.Start(ctx, e, keyed{}, opts)
		require.True(t, errors.Is(err, engine.ErrInvalidArgument), "%+v: %v", opts, err)
	}
	require.ErrorIs(t, e.PauseQueue(ctx, "a\x00b", nil), engine.ErrInvalidArgument)
	require.ErrorIs(t, e.PauseQueue(ctx, "q", &engine.PauseOpts{Reason: "x\x00y"}), engine.ErrInvalidArgument)
	require.ErrorIs(t, e.ResumeQueue(ctx, "bad\xff", ""), engine.ErrInvalidArgument)
	require.ErrorIs(t, e.RegisterQueue("q", engine.QueueOpts{RateLimit: engine.Rate{Limit: 5}}), engine.ErrInvalidArgument)
	require.ErrorIs(t, e.RegisterQueue("", engine.QueueOpts{}), engine.ErrInvalidArgument)
}

func TestQueuePauseLetsRunningStepsFinishAndResumeDrains(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := enginetest.NewDB(t)
	var first, second atomic.Int64
	gate := make(chan struct{})
	wf := engine.Define("pausable", func(ctx *engine.Context, in keyed) (int, error) {
		if _, err := engine.Step(ctx, "first", func(context.Context) (int, error) {
			first.Add(1)
			<-gate
			return 0, nil
		}, nil); err != nil {
			return 0, err
		}
		return engine.Step(ctx, "second", func(context.Context) (int, error) { second.Add(1); return in.N, nil }, nil)
	}, &engine.WorkflowOpts{Queue: "pausable"})
	e := queueEngine(t, db, nil, map[string]engine.QueueOpts{"pausable": {Concurrency: 2}}, wf)
	var ids []uuid.UUID
	for i := range 4 {
		res, err := wf.Start(ctx, e, keyed{N: i}, nil)
		require.NoError(t, err)
		ids = append(ids, res.RunID)
	}
	eventually(t, 5*time.Second, "two runs in their first step", func() bool { return first.Load() == 2 })
	run, err := e.GetRun(ctx, ids[3])
	require.NoError(t, err)
	require.Equal(t, "a slot of queue pausable (2 of 2 running)", run.WaitingFor)
	require.Equal(t, "pausable", run.Queue)
	require.NotNil(t, run.WaitingSince)

	require.NoError(t, e.PauseQueue(ctx, "pausable", &engine.PauseOpts{By: "alice", Reason: "card processor down"}))
	close(gate) // the running steps finish; the runs then wait in the queue
	eventually(t, 5*time.Second, "the running runs handed back", func() bool { return runningOf(t, db, "pausable") == 0 })
	time.Sleep(300 * time.Millisecond)
	require.Zero(t, second.Load(), "no step started while the queue was paused")
	require.Equal(t, int64(2), first.Load())
	// A run handed back is ready once its River ticket is worked, which a
	// loaded machine may take longer than the sleep above to do.
	var q engine.QueueInfo
	eventually(t, 10*time.Second, "the 4 runs ready in the paused queue", func() bool {
		queues, err := e.ListQueues(ctx)
		require.NoError(t, err)
		require.Len(t, queues, 1)
		q = queues[0]
		return q.Ready == 4
	})
	require.Zero(t, second.Load(), "no step started while the queue was paused")
	require.True(t, q.Paused)
	require.Equal(t, "alice", q.PausedBy)
	require.Equal(t, "card processor down", q.PauseReason)
	require.Equal(t, 4, q.Ready)
	require.Len(t, q.Processes, 1)
	run, err = e.GetRun(ctx, ids[0])
	require.NoError(t, err)
	require.Equal(t, "queue pausable is paused (card processor down, by alice)", run.WaitingFor)
	require.Equal(t, engine.StatusPending, run.Status)

	require.NoError(t, e.ResumeQueue(ctx, "pausable", "alice"))
	for _, id := range ids {
		waitStatus(t, e, id, engine.StatusCompleted, 10*time.Second)
	}
	require.Equal(t, int64(4), first.Load(), "a finished step is not run again")
	require.Equal(t, int64(4), second.Load())
	require.ErrorIs(t, e.PauseQueue(ctx, "no-such-queue", nil), engine.ErrNotFound)
}

func TestQueueRunOfAnUnservedQueueSaysSo(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := enginetest.NewDB(t)
	wf := engine.Define("unserved", func(ctx *engine.Context, in keyed) (int, error) { return in.N, nil }, nil)
	e := queueEngine(t, db, nil, nil, wf)
	res, err := wf.Start(ctx, e, keyed{}, &engine.StartOpts{Queue: "nobody-serves", QueueKey: "cus_1", Priority: 3})
	require.NoError(t, err)
	run, err := e.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, run.Status)
	require.Equal(t, "a process that serves queue nobody-serves", run.WaitingFor)
	require.Equal(t, "cus_1", run.QueueKey)
	require.Equal(t, 3, run.Priority)
	queues, err := e.ListQueues(ctx)
	require.NoError(t, err)
	require.Len(t, queues, 1)
	require.False(t, queues[0].Defined)
	require.Equal(t, 1, queues[0].Ready)
	require.Empty(t, queues[0].Processes)
}

// A rate limit that activities of two engines share paces their attempts
// together: 60 attempts at 20 a second take about 3 s, and no second
// holds more than 21. Not parallel: it measures time (see
// TestQueueRateLimitAcrossProcesses).
func TestRateLimitIsSharedByProcesses(t *testing.T) {
	ctx := testCtx(t)
	db := enginetest.NewDB(t)
	var mu sync.Mutex
	var calls, turns []time.Time
	// The turns' grant times are what the limit bounds; the attempts'
	// own starts add the scheduler's delays (tens of milliseconds on a
	// loaded machine), which bunched 22 of them into one second once.
	engine.OnRateTurn(func(name string, at time.Time) {
		if name == "card-processor" {
			mu.Lock()
			turns = append(turns, at)
			mu.Unlock()
		}
	})
	t.Cleanup(func() { engine.OnRateTurn(nil) })
	wf := engine.Define("rated", func(ctx *engine.Context, in keyed) (int, error) {
		return engine.RunActivity(ctx, "charge", func(context.Context, *engine.ActivityAttempt) (int, error) {
			mu.Lock()
			calls = append(calls, time.Now())
			mu.Unlock()
			return in.N, nil
		}, &engine.ActivityOpts{RateLimit: "card-processor"})
	}, nil)
	var engines []*engine.Engine
	for range 2 {
		e := newEngine(t, db, nil, false, wf)
		require.NoError(t, e.RegisterRateLimit("card-processor", engine.Rate{Limit: 20, Period: time.Second}))
		require.NoError(t, e.Start(ctx))
		t.Cleanup(func() { _ = e.StopAndCancel(context.Background()) })
		engines = append(engines, e)
	}
	var ids []uuid.UUID
	for i := range 60 {
		res, err := wf.Start(ctx, engines[i%2], keyed{N: i}, nil)
		require.NoError(t, err)
		ids = append(ids, res.RunID)
	}
	for _, id := range ids {
		waitStatus(t, engines[0], id, engine.StatusCompleted, 20*time.Second)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, calls, 60)
	require.Len(t, turns, 60, "one turn per attempt")
	slices.SortFunc(calls, func(a, b time.Time) int { return a.Compare(b) })
	span := calls[len(calls)-1].Sub(calls[0])
	t.Logf("60 attempts in %s", span.Round(time.Millisecond))
	require.Greater(t, span, 2800*time.Millisecond, "60 attempts at 20 a second")
	slices.SortFunc(turns, func(a, b time.Time) int { return a.Compare(b) })
	for i := range turns {
		j := i
		for j < len(turns) && turns[j].Sub(turns[i]) < time.Second {
			j++
		}
		require.LessOrEqual(t, j-i, 21, "turns within one second from %s", turns[i])
	}

	// A step naming a limit its process does not register fails, plainly.
	bad := engine.Define("unrated", func(ctx *engine.Context, in keyed) (int, error) {
		return engine.Step(ctx, "s", func(context.Context) (int, error) { return 1, nil }, &engine.StepOpts{RateLimit: "nope"})
	}, nil)
	e := newEngine(t, db, nil, true, bad)
	res, err := bad.Start(ctx, e, keyed{}, nil)
	require.NoError(t, err)
	run := waitStatus(t, e, res.RunID, engine.StatusFailed, 10*time.Second)
	require.Contains(t, run.Error.Message, `rate limit "nope" is not defined`)
	require.ErrorIs(t, e.RegisterRateLimit("x", engine.Rate{Limit: 1}), engine.ErrInvalidArgument)
}

// Fifty starts within a second, debounced by a one-second window, give one
// run, with the last start's input; MaxWait bounds how long starts can
// keep moving it.
func TestDebounceCollapsesStartsIntoOneRunWithTheLastInput(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := enginetest.NewDB(t)
	var mu sync.Mutex
	ran := map[string][]int{}
	wf := engine.Define("debounced", func(ctx *engine.Context, in keyed) (int, error) {
		return engine.Step(ctx, "sync", func(context.Context) (int, error) {
			mu.Lock()
			ran[in.Key] = append(ran[in.Key], in.N)
			mu.Unlock()
			return in.N, nil
		}, nil)
	}, nil)
	e := newEngine(t, db, &engine.Config{SweepInterval: 50 * time.Millisecond}, true, wf)
	var first *engine.StartResult
	for i := range 50 {
		res, err := wf.Start(ctx, e, keyed{Key: "a", N: i}, &engine.StartOpts{Debounce: &engine.Debounce{Key: "cus_1", Window: time.Second}})
		require.NoError(t, err)
		if i == 0 {
			first = res
			require.False(t, res.Debounced)
		} else {
			require.True(t, res.Debounced, "start %d", i)
			require.Equal(t, first.RunID, res.RunID)
			require.Equal(t, first.WorkflowID, res.WorkflowID)
		}
		time.Sleep(20 * time.Millisecond)
	}
	run := waitStatus(t, e, first.RunID, engine.StatusCompleted, 10*time.Second)
	require.JSONEq(t, "49", string(run.Output))
	mu.Lock()
	require.Equal(t, []int{49}, ran["a"], "one run, with the last input")
	mu.Unlock()
	next, err := wf.Start(ctx, e, keyed{Key: "a", N: 50}, &engine.StartOpts{Debounce: &engine.Debounce{Key: "cus_1", Window: time.Millisecond}})
	require.NoError(t, err)
	require.NotEqual(t, first.RunID, next.RunID, "after the run started, a start makes a new one")
	waitStatus(t, e, next.RunID, engine.StatusCompleted, 10*time.Second)

	// Starts every 100 ms with a 500 ms window would put the run off for
	// ever; a MaxWait of 800 ms starts it anyway.
	began := time.Now()
	var firstB uuid.UUID
	for i := range 20 {
		res, err := wf.Start(ctx, e, keyed{Key: "b", N: i}, &engine.StartOpts{Debounce: &engine.Debounce{Key: "cus_2", Window: 500 * time.Millisecond, MaxWait: 800 * time.Millisecond}})
		require.NoError(t, err)
		if i == 0 {
			firstB = res.RunID
		}
		time.Sleep(100 * time.Millisecond)
	}
	run = waitStatus(t, e, firstB, engine.StatusCompleted, 10*time.Second)
	require.NotNil(t, run.StartedAt)
	require.Less(t, run.StartedAt.Sub(began), 1500*time.Millisecond, "started within MaxWait (and a sweep)")
	mu.Lock()
	require.Greater(t, len(ran["b"]), 1, "the later starts made later runs")
	mu.Unlock()

	for _, bad := range []*engine.StartOpts{
		{Debounce: &engine.Debounce{Window: time.Second}},
		{Debounce: &engine.Debounce{Key: "k"}},
		{Debounce: &engine.Debounce{Key: "k", Window: time.Second}, WorkflowID: "order-1"},
		{Debounce: &engine.Debounce{Key: "k", Window: time.Second}, Delay: time.Second},
	} {
		_, err := wf.Start(ctx, e, keyed{}, bad)
		require.ErrorIs(t, err, engine.ErrInvalidArgument)
	}
}

// A queue defined in Config.Queues by one process is served, with its
// limits, by another that only registers a workflow naming it.
func TestQueueFromConfigIsServedByProcessesOfItsWorkflows(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := enginetest.NewDB(t)
	wf := engine.Define("configured", func(ctx *engine.Context, in keyed) (int, error) {
		return engine.Step(ctx, "work", func(context.Context) (int, error) { time.Sleep(20 * time.Millisecond); return in.N, nil }, nil)
	}, &engine.WorkflowOpts{Queue: "cfgq"})
	a := newEngine(t, db, &engine.Config{Queues: map[string]engine.QueueOpts{"cfgq": {Concurrency: 1}}}, true, wf)
	b := newEngine(t, db, nil, true, wf)
	sampled := sampleMax(t, db, runningQuery, "cfgq")
	var ids []uuid.UUID
	for i := range 10 {
		res, err := wf.Start(ctx, []*engine.Engine{a, b}[i%2], keyed{N: i}, nil)
		require.NoError(t, err)
		ids = append(ids, res.RunID)
	}
	for _, id := range ids {
		waitStatus(t, a, id, engine.StatusCompleted, 20*time.Second)
	}
	require.Equal(t, 1, sampled(), "the limit Config.Queues set holds in both processes")
	queues, err := b.ListQueues(ctx)
	require.NoError(t, err)
	require.Len(t, queues, 1)
	require.Equal(t, 1, queues[0].Concurrency, "the process that only serves it left the definition as it was")
	require.Len(t, queues[0].Processes, 2)
}

// A saturated queue starts its high-priority runs first, but a low one
// still starts within PriorityAging (plus a run's duration): it is never
// starved.
func TestQueueLowPriorityStartsWithinTheAgingBound(t *testing.T) {
	t.Parallel()
	enginetest.SkipOnCitus(t, "counts the runs of 40 ms a one-at-a-time queue starts in its 1 s of aging (more than 10): on one 2-core machine that also runs the cluster's three servers a run takes about 100 ms from start to end, and 9 started (the low run's wait, 1.07 s, held its bound)")
	ctx := testCtx(t)
	db := enginetest.NewDB(t)
	var mu sync.Mutex
	var order []int
	wf := engine.Define("aging", func(ctx *engine.Context, in keyed) (int, error) {
		return engine.Step(ctx, "work", func(context.Context) (int, error) {
			mu.Lock()
			order = append(order, in.N)
			mu.Unlock()
			time.Sleep(40 * time.Millisecond)
			return in.N, nil
		}, nil)
	}, &engine.WorkflowOpts{Queue: "aging"})
	const aging = time.Second
	e := queueEngine(t, db, nil, map[string]engine.QueueOpts{"aging": {Concurrency: 1, PriorityAging: aging}}, wf)
	// A backlog that outlasts the aging on its own (40 runs of at least
	// 40 ms each, one at a time), so a slow feeder on a loaded machine
	// cannot let the queue drain and start the low run early.
	const backlog = 40
	for i := 1; i <= backlog; i++ {
		_, err := wf.Start(ctx, e, keyed{N: i}, &engine.StartOpts{Priority: 10})
		require.NoError(t, err)
	}
	stop := make(chan struct{})
	fed := make(chan struct{})
	go func() { // a stream of high-priority runs that keeps the queue full
		defer close(fed)
		for i := backlog + 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := wf.Start(ctx, e, keyed{N: i}, &engine.StartOpts{Priority: 10}); err != nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	time.Sleep(300 * time.Millisecond)
	low, err := wf.Start(ctx, e, keyed{N: -1}, &engine.StartOpts{Priority: -10})
	require.NoError(t, err)
	run := waitStatus(t, e, low.RunID, engine.StatusCompleted, 10*time.Second)
	close(stop)
	<-fed
	waited := run.StartedAt.Sub(run.CreatedAt)
	t.Logf("the low-priority run waited %s (aging %s)", waited.Round(time.Millisecond), aging)
	require.GreaterOrEqual(t, waited, aging-100*time.Millisecond, "high priorities went first while the queue was full")
	require.Less(t, waited, aging+500*time.Millisecond, "the low priority started within its bound")
	mu.Lock()
	defer mu.Unlock()
	i := slices.Index(order, -1)
	require.Greater(t, i, 10, "high-priority runs started ahead of it")
}

// Queue and rate limit definitions register with their workflows
// (DefineQueue, DefineRateLimit), with RegisterQueue's and
// RegisterRateLimit's checks, and are in force in the database once the
// process starts.
func TestDefinitionsRegisterWithTheirWorkflows(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := enginetest.NewDB(t)
	wf := engine.Define("defined", func(ctx *engine.Context, in int) (int, error) {
		return engine.Step(ctx, "call", func(context.Context) (int, error) { return in, nil }, &engine.StepOpts{RateLimit: "api"})
	}, &engine.WorkflowOpts{Queue: "definedq"})
	regs := []engine.Registration{wf, engine.DefineQueue("definedq", engine.QueueOpts{KeyConcurrency: 1}),
		engine.DefineRateLimit("api", engine.Rate{Limit: 50, Period: time.Second})}

	bad := newEngine(t, db, nil, false)
	require.ErrorIs(t, bad.Register(engine.DefineQueue("", engine.QueueOpts{})), engine.ErrInvalidArgument)
	require.ErrorIs(t, bad.Register(engine.DefineRateLimit("api", engine.Rate{Limit: 5})), engine.ErrInvalidArgument)
	require.ErrorContains(t, bad.Register(regs[1], regs[1]), `queue "definedq" registered twice`)
	require.ErrorIs(t, engine.Replay(ctx, db.Pool, regs[1], &engine.History{}), engine.ErrInvalidArgument)

	e := newEngine(t, db, nil, true, regs...)
	require.ErrorIs(t, e.Register(engine.DefineQueue("late", engine.QueueOpts{})), engine.ErrInvalidArgument, "after Start")
	res, err := wf.Start(ctx, e, 7, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 7, out, "the step took a turn of the rate limit the registration defined")
	queues, err := e.ListQueues(ctx)
	require.NoError(t, err)
	require.Len(t, queues, 1)
	require.Equal(t, "definedq", queues[0].Name)
	require.Equal(t, 1, queues[0].KeyConcurrency)
}

// KeyConcurrency 1 keeps a key's start order across a terminated run
// waiting in the queue (it leaves the queue, and the key's next run goes)
// and across a lost lease (the run whose process died goes again before
// the key's later runs, as soon as its lease expires).
func TestQueueKeyOrderSurvivesTerminateAndALostLease(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := enginetest.NewDB(t)
	wf := engine.Define("ordered", func(ctx *engine.Context, in keyed) (int, error) {
		return engine.Step(ctx, "work", func(context.Context) (int, error) { return in.N, nil }, nil)
	}, &engine.WorkflowOpts{Queue: "orderq"})
	e := queueEngine(t, db, nil, map[string]engine.QueueOpts{"orderq": {KeyConcurrency: 1}}, wf)
	require.NoError(t, e.PauseQueue(ctx, "orderq", nil))
	var ids []uuid.UUID
	for i := range 3 {
		res, err := wf.Start(ctx, e, keyed{N: i}, &engine.StartOpts{QueueKey: "k"})
		require.NoError(t, err)
		ids = append(ids, res.RunID)
	}
	a, b, c := ids[0], ids[1], ids[2]
	require.NoError(t, e.Terminate(ctx, b, &engine.TerminateOpts{Reason: "not needed"}))
	// a as a process that died while running it leaves it: leased, the
	// lease expired, not ready.
	_, err := db.Pool.Exec(ctx, `UPDATE `+db.RunTable("workflow_runs", a)+` SET owner_token = $2,
		lease_expires_at = now() - interval '1 second', ready_at = NULL, status = 'running', deliveries = 1 WHERE run_id = $1`, a, uuid.New())
	require.NoError(t, err)
	require.NoError(t, e.ResumeQueue(ctx, "orderq", "test"))
	waitStatus(t, e, a, engine.StatusCompleted, 10*time.Second)
	waitStatus(t, e, c, engine.StatusCompleted, 10*time.Second)
	run, err := e.GetRun(ctx, b)
	require.NoError(t, err)
	require.Equal(t, engine.StatusTerminated, run.Status)
	require.Empty(t, run.WaitingFor, "a terminated run waits for nothing")
	var aDone, cStarted time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT (SELECT completed_at FROM pgdurable.workflow_steps WHERE run_id = $1),
		(SELECT started_at FROM pgdurable.workflow_steps WHERE run_id = $2)`), a, c).Scan(&aDone, &cStarted))
	require.False(t, cStarted.Before(aDone), "c started at %s, before a, started first, completed at %s", cStarted, aDone)
	queues, err := e.ListQueues(ctx)
	require.NoError(t, err)
	require.Zero(t, queues[0].Ready, "nothing is left ready")
}

// A start delayed (Delay or StartAt) into a flow-controlled queue waits
// for its time, then runs within the queue's limits, like a delayed start
// anywhere else: on a Citus cluster the start's insert once returned no
// row for it, and the start failed as not found.
func TestQueueDelayedStartWaitsThenRuns(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := enginetest.NewDB(t)
	clock := enginetest.NewClock(clockStart)
	wf := engine.Define("limited-later", func(ctx *engine.Context, in keyed) (int, error) {
		return engine.Step(ctx, "work", func(context.Context) (int, error) { return in.N, nil }, nil)
	}, &engine.WorkflowOpts{Queue: "limited-later"})
	e := queueEngine(t, db, &engine.Config{Clock: clock}, map[string]engine.QueueOpts{"limited-later": {Concurrency: 1, KeyConcurrency: 1}}, wf)
	delayed, err := wf.Start(ctx, e, keyed{Key: "k", N: 1}, &engine.StartOpts{WorkflowID: "later-1", Delay: time.Hour})
	require.NoError(t, err)
	require.Equal(t, engine.StatusWaiting, delayed.Status)
	at, err := wf.Start(ctx, e, keyed{Key: "k", N: 2}, &engine.StartOpts{WorkflowID: "later-2", StartAt: clockStart.Add(2 * time.Hour)})
	require.NoError(t, err)
	require.Equal(t, engine.StatusWaiting, at.Status)
	again, err := wf.Start(ctx, e, keyed{Key: "k", N: 1}, &engine.StartOpts{WorkflowID: "later-1", Delay: time.Hour})
	require.NoError(t, err)
	require.True(t, again.Existing, "the same start again finds the waiting run")
	require.Equal(t, delayed.RunID, again.RunID)

	dueAfter(t, e, clock, delayed.RunID, time.Hour)
	dueAfter(t, e, clock, at.RunID, time.Hour)
	for i, id := range []uuid.UUID{delayed.RunID, at.RunID} {
		out, err := wf.Wait(ctx, e, id, 20*time.Millisecond)
		require.NoError(t, err)
		require.Equal(t, i+1, out)
	}
}
