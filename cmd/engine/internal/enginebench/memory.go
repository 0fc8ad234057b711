package enginebench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdurable/pgdurable/engine"
)

// memoryResult is the process's memory with n runs asleep, and before.
type memoryResult struct {
	idleRSS, waitingRSS   float64 // MiB, from /proc/self/status VmRSS
	idleHeap, waitingHeap float64 // MiB of Go heap in use after a GC
	goroutinesIdle        int
	goroutinesWaiting     int
}

// waitingMemory starts n runs that each sleep an hour, waits until all of
// them are waiting, and reads this process's memory: a waiting run should
// cost the engine nothing (no goroutine, connection or worker slot).
func waitingMemory(ctx context.Context, pool *pgxpool.Pool, n int, log *slog.Logger) (*memoryResult, error) {
	var slept atomic.Int64
	wf := engine.Define("bench-sleeper", func(ctx *engine.Context, _ int) (int, error) {
		slept.Add(1)
		if err := engine.Sleep(ctx, time.Hour); err != nil {
			return 0, err
		}
		return 0, nil
	}, nil)
	e, stop, err := startEngine(ctx, pool, &engine.Config{Logger: log, Queue: "bench_waiting"}, wf)
	if err != nil {
		return nil, err
	}
	defer stop()
	time.Sleep(2 * time.Second) // River's services start
	m := &memoryResult{}
	if m.idleRSS, m.idleHeap, err = memory(); err != nil {
		return nil, err
	}
	m.goroutinesIdle = runtime.NumGoroutine()

	if err := startMany(ctx, e, wf, n, 0); err != nil {
		return nil, err
	}
	for {
		// The queue is the sleepers' own: its waiting runs are theirs.
		s, err := e.Stats(ctx)
		if err != nil {
			return nil, err
		}
		if s.WaitingRuns >= int64(n) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	time.Sleep(time.Second) // River's completer flushes; deliveries' goroutines end
	if m.waitingRSS, m.waitingHeap, err = memory(); err != nil {
		return nil, err
	}
	m.goroutinesWaiting = runtime.NumGoroutine()
	return m, nil
}

// memory returns the resident set size and the live Go heap, in MiB.
func memory() (rss, heap float64, err error) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, 0, fmt.Errorf("reading RSS: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				return 0, 0, fmt.Errorf("reading RSS: %w", err)
			}
			return kb / 1024, float64(ms.HeapInuse) / (1 << 20), nil
		}
	}
	return 0, 0, errors.New("reading RSS: no VmRSS in /proc/self/status")
}
