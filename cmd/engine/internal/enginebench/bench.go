// Package enginebench measures the engine side by side with hand-written
// River in one process, on one database: throughput, commits and round
// trips per workflow, latency, and replay cost. `engine bench` prints its
// Report; run it on a database of its own (it creates tables and jobs).
package enginebench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdurable/pgdurable/cmd/engine/internal/enginebench/internal/riverref"
	"github.com/pgdurable/pgdurable/cmd/engine/internal/steady"
	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/internal/roundtrips"
)

// Options sizes the benchmark.
type Options struct {
	// Workflows per throughput row; default 10,000. Each row's rate is
	// its steady state's (the completions between the first and the last
	// tenth), so rows over a second or more move by a few percent.
	Workflows int
	// LatencySamples for the one-at-a-time latency rows; default 200.
	LatencySamples int
	// WaitingRuns for the memory row: runs asleep at once; default 10,000.
	WaitingRuns int
	// Progress receives a line per finished row; nil: none.
	Progress io.Writer
	// Rounds of the rows the targets name (the 3-transaction River
	// reference, the 3-step no-op workflow, 3 tx steps), measured in turn;
	// their medians are reported. Default 3.
	Rounds int
	// CPUProfile, when set, receives a pprof CPU profile of this process
	// during the first round's 3-step throughput row (go tool pprof reads
	// it).
	CPUProfile io.Writer
}

// Row is one measurement.
type Row struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
	Note  string  `json:"note,omitempty"`
	// Skipped rows have no value (what they measure does not exist yet).
	Skipped bool `json:"skipped,omitempty"`
}

// Report is every row, in order.
type Report struct {
	Rows []Row `json:"rows"`
}

func (r *Report) add(opts Options, name string, value float64, unit, note string) {
	r.Rows = append(r.Rows, Row{Name: name, Value: value, Unit: unit, Note: note})
	if opts.Progress != nil {
		fmt.Fprintf(opts.Progress, "  %-48s %12.2f %s\n", name, value, unit)
	}
}

