package enginebench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/internal/roundtrips"
)

// replayCost runs a workflow that records 1,000 steps and then waits for a
// retry; its next delivery replays them. It returns that delivery's claim
// (one batch) and replay times in ms, and the round trips per replayed step.
func replayCost(ctx context.Context, pool *pgxpool.Pool, rt *roundtrips.Counter, log *slog.Logger) (claimMS, replayMS, perStep float64, err error) {
	const recorded = 1000
	var gate atomic.Bool
	var mu sync.Mutex
	var entry, last time.Time
	var rtEntry, rtLast int64
	var claim time.Duration
	wf := engine.Define("bench-replay", func(ctx *engine.Context, in int) (int, error) {
		if gate.Load() {
			mu.Lock()
			entry, rtEntry, claim = time.Now(), rt.Count(), rt.LastBatch()
			mu.Unlock()
		}
		for i := range recorded {
			if _, err := engine.Step(ctx, fmt.Sprint("s", i), func(context.Context) (int, error) { return i, nil }, nil); err != nil {
				return 0, err
			}
		}
		return engine.Step(ctx, "last", func(context.Context) (int, error) {
			if !gate.Load() {
				return 0, errors.New("not yet")
			}
			mu.Lock()
			last, rtLast = time.Now(), rt.Count()
			mu.Unlock()
			return 1, nil
		}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: 1500 * time.Millisecond, DisableJitter: true}})
	}, nil)
	e, stop, err := startEngine(ctx, pool, &engine.Config{Logger: log, Queue: "bench_replay", MaxWorkers: 1}, wf)
	if err != nil {
		return 0, 0, 0, err
	}
	defer stop()
	res, err := wf.Start(ctx, e, 1, nil)
	if err != nil {
		return 0, 0, 0, err
	}
	if err := waitStatus(ctx, e, res.RunID, engine.StatusWaiting); err != nil {
		return 0, 0, 0, err
	}
	gate.Store(true)
	// The run ends in this process, which wakes Wait as the end commits:
	// Wait reads the run when called and then, and does not poll (its
	// poll is longer than its deadline), so no read of the run adds round
	// trips to the replay or a batch between the claim and the entry.
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if _, err := wf.Wait(wctx, e, res.RunID, time.Hour); err != nil {
		return 0, 0, 0, fmt.Errorf("waiting for run %s to complete: %w", res.RunID, err)
	}
	mu.Lock()
	defer mu.Unlock()
	return float64(claim.Microseconds()) / 1000, float64(last.Sub(entry).Microseconds()) / 1000, float64(rtLast-rtEntry) / recorded, nil
}

// waitStatus polls run runID every 5 ms until its status is status, for
// at most 60 s.
func waitStatus(ctx context.Context, e *engine.Engine, runID uuid.UUID, status engine.RunStatus) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		run, err := e.GetRun(ctx, runID)
		if err != nil {
			return err
		}
		if run.Status == status {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("run %s is %s, not %s, after 60s", runID, run.Status, status)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
