package engine_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/internal/roundtrips"
)

// quiet keeps benchmark output to the results.
var quiet = slog.New(slog.DiscardHandler)

func tracedPool(tb testing.TB, db *enginetest.DB, rt *roundtrips.Counter) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(tb, err)
	cfg.MaxConns = 20
	cfg.ConnConfig.Tracer = rt
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(tb, err)
	tb.Cleanup(pool.Close)
	return pool
}

// xactCommits reads the database's committed-transaction counter. Backends
// flush their statistics at most once a second, so callers wait first.
func xactCommits(tb testing.TB, db *enginetest.DB) int64 {
	var n int64
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, "SELECT pg_stat_clear_snapshot()")
	require.NoError(tb, err)
	require.NoError(tb, db.Pool.QueryRow(ctx, "SELECT xact_commit FROM pg_stat_database WHERE datname = $1", db.Name).Scan(&n))
	return n
}

func noopWorkflow(steps int, done *atomic.Int64) *engine.Workflow[int, int] {
	return engine.Define(fmt.Sprintf("noop-%d", steps), func(ctx *engine.Context, in int) (int, error) {
		for i := range steps {
			if _, err := engine.Step(ctx, fmt.Sprintf("s%d", i), func(context.Context) (int, error) { return i, nil }, nil); err != nil {
				return 0, err
			}
		}
		done.Add(1)
		return in, nil
	}, nil)
}