// Run measures against the database behind url, which must be migrated.
func Run(ctx context.Context, url string, opts Options) (*Report, error) {
	if opts.Workflows <= 0 {
		opts.Workflows = 10000
	}
	if opts.Rounds <= 0 {
		opts.Rounds = 3
	}
	if opts.LatencySamples <= 0 {
		opts.LatencySamples = 200
	}
	if opts.WaitingRuns <= 0 {
		opts.WaitingRuns = 10000
	}
	quiet := slog.New(slog.DiscardHandler)
	rt := &roundtrips.Counter{}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 20
	cfg.ConnConfig.Tracer = rt
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	rep := &Report{}
	n := opts.Workflows

	// The references: River alone, with the engine's queue settings.
	qcfg := riverref.Config{Schema: engine.DefaultSchema, MaxWorkers: 100, FetchCooldown: 2 * time.Millisecond, FetchPollInterval: 50 * time.Millisecond, Logger: quiet}
	settle(ctx, pool)
	noop, err := riverref.RunReference(ctx, pool, qcfg, "noop", n)
	if err != nil {
		return nil, err
	}
	rep.add(opts, "river no-op jobs", noop.Rate(), "jobs/s", "reference")
	// The rows the targets name, in rounds: each round measures the
	// 3-transaction River reference, the 3-step no-op workflow and 3 tx
	// steps one after another, and its ratios compare rows measured a few
	// seconds apart; the medians of the rounds are reported, with their
	// range. The first round's costs (commits, round trips, WAL) are
	// reported; they barely move.
	var refRates, noopRates, txRates, noopRatios, txRatios []float64
	var threeCost, res3, tx3 *throughputResult
	for r := range opts.Rounds {
		var three *riverref.ReferenceResult
		cost, err := measured(ctx, pool, rt, url, n, func() (err error) {
			three, err = riverref.RunReference(ctx, pool, qcfg, "three_tx", n)
			return err
		})
		if err != nil {
			return nil, err
		}
		profile := r == 0 && opts.CPUProfile != nil
		if profile {
			if err := pprof.StartCPUProfile(opts.CPUProfile); err != nil {
				return nil, err
			}
		}
		res, err := throughput(ctx, pool, rt, url, 3, n, plain, quiet)
		if profile {
			pprof.StopCPUProfile()
		}
		if err != nil {
			return nil, err
		}
		tx, err := throughput(ctx, pool, rt, url, 3, n, txSteps, quiet)
		if err != nil {
			return nil, err
		}
		if r == 0 {
			threeCost, res3, tx3 = cost, res, tx
		}
		refRates, noopRates, txRates = append(refRates, three.Rate()), append(noopRates, res.perSec), append(txRates, tx.perSec)
		noopRatios, txRatios = append(noopRatios, res.perSec/three.Rate()), append(txRatios, tx.perSec/three.Rate())
	}
	settle(ctx, pool)
	ten, err := riverref.RunReference(ctx, pool, qcfg, "ten_tx", n)
	if err != nil {
		return nil, err
	}
	threeRate, tenRate := median(refRates), ten.Rate()
	rounds := func(v []float64, format string) string {
		if len(v) == 1 {
			return "1 round"
		}
		return fmt.Sprintf("median of %d rounds, range "+format+"–"+format, len(v), slices.Min(v), slices.Max(v))
	}
	rep.add(opts, "river 3 rows in 3 transactions per job", threeRate, "jobs/s", "reference: a 3-step workflow by hand; "+rounds(refRates, "%.0f"))
	rep.add(opts, "river 3 rows in 3 transactions: commits", threeCost.commits, "commits/job", "pg_stat_database xact_commit delta")
	rep.add(opts, "river 3 rows in 3 transactions: round trips", threeCost.roundTrips, "round trips/job", "")
	rep.add(opts, "river 3 rows in 3 transactions: WAL", threeCost.walBytes, "bytes/job", "pg_current_wal_lsn delta")
	rep.addCPU(opts, "river 3 rows in 3 transactions", "job", threeCost.cpu)
	rep.add(opts, "river 10 rows in 10 transactions per job", tenRate, "jobs/s", "reference: a 10-step workflow by hand")

	// Exactly-once writes: 3 tx steps, each inserting one row, the River
	// reference's very work.
	rep.add(opts, "3 tx steps inserting a row each, start included", median(txRates), "workflows/s",
		"each row committed with its step's record; "+rounds(txRates, "%.0f"))
	rep.add(opts, "3 tx steps / hand-written River", median(txRatios), "ratio", "target >= 1.0; each round's ratio, "+rounds(txRatios, "%.2f"))
	rep.add(opts, "3 tx steps: commits", tx3.commits, "commits/workflow", "pg_stat_database xact_commit delta")
	rep.add(opts, "3 tx steps: round trips", tx3.roundTrips, "round trips/workflow", "")
	rep.add(opts, "3 tx steps: WAL", tx3.walBytes, "bytes/workflow", "pg_current_wal_lsn delta")
	rep.addCPU(opts, "3 tx steps", "workflow", tx3.cpu)

	var rt3 float64
	for _, steps := range []int{3, 10} {
		res := res3
		note := ""
		if steps == 3 {
			res = &throughputResult{perSec: median(noopRates), commits: res3.commits, roundTrips: res3.roundTrips, walBytes: res3.walBytes, cpu: res3.cpu}
			note = rounds(noopRates, "%.0f")
		} else if res, err = throughput(ctx, pool, rt, url, steps, n, plain, quiet); err != nil {
			return nil, err
		}
		name := fmt.Sprintf("%d-step no-op workflow, start included", steps)
		rep.add(opts, name, res.perSec, "workflows/s", note)
		rep.add(opts, name+": steps", res.perSec*float64(steps), "steps/s", "")
		if steps == 3 {
			rep.add(opts, "3-step workflow / hand-written River", median(noopRatios), "ratio", "target >= 1.5; each round's ratio, "+rounds(noopRatios, "%.2f"))
		} else {
			rep.add(opts, "10-step workflow / hand-written River", res.perSec/tenRate, "ratio", "target >= 1.0")
		}
		rep.add(opts, name+": commits", res.commits, "commits/workflow", "pg_stat_database xact_commit delta")
		rep.add(opts, name+": round trips", res.roundTrips, "round trips/workflow", "")
		rep.add(opts, name+": WAL", res.walBytes, "bytes/workflow", "pg_current_wal_lsn delta")
		rep.addCPU(opts, name, "workflow", res.cpu)
		if steps == 3 {
			rt3 = res.roundTrips
			// Safe deploys on the hot path: the same workflow as version 2
			// beside version 1, then also behind a patch, against the
			// plain row just measured.
			p, err := throughput(ctx, pool, rt, url, steps, n, pinned, quiet)
			if err != nil {
				return nil, err
			}
			v, err := throughput(ctx, pool, rt, url, steps, n, patched, quiet)
			if err != nil {
				return nil, err
			}
			rep.add(opts, "3-step workflow as v2 beside v1, start included", p.perSec, "workflows/s", "runs pinned to their version")
			rep.add(opts, "pinned v2 / plain 3-step workflow", p.perSec/res.perSec, "ratio", "target ~1.0")
			rep.add(opts, "3-step workflow as v2 beside v1, patched, start included", v.perSec, "workflows/s", "and a Patched call: the change rides on the next step's record")
			rep.add(opts, "patched v2 / plain 3-step workflow", v.perSec/res.perSec, "ratio", "")
			rep.add(opts, "3-step workflow as v2 beside v1, patched: round trips", v.roundTrips, "round trips/workflow", "")
			rep.add(opts, "3-step workflow as v2 beside v1, patched: WAL", v.walBytes, "bytes/workflow", "")
			// Flow control on the hot path: the same workflow through a
			// queue limited to 100 at once, then limited to 1 per key over
			// 1,000 keys, against the unlimited row.
			l, err := throughput(ctx, pool, rt, url, steps, n, limited, quiet)
			if err != nil {
				return nil, err
			}
			k, err := throughput(ctx, pool, rt, url, steps, n, keyed, quiet)
			if err != nil {
				return nil, err
			}
			rep.add(opts, "3-step workflow in a queue of 100 at once, start included", l.perSec, "workflows/s", "every run admitted by the queue")
			rep.add(opts, "queue of 100 at once / unlimited 3-step workflow", l.perSec/res.perSec, "ratio", "target >= 0.8")
			rep.add(opts, "3-step workflow in a queue of 100 at once: round trips", l.roundTrips, "round trips/workflow", "")
			rep.add(opts, "3-step workflow in a queue of 100 at once: commits", l.commits, "commits/workflow", "")
			rep.add(opts, "3-step workflow in a queue, 1 at once per key over 1,000 keys", k.perSec, "workflows/s", "and 100 at once in all")
			rep.add(opts, "queue of 1 per key (1,000 keys) / unlimited 3-step workflow", k.perSec/res.perSec, "ratio", "target >= 0.8")
		} else {
			rep.add(opts, "round trips per new step, at load", (res.roundTrips-rt3)/7, "round trips/step",
				"(10-step − 3-step) / 7: concurrent runs share their writes")
		}
	}

	lat, err := latency(ctx, pool, rt, opts.LatencySamples, quiet)
	if err != nil {
		return nil, err
	}
	rep.add(opts, "round trips per new step", lat.perStep, "round trips/step", "one run at a time: (10-step − 3-step) / 7")
	rep.add(opts, "one synchronous commit, p50", pct(lat.commit, 0.5), "ms", "the floor of each durable write on this machine")
	rep.add(opts, "start (its commit), p50", pct(lat.start, 0.5), "ms", "one at a time")
	rep.add(opts, "start to first step, p50", pct(lat.first, 0.5), "ms", "one at a time: the start, then the step runs in the starting process")
	rep.add(opts, "start to first step, p99", pct(lat.first, 0.99), "ms", "")
	rep.add(opts, "start to completion (3 steps), p50", pct(lat.done, 0.5), "ms", "target < 1.5")
	rep.add(opts, "start to completion (3 steps), p99", pct(lat.done, 0.99), "ms", "target < 10")
	rep.add(opts, "start to completion (3 tx steps), p50", pct(lat.txDone, 0.5), "ms", "one at a time; each tx step's commit is a durable write")
	rep.add(opts, "start to completion (3 tx steps), p99", pct(lat.txDone, 0.99), "ms", "")
	rep.add(opts, "3 tx steps one at a time: round trips", lat.txRoundTrips, "round trips/workflow", "start included; the median workflow's")

	claim, replay, perStep, err := replayCost(ctx, pool, rt, quiet)
	if err != nil {
		return nil, err
	}
	rep.add(opts, "replay 1,000 recorded steps: claim + load", claim, "ms", "one batch")
	rep.add(opts, "replay 1,000 recorded steps: replay", replay, "ms", "")
	rep.add(opts, "round trips per replayed step", perStep, "round trips/step", "target 0")
	mem, err := waitingMemory(ctx, pool, opts.WaitingRuns, quiet)
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("RSS with %s waiting runs", thousands(opts.WaitingRuns))
	rep.add(opts, name, mem.waitingRSS, "MiB", fmt.Sprintf("%.1f MiB idle before; Go heap %.1f -> %.1f MiB; goroutines %d -> %d",
		mem.idleRSS, mem.idleHeap, mem.waitingHeap, mem.goroutinesIdle, mem.goroutinesWaiting))
	return rep, nil
}

