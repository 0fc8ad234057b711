// Package riverref is the benchmark's reference: the same work as the
// engine's benchmark workflows, written by hand directly on River, with the
// same fetch settings. It is a harness, not part of the engine.
package riverref

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/pgdurable/pgdurable/cmd/engine/internal/steady"
)

type noopArgs struct{}

func (noopArgs) Kind() string { return "pgdurable.bench.noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
	done *atomic.Int64
}

func (w *noopWorker) Work(context.Context, *river.Job[noopArgs]) error {
	w.done.Add(1)
	return nil
}

type txArgs struct {
	N     int `json:"n"`
	Steps int `json:"steps"`
}

func (txArgs) Kind() string { return "pgdurable.bench.steps_tx" }

// txWorker writes one row per step, each in its own transaction: the same
// work as a no-op workflow of that many steps, by hand.
type txWorker struct {
	river.WorkerDefaults[txArgs]
	pool *pgxpool.Pool
	done *atomic.Int64
}

func (w *txWorker) Work(ctx context.Context, job *river.Job[txArgs]) error {
	for step := range job.Args.Steps {
		if _, err := w.pool.Exec(ctx, `INSERT INTO pgdurable_bench_rows (job_id, step) VALUES ($1, $2)`, job.ID, step); err != nil {
			return err
		}
	}
	w.done.Add(1)
	return nil
}

// Config holds the River knobs the reference runs with: the engine's.
type Config struct {
	// Schema holds River's tables (the engine's, so both use the same).
	Schema            string
	MaxWorkers        int
	FetchCooldown     time.Duration
	FetchPollInterval time.Duration
	Logger            *slog.Logger
}

// ReferenceResult is one reference workload's outcome: its timing from
// the insert on (steady.Result: Rate is the steady state's jobs/s).
type ReferenceResult struct {
	steady.Result
	Jobs int
}

// RunReference inserts n jobs of kind "noop", "three_tx" or "ten_tx" (a
// row per step in its own transaction, 3 or 10 steps) on a fresh
// queue with cfg's fetch settings, works them with one River client, and
// returns the timing from the insert to the last completion, with its
// steady state's rate (steady.Result).
func RunReference(ctx context.Context, pool *pgxpool.Pool, cfg Config, kind string, n int) (*ReferenceResult, error) {
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS pgdurable_bench_rows (job_id bigint, step int)`); err != nil {
		return nil, err
	}
	var done atomic.Int64
	workers := river.NewWorkers()
	river.AddWorker(workers, &noopWorker{done: &done})
	river.AddWorker(workers, &txWorker{pool: pool, done: &done})
	queueName := "pgdurable_bench_" + kind
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:            map[string]river.QueueConfig{queueName: {MaxWorkers: cfg.MaxWorkers}},
		Workers:           workers,
		FetchCooldown:     cfg.FetchCooldown,
		FetchPollInterval: cfg.FetchPollInterval,
		Logger:            cfg.Logger,
		Schema:            cfg.Schema,
	})
	if err != nil {
		return nil, err
	}
	params := make([]river.InsertManyParams, n)
	for i := range params {
		var args river.JobArgs = noopArgs{}
		switch kind {
		case "three_tx":
			args = txArgs{N: i, Steps: 3}
		case "ten_tx":
			args = txArgs{N: i, Steps: 10}
		}
		params[i] = river.InsertManyParams{Args: args, InsertOpts: &river.InsertOpts{Queue: queueName}}
	}
	if err := client.Start(ctx); err != nil {
		return nil, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = client.Stop(sctx)
	}()
	// River's best case: every job inserted with one InsertMany.
	r, err := steady.While(ctx, &done, n, func() error {
		if _, err := client.InsertMany(ctx, params); err != nil {
			return fmt.Errorf("inserting reference jobs: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &ReferenceResult{Result: r, Jobs: n}, nil
}