// BenchmarkWorkflow runs b.N no-op workflows of 3 and 10 steps, start
// included, through one engine with default settings, and reports
// throughput, commits and round trips per workflow. The marginal cost of a
// new step is (10-step - 3-step) / 7.
func BenchmarkWorkflow(b *testing.B) {
	for _, steps := range []int{3, 10} {
		b.Run(fmt.Sprintf("steps=%d", steps), func(b *testing.B) {
			db := enginetest.NewDB(b)
			var rt roundtrips.Counter
			pool := tracedPool(b, db, &rt)
			var done atomic.Int64
			wf := noopWorkflow(steps, &done)
			e, err := engine.New(pool, &engine.Config{Logger: quiet})
			require.NoError(b, err)
			require.NoError(b, e.Register(wf))
			ctx := context.Background()
			commits0 := xactCommits(b, db)
			require.NoError(b, e.Start(ctx))
			rt0 := rt.Count()
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			var next atomic.Int64
			for range 8 {
				wg.Go(func() {
					for next.Add(1) <= int64(b.N) {
						if _, err := wf.Start(ctx, e, 1, nil); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			for done.Load() < int64(b.N) {
				time.Sleep(time.Millisecond)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			rtUsed := rt.Count() - rt0
			// Backends flush statistics when they exit: stop the engine and
			// close its pool before reading the counter.
			require.NoError(b, e.Stop(ctx))
			pool.Close()
			time.Sleep(200 * time.Millisecond)
			commits := xactCommits(b, db) - commits0
			var completed int
			require.NoError(b, db.Pool.QueryRow(ctx, db.SQL("SELECT count(*) FROM pgdurable.workflow_runs WHERE status = 'completed'")).Scan(&completed))
			require.Equal(b, b.N, completed)

			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "workflows/s")
			b.ReportMetric(float64(b.N*steps)/elapsed.Seconds(), "steps/s")
			b.ReportMetric(float64(commits)/float64(b.N), "commits/workflow")
			b.ReportMetric(float64(rtUsed)/float64(b.N), "roundtrips/workflow")
		})
	}
}

// BenchmarkReplay1000Steps measures the delivery of a run with 1,000
// recorded steps: the claim (one batch: lease + all steps) and the replay
// up to the first new step, in time and in round trips.
func BenchmarkReplay1000Steps(b *testing.B) {
	db := enginetest.NewDB(b)
	var rt roundtrips.Counter
	pool := tracedPool(b, db, &rt)
	ctx := context.Background()
	const recorded = 1000
	var gate atomic.Bool // false on the first delivery: the last step waits
	var entry, last time.Time
	var claimTook time.Duration
	var rtEntry, rtLast int64
	wf := engine.Define("long-history", func(ctx *engine.Context, in int) (int, error) {
		if gate.Load() {
			entry, rtEntry, claimTook = time.Now(), rt.Count(), rt.LastBatch()
		}
		for i := range recorded {
			if _, err := engine.Step(ctx, fmt.Sprintf("s%d", i), func(context.Context) (int, error) { return i, nil }, nil); err != nil {
				return 0, err
			}
		}
		return engine.Step(ctx, "last", func(context.Context) (int, error) {
			if !gate.Load() {
				return 0, fmt.Errorf("not yet") // retried after 1.5 s: that delivery replays 1,000 steps
			}
			last, rtLast = time.Now(), rt.Count()
			return 1, nil
		}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: 1500 * time.Millisecond, DisableJitter: true}})
	}, nil)
	e, err := engine.New(pool, &engine.Config{MaxWorkers: 1, Logger: quiet})
	require.NoError(b, err)
	require.NoError(b, e.Register(wf))
	require.NoError(b, e.Start(ctx))
	defer e.Stop(ctx) //nolint:errcheck
	status := func(id any) engine.RunStatus {
		var s engine.RunStatus
		require.NoError(b, db.Pool.QueryRow(ctx, db.SQL("SELECT status FROM pgdurable.workflow_runs WHERE run_id = $1"), id).Scan(&s))
		return s
	}

	var replay, claim time.Duration
	var replayRT int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		gate.Store(false)
		res, err := wf.Start(ctx, e, i, nil)
		require.NoError(b, err)
		for status(res.RunID) != engine.StatusWaiting {
			time.Sleep(5 * time.Millisecond)
		}
		gate.Store(true)
		for status(res.RunID) != engine.StatusCompleted {
			time.Sleep(5 * time.Millisecond)
		}
		replay += last.Sub(entry)
		claim += claimTook
		replayRT += rtLast - rtEntry
	}
	b.ReportMetric(float64(claim.Microseconds())/1000/float64(b.N), "ms/claim+load")
	b.ReportMetric(float64(replay.Microseconds())/1000/float64(b.N), "ms/replay")
	b.ReportMetric(float64(replayRT)/float64(b.N*recorded), "roundtrips/replayed-step")
}

// BenchmarkStartToCompletion starts 3-step no-op workflows one at a time
// (low load) and reports start-to-completion latency percentiles, polling
// the run's status every 100µs.
func BenchmarkStartToCompletion(b *testing.B) {
	db := enginetest.NewDB(b)
	var done atomic.Int64
	wf := noopWorkflow(3, &done)
	e, err := engine.New(db.Pool, &engine.Config{Logger: quiet})
	require.NoError(b, err)
	require.NoError(b, e.Register(wf))
	ctx := context.Background()
	require.NoError(b, e.Start(ctx))
	defer e.Stop(ctx)                  //nolint:errcheck
	time.Sleep(500 * time.Millisecond) // River's producer is listening

	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		res, err := wf.Start(ctx, e, i, nil)
		require.NoError(b, err)
		for {
			var status engine.RunStatus
			require.NoError(b, db.Pool.QueryRow(ctx, db.SQL("SELECT status FROM pgdurable.workflow_runs WHERE run_id = $1"), res.RunID).Scan(&status))
			if status == engine.StatusCompleted {
				break
			}
			time.Sleep(100 * time.Microsecond)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}

// BenchmarkStepKinds runs b.N workflows of n steps of one kind and reports
// the marginal round trips and commits of one step of that kind as
// (per-workflow cost at n=10 − at n=3) / 7.
func BenchmarkStepKinds(b *testing.B) {
	kinds := map[string]func(ctx *engine.Context, i int) error{
		"step": func(ctx *engine.Context, i int) error {
			_, err := engine.Step(ctx, fmt.Sprint("s", i), func(context.Context) (int, error) { return i, nil }, nil)
			return err
		},
		"tx": func(ctx *engine.Context, i int) error {
			_, err := engine.TxStep(ctx, fmt.Sprint("t", i), func(context.Context, pgx.Tx) (int, error) { return i, nil }, nil)
			return err
		},
		"activity": func(ctx *engine.Context, i int) error {
			_, err := engine.RunActivity(ctx, fmt.Sprint("a", i), func(context.Context, *engine.ActivityAttempt) (int, error) { return i, nil }, nil)
			return err
		},
	}
	// A patched step: the change's marker, then the step (see Patched).
	kinds["patched"] = func(ctx *engine.Context, i int) error {
		if !engine.Patched(ctx, fmt.Sprint("p", i)) {
			return nil
		}
		return kinds["step"](ctx, i)
	}
	for _, kind := range []string{"step", "tx", "activity", "patched"} {
		b.Run("kind="+kind, func(b *testing.B) {
			var perWF [2]struct{ rt, commits float64 }
			for j, n := range []int{3, 10} {
				db := enginetest.NewDB(b)
				var rt roundtrips.Counter
				pool := tracedPool(b, db, &rt)
				var done atomic.Int64
				wf := engine.Define("kinds", func(ctx *engine.Context, in int) (int, error) {
					for i := range n {
						if err := kinds[kind](ctx, i); err != nil {
							return 0, err
						}
					}
					done.Add(1)
					return in, nil
				}, nil)
				e, err := engine.New(pool, &engine.Config{Logger: quiet})
				require.NoError(b, err)
				require.NoError(b, e.Register(wf))
				ctx := context.Background()
				commits0 := xactCommits(b, db)
				require.NoError(b, e.Start(ctx))
				rt0 := rt.Count()
				for i := 0; i < b.N; i++ {
					_, err := wf.Start(ctx, e, i, nil)
					require.NoError(b, err)
				}
				for done.Load() < int64(b.N) {
					time.Sleep(time.Millisecond)
				}
				rtUsed := rt.Count() - rt0
				require.NoError(b, e.Stop(ctx))
				pool.Close()
				time.Sleep(200 * time.Millisecond)
				perWF[j].rt = float64(rtUsed) / float64(b.N)
				perWF[j].commits = float64(xactCommits(b, db)-commits0) / float64(b.N)
			}
			b.ReportMetric((perWF[1].rt-perWF[0].rt)/7, "roundtrips/"+kind)
			b.ReportMetric((perWF[1].commits-perWF[0].commits)/7, "commits/"+kind)
		})
	}
}