type throughputResult struct {
	perSec, commits, roundTrips, walBytes float64
	cpu                                   cpuCost
}

// addCPU adds the CPU rows of a throughput row named name, per unit (a
// job or a workflow), when the machine's clock could be read.
func (r *Report) addCPU(opts Options, name, unit string, c cpuCost) {
	if !c.ok {
		return
	}
	r.add(opts, name+": engine CPU", c.engine, "ms/"+unit, "this process's CPU time (getrusage), starts included")
	r.add(opts, name+": PostgreSQL CPU", c.other, "ms/"+unit,
		"the rest of the machine's busy time (/proc/stat): PostgreSQL's, on a machine of its own")
}

func noopWorkflow(name string, steps int, done *atomic.Int64, stepOne chan<- time.Time) *engine.Workflow[int, int] {
	return versionedNoop(name, steps, done, stepOne, 1, false)
}

// versionedNoop is noopWorkflow as version v, with a Patched call before
// its steps when patched.
func versionedNoop(name string, steps int, done *atomic.Int64, stepOne chan<- time.Time, v int, patched bool) *engine.Workflow[int, int] {
	return queuedNoop(name, steps, done, stepOne, &engine.WorkflowOpts{Version: v}, patched)
}

// queuedNoop is noopWorkflow with opts.
func queuedNoop(name string, steps int, done *atomic.Int64, stepOne chan<- time.Time, opts *engine.WorkflowOpts, patched bool) *engine.Workflow[int, int] {
	return engine.Define(name, func(ctx *engine.Context, in int) (int, error) {
		if patched && !engine.Patched(ctx, "bench-change") {
			return 0, errors.New("a fresh run took the old branch")
		}
		for i := range steps {
			if _, err := engine.Step(ctx, fmt.Sprint("s", i), func(context.Context) (int, error) {
				if i == 0 && stepOne != nil {
					stepOne <- time.Now()
				}
				return i, nil
			}, nil); err != nil {
				return 0, err
			}
		}
		done.Add(1)
		return in, nil
	}, opts)
}

// txWorkflow is a workflow of steps tx steps, each inserting one row in
// its transaction: the same work as the River reference's jobs, with each
// row written exactly once.
func txWorkflow(name string, steps int, done *atomic.Int64, stepOne chan<- time.Time, opts *engine.WorkflowOpts) *engine.Workflow[int, int] {
	return engine.Define(name, func(ctx *engine.Context, in int) (int, error) {
		for i := range steps {
			if _, err := engine.TxStep(ctx, fmt.Sprint("s", i), func(sctx context.Context, tx pgx.Tx) (int, error) {
				if i == 0 && stepOne != nil {
					stepOne <- time.Now()
				}
				_, err := tx.Exec(sctx, `INSERT INTO pgdurable_bench_rows (job_id, step) VALUES ($1, $2)`, in, i)
				return i, err
			}, nil); err != nil {
				return 0, err
			}
		}
		done.Add(1)
		return in, nil
	}, opts)
}

// measured runs fn, a workload of n units, and returns what it cost per
// unit: commits, round trips on pool and WAL (perSec is left to fn's own
// clock).
func measured(ctx context.Context, pool *pgxpool.Pool, rt *roundtrips.Counter, url string, n int, fn func() error) (*throughputResult, error) {
	settle(ctx, pool)
	commits0, err := xactCommits(ctx, url)
	if err != nil {
		return nil, err
	}
	wal0, err := walBytes(ctx, pool)
	if err != nil {
		return nil, err
	}
	rt0, cpu0 := rt.Count(), readCPU()
	if err := fn(); err != nil {
		return nil, err
	}
	used, cpu := rt.Count()-rt0, cpu0.costTo(readCPU(), n)
	wal1, err := walBytes(ctx, pool)
	if err != nil {
		return nil, err
	}
	pool.Reset()
	time.Sleep(300 * time.Millisecond)
	commits1, err := xactCommits(ctx, url)
	if err != nil {
		return nil, err
	}
	return &throughputResult{commits: float64(commits1-commits0) / float64(n), roundTrips: float64(used) / float64(n),
		walBytes: float64(wal1-wal0) / float64(n), cpu: cpu}, nil
}

// The variants of the throughput rows: a plain workflow; the same as
// version 2 registered beside version 1 (runs pinned to their version);
// and that version 2 with a Patched call before its steps.
// limited runs the plain workflow through a queue of 100 at once, and
// keyed through one of 1 at once per key (the run's number modulo 1,000)
// and 100 in all.
const (
	plain = iota
	pinned
	patched
	limited
	keyed
	// txSteps runs tx steps that each insert a row instead of no-op steps.
	txSteps
)

// throughput runs n runs of a no-op workflow of steps steps, as variant
// says: what safe deploys add to a run.
func throughput(ctx context.Context, pool *pgxpool.Pool, rt *roundtrips.Counter, url string, steps, n, variant int, log *slog.Logger) (*throughputResult, error) {
	var done atomic.Int64
	name, queue := fmt.Sprintf("bench-%d-steps", steps), fmt.Sprintf("bench_%d", steps)
	wf := noopWorkflow(name, steps, &done, nil)
	regs := []engine.Registration{wf}
	var startOpts func(i int) *engine.StartOpts
	switch variant {
	case pinned, patched:
		name, queue = fmt.Sprintf("%s-v2-%d", name, variant), fmt.Sprintf("%s_v2_%d", queue, variant)
		wf = versionedNoop(name, steps, &done, nil, 2, variant == patched)
		regs = []engine.Registration{versionedNoop(name, steps, &done, nil, 1, false), wf}
	case limited, keyed:
		name, queue = fmt.Sprintf("%s-queued-%d", name, variant), fmt.Sprintf("%s_queued_%d", queue, variant)
		wf = queuedNoop(name, steps, &done, nil, &engine.WorkflowOpts{Queue: queue}, false)
		regs = []engine.Registration{wf}
		if variant == keyed {
			startOpts = func(i int) *engine.StartOpts { return &engine.StartOpts{QueueKey: strconv.Itoa(i % 1000)} }
		}
	case txSteps:
		name, queue = fmt.Sprintf("bench-%d-tx-steps", steps), fmt.Sprintf("bench_%d_tx", steps)
		wf = txWorkflow(name, steps, &done, nil, nil)
		regs = []engine.Registration{wf}
	}
	e, err := engine.New(pool, &engine.Config{Logger: log, Queue: queue})
	if err != nil {
		return nil, err
	}
	if err := e.Register(regs...); err != nil {
		return nil, err
	}
	switch variant {
	case limited:
		err = e.RegisterQueue(queue, engine.QueueOpts{Concurrency: 100, Workers: 100})
	case keyed:
		err = e.RegisterQueue(queue, engine.QueueOpts{Concurrency: 100, KeyConcurrency: 1, Workers: 100})
	}
	if err != nil {
		return nil, err
	}
	settle(ctx, pool)
	commits0, err := xactCommits(ctx, url)
	if err != nil {
		return nil, err
	}
	wal0, err := walBytes(ctx, pool)
	if err != nil {
		return nil, err
	}
	if err := e.Start(ctx); err != nil {
		return nil, err
	}
	rt0, cpu0 := rt.Count(), readCPU()
	timed, err := steady.While(ctx, &done, n, func() error { return startManyWith(ctx, e, wf, n, 1, startOpts) })
	if err != nil {
		return nil, err
	}
	used, cpu := rt.Count()-rt0, cpu0.costTo(readCPU(), n)
	wal1, err := walBytes(ctx, pool)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Stop(sctx); err != nil {
		return nil, err
	}
	// Backends flush their statistics when they end: recycle the pool's
	// connections before reading the counter.
	pool.Reset()
	time.Sleep(300 * time.Millisecond)
	commits1, err := xactCommits(ctx, url)
	if err != nil {
		return nil, err
	}
	return &throughputResult{perSec: timed.Rate(), commits: float64(commits1-commits0) / float64(n),
		roundTrips: float64(used) / float64(n), walBytes: float64(wal1-wal0) / float64(n), cpu: cpu}, nil
}

// median is the middle of v (the mean of the middle two for an even
// count).
func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// settle readies the database for the next row: a vacuum of the tables
// the rows fill, so that autovacuum does not start on them in the middle
// of the next row; a checkpoint, so that no row pays for writing out
// another's pages or for the first full-page images after a timed
// checkpoint (both best effort: they need the tables' owner, and a
// superuser or pg_checkpoint); and a fresh pool, since earlier rows'
// backends flush their statistics only when they end and their commits
// must not be counted in this row.
func settle(ctx context.Context, pool *pgxpool.Pool) {
	_, _ = pool.Exec(ctx, "VACUUM (ANALYZE) "+engine.DefaultSchema+".workflow_runs, "+engine.DefaultSchema+".workflow_steps, "+
		engine.DefaultSchema+".river_job")
	_, _ = pool.Exec(ctx, "CHECKPOINT")
	pool.Reset()
	time.Sleep(300 * time.Millisecond)
}

// walBytes reads the WAL insert position: the delta over a workload is the
// WAL it wrote (the whole cluster's: run the bench alone).
func walBytes(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint").Scan(&n)
	return n, err
}

// xactCommits reads the database's commit counter on a connection of its own.
func xactCommits(ctx context.Context, url string) (int64, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var n int64
	err = conn.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&n)
	return n, err
}

// latencies holds one-at-a-time samples: a bare synchronous commit (the
// floor each durable write pays), the start's own commit, start to the first
// step's body, and start to the committed completion.
type latencies struct {
	commit, start, first, done []time.Duration
	// txDone is start to committed completion of the 3-tx-step workflow,
	// and txRoundTrips its round trips.
	txDone       []time.Duration
	txRoundTrips float64
	// perStep is the round trips a new step adds to a run alone.
	perStep float64
}

// endObserver reports each committed run end, so completion is timed
// without polling the database from the measuring process.
type endObserver struct {
	engine.NopObserver
	ended chan time.Time
}

func (o endObserver) RunEnded(engine.RunEndedEvent) { o.ended <- time.Now() }

func latency(ctx context.Context, pool *pgxpool.Pool, rt *roundtrips.Counter, samples int, log *slog.Logger) (*latencies, error) {
	var finished atomic.Int64
	stepOne := make(chan time.Time, 1)
	ended := make(chan time.Time, 1)
	wf := noopWorkflow("bench-latency", 3, &finished, stepOne)
	wf10 := noopWorkflow("bench-latency-10", 10, &finished, nil)
	wfTx := txWorkflow("bench-latency-tx", 3, &finished, nil, nil)
	e, stop, err := startEngine(ctx, pool, &engine.Config{Logger: log, Queue: "bench_latency", Observer: endObserver{ended: ended}}, wf, wf10, wfTx)
	if err != nil {
		return nil, err
	}
	defer stop()
	time.Sleep(300 * time.Millisecond) // River listens
	l := &latencies{}
	rt0 := rt.Count()
	for i := range samples {
		start := time.Now()
		// An XID makes the commit write and flush a commit record: the
		// cost of one durable write, without a table.
		if _, err := pool.Exec(ctx, "SELECT txid_current()"); err != nil {
			return nil, err
		}
		l.commit = append(l.commit, time.Since(start))

		start = time.Now()
		if _, err := wf.Start(ctx, e, i, nil); err != nil {
			return nil, err
		}
		l.start = append(l.start, time.Since(start))
		l.first = append(l.first, (<-stepOne).Sub(start))
		l.done = append(l.done, (<-ended).Sub(start))
	}
	per3 := float64(rt.Count()-rt0) / float64(samples)
	rt0 = rt.Count()
	for i := range samples {
		if _, err := wf10.Start(ctx, e, i, nil); err != nil {
			return nil, err
		}
		<-ended
	}
	l.perStep = (float64(rt.Count()-rt0)/float64(samples) - per3) / 7
	// The median of the workflows' counts: a background loop's round trip
	// (a sweep, River's fetch) falls in some workflow's window, more often
	// the longer each takes on a loaded machine, and would count as its.
	trips := make([]int64, 0, samples)
	for i := range samples {
		rt0 = rt.Count()
		start := time.Now()
		if _, err := wfTx.Start(ctx, e, i, nil); err != nil {
			return nil, err
		}
		l.txDone = append(l.txDone, (<-ended).Sub(start))
		trips = append(trips, rt.Count()-rt0)
	}
	slices.Sort(trips)
	l.txRoundTrips = float64(trips[len(trips)/2])
	return l, nil
}

func pct(d []time.Duration, p float64) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[int(p*float64(len(s)-1))].Microseconds()) / 1000
}

// thousands renders n with comma separators: 10000 -> "10,000".
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// startMany starts n runs of wf with input in from 100 goroutines, one
// Start call at a time each, as requests arrive in a busy service, and
// returns the first start error.
func startMany[In, Out any](ctx context.Context, e *engine.Engine, wf *engine.Workflow[In, Out], n int, in In) error {
	return startManyWith(ctx, e, wf, n, in, nil)
}

// startManyWith is startMany with each start's options from opts (the
// start's number), nil for none.
func startManyWith[In, Out any](ctx context.Context, e *engine.Engine, wf *engine.Workflow[In, Out], n int, in In, opts func(int) *engine.StartOpts) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var startErr atomic.Pointer[error]
	for range 100 {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				var o *engine.StartOpts
				if opts != nil {
					o = opts(int(i))
				}
				if _, err := wf.Start(ctx, e, in, o); err != nil {
					startErr.Store(&err)
					return
				}
			}
		})
	}
	wg.Wait()
	if p := startErr.Load(); p != nil {
		return *p
	}
	return nil
}

// startEngine builds and starts an engine over pool that works wf; stop
// stops it (waiting up to 10 s for deliveries to hand back).
func startEngine(ctx context.Context, pool *pgxpool.Pool, cfg *engine.Config, wf ...engine.Registration) (e *engine.Engine, stop func(), err error) {
	if e, err = engine.New(pool, cfg); err != nil {
		return nil, nil, err
	}
	if err := e.Register(wf...); err != nil {
		return nil, nil, err
	}
	if err := e.Start(ctx); err != nil {
		return nil, nil, err
	}
	return e, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.Stop(sctx)
	}, nil
}

// ScaleWorker is one process's share of the scale rows: it builds an
// engine on url (a 20-connection pool, queue bench_scale) that works the
// 3-step no-op workflow, calls ready, waits for gate, then starts n runs
// from 100 goroutines, one Start call at a time each, and returns once no
// run of the queue is open (the processes work each other's runs too),
// with the time from gate to then.
func ScaleWorker(ctx context.Context, url string, n int, ready func(), gate <-chan struct{}) (time.Duration, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return 0, err
	}
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	var done atomic.Int64
	wf := noopWorkflow("bench-scale", 3, &done, nil)
	e, stop, err := startEngine(ctx, pool, &engine.Config{Logger: slog.New(slog.DiscardHandler), Queue: "bench_scale"}, wf)
	if err != nil {
		return 0, err
	}
	defer stop()
	ready()
	<-gate
	start := time.Now()
	if err := startMany(ctx, e, wf, n, 1); err != nil {
		return 0, err
	}
	for {
		// Open runs of the queue: pending, running, waiting or compensating.
		s, err := e.Stats(ctx)
		if err != nil {
			return 0, err
		}
		if s.PendingRuns+s.RunningRuns+s.WaitingRuns == 0 {
			return time.Since(start), nil
		}
		time.Sleep(5 * time.Millisecond)
	}
}
