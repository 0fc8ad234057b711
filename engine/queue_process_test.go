package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/internal/crashtest"
)

// queuedIn is crash-queued's input: its key, its number within the key,
// and how long its step takes.
type queuedIn struct {
	Key     string `json:"key"`
	N       int    `json:"n"`
	SleepMS int    `json:"sleep_ms"`
}

// queuedCrashWorkflows: crash-queued runs in queue crash-q, keyed by its
// input's key; its one step logs its start and end (database time) and its
// process in queue_calls, which the test creates.
func queuedCrashWorkflows(pool *pgxpool.Pool) []engine.Registration {
	queued := engine.Define("crash-queued", func(ctx *engine.Context, in queuedIn) (int, error) {
		return engine.Step(ctx, "work", func(sctx context.Context) (int, error) {
			var id int
			err := pool.QueryRow(context.WithoutCancel(sctx), `INSERT INTO queue_calls (run_id, key, n, pid)
VALUES ($1, $2, $3, $4) RETURNING id`, ctx.RunID(), in.Key, in.N, os.Getpid()).Scan(&id)
			if err != nil {
				return 0, err
			}
			select {
			case <-time.After(time.Duration(in.SleepMS) * time.Millisecond):
			case <-sctx.Done():
				err = sctx.Err()
			}
			if _, uerr := pool.Exec(context.WithoutCancel(sctx), `UPDATE queue_calls SET ended_at = clock_timestamp() WHERE id = $1`, id); err == nil {
				err = uerr
			}
			return in.N, err
		}, nil)
	}, &engine.WorkflowOpts{Queue: "crash-q", QueueKey: engine.KeyOf(func(in queuedIn) string { return in.Key })})
	return []engine.Registration{queued}
}

// queueWorld is a database with queue_calls, and a client engine (not
// started) that starts crash-queued runs.
func queueWorld(t *testing.T) (*enginetest.DB, *engine.Engine) {
	t.Helper()
	db := enginetest.NewDB(t)
	_, err := db.Pool.Exec(context.Background(), `CREATE TABLE queue_calls (id bigserial PRIMARY KEY, run_id uuid NOT NULL,
key text NOT NULL, n int NOT NULL, pid int NOT NULL, started_at timestamptz NOT NULL DEFAULT clock_timestamp(), ended_at timestamptz)`)
	require.NoError(t, err)
	return db, newEngine(t, db, nil, false, queuedCrashWorkflows(db.Pool)...)
}

// queueWorker starts a worker process serving crash-q with opts.
func queueWorker(t *testing.T, db *enginetest.DB, lease time.Duration, opts engine.QueueOpts) *exec.Cmd {
	t.Helper()
	spec, err := json.Marshal(map[string]engine.QueueOpts{"crash-q": opts})
	require.NoError(t, err)
	return crashtest.StartWorker(t, db, lease, crashtest.EnvWorkerQueues+"="+string(spec), crashtest.EnvWorkerConns+"=8")
}

// startQueued starts runs of crash-queued through client in one call per
// 1,000 (StartMany).
func startQueued(ctx context.Context, t *testing.T, client *engine.Engine, ins []queuedIn) {
	t.Helper()
	wf := queuedCrashWorkflows(nil)[0].(*engine.Workflow[queuedIn, int])
	for len(ins) > 0 {
		n := min(len(ins), engine.MaxStartMany)
		starts := make([]engine.StartParams[queuedIn], n)
		for i := range starts {
			starts[i].Input = ins[i]
		}
		_, err := wf.StartMany(ctx, client, starts)
		require.NoError(t, err)
		ins = ins[n:]
	}
}

// Three processes share a queue limited to 5: never more than 5 of its runs
// hold a lease at once (sampled from the database every 10 ms), and the
// slots of a SIGKILLed process come back within one lease duration.
func TestQueueLimitAcrossProcessesAndCrash(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db, client := queueWorld(t)
	const lease = 2 * time.Second
	opts := engine.QueueOpts{Concurrency: 5, Workers: 5}
	var ins []queuedIn
	for i := range 60 {
		ins = append(ins, queuedIn{Key: fmt.Sprint("k", i), N: i, SleepMS: 300})
	}
	startQueued(ctx, t, client, ins)
	sampled := sampleMax(t, db, runningQuery, "crash-q")
	// Kill a process while it executes some of the queue's runs, and the
	// others take part.
	victim := queueWorker(t, db, lease, opts)
	var held int
	eventually(t, 30*time.Second, "the first worker runs the queue's runs", func() bool {
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM queue_calls WHERE pid = $1 AND ended_at IS NULL`,
			victim.Process.Pid).Scan(&held))
		return held > 0
	})
	queueWorker(t, db, lease, opts)
	queueWorker(t, db, lease, opts)
	eventually(t, 10*time.Second, "the first worker holds every slot", func() bool {
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM queue_calls WHERE pid = $1 AND ended_at IS NULL`,
			victim.Process.Pid).Scan(&held))
		return held == 5
	})
	crashtest.Kill(t, victim)
	// After the kill: a lease write the process sent before it died took
	// its time (now(), its transaction's start) before this.
	var killed time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&killed))
	// It held all 5 slots: they stay taken until its leases expire, which
	// is within one lease duration of the kill (the leases were extended
	// at most then), and no other process takes one before (every time
	// here is the database's clock).
	var firstExpiry, lastExpiry time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT min(lease_expires_at), max(lease_expires_at) FROM pgdurable.workflow_runs
WHERE run_id IN (SELECT run_id FROM queue_calls WHERE pid = $1 AND ended_at IS NULL)`), victim.Process.Pid).Scan(&firstExpiry, &lastExpiry))
	var reused time.Time
	// How soon after the expiry a slot is used again depends on the
	// admission's cadence and the machine's load; when is what is checked.
	eventually(t, lease+10*time.Second, "a run started after the kill", func() bool {
		var at *time.Time
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT min(started_at) FROM queue_calls WHERE started_at > $1`, killed).Scan(&at))
		if at != nil {
			reused = *at
		}
		return at != nil
	})
	t.Logf("%d slots of the killed process: leases expired %s to %s after the kill, a slot in use again after %s (lease %s)", held,
		firstExpiry.Sub(killed).Round(time.Millisecond), lastExpiry.Sub(killed).Round(time.Millisecond),
		reused.Sub(killed).Round(time.Millisecond), lease)
	require.Equal(t, 5, held, "the killed process held every slot")
	require.LessOrEqual(t, lastExpiry.Sub(killed), lease, "a slot held longer than one lease duration after the kill")
	require.False(t, reused.Before(firstExpiry), "a slot used at %s, before the dead process's first lease expired at %s", reused, firstExpiry)
	eventually(t, 10*time.Second, "the dead process's runs running again elsewhere", func() bool {
		var redelivered int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM queue_calls c WHERE c.pid <> $1 AND c.run_id IN
(SELECT run_id FROM queue_calls WHERE pid = $1 AND ended_at IS NULL)`, victim.Process.Pid).Scan(&redelivered))
		return redelivered == held
	})
	eventually(t, 60*time.Second, "every run completed", func() bool {
		return countRuns(t, db, engine.StatusCompleted) == len(ins)
	})
	require.LessOrEqual(t, sampled(), 5, "runs of the queue holding a live lease at once")
	var procs int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(DISTINCT pid) FROM queue_calls`).Scan(&procs))
	require.GreaterOrEqual(t, procs, 2, "processes that ran the queue's runs")
	var most int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT max(n) FROM (SELECT (SELECT count(*) FROM queue_calls o
WHERE o.started_at <= c.started_at AND coalesce(o.ended_at, 'infinity') > c.started_at AND o.pid <> $1) AS n FROM queue_calls c) x`,
		victim.Process.Pid).Scan(&most))
	require.LessOrEqual(t, most, 5, "steps of live processes running at once")
}

// Per-key limit 1, 20 keys, 2,000 runs across 2 processes: never two runs
// of one key at once, and every key's first run starts before any key's
// tenth.
func TestQueueKeyLimitAcrossProcesses(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db, client := queueWorld(t)
	var ins []queuedIn
	for k := range 20 {
		for n := range 100 {
			ins = append(ins, queuedIn{Key: fmt.Sprint("key-", k), N: n})
		}
	}
	startQueued(ctx, t, client, ins)
	opts := engine.QueueOpts{KeyConcurrency: 1, Workers: 20}
	queueWorker(t, db, 0, opts)
	queueWorker(t, db, 0, opts)
	eventually(t, 90*time.Second, "every run completed", func() bool {
		return countRuns(t, db, engine.StatusCompleted) == len(ins)
	})
	var overlaps int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM queue_calls a JOIN queue_calls b
ON a.key = b.key AND a.id <> b.id AND b.started_at >= a.started_at AND b.started_at < a.ended_at`).Scan(&overlaps))
	require.Zero(t, overlaps, "runs of one key that ran at once")
	var lastFirst, firstTenth time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT (SELECT max(started_at) FROM queue_calls WHERE n = 0),
(SELECT min(started_at) FROM queue_calls WHERE n = 9)`).Scan(&lastFirst, &firstTenth))
	require.True(t, lastFirst.Before(firstTenth), "a key's tenth run started at %s, before the last first run at %s", firstTenth, lastFirst)
	var calls int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM queue_calls`).Scan(&calls))
	require.Equal(t, len(ins), calls, "each run's step ran once")
}

// A rate limit of 50 a second over 10 s, across 2 processes, starts 500
// runs, give or take 5%. Not parallel: it measures time, and the
// package's other tests (race detector on, 2 cores) stalled admissions
// for longer than the 100 ms a rate limit catches up (472 in CI); it runs
// before them, beside at most one other package's tests.
func TestQueueRateLimitAcrossProcesses(t *testing.T) {
	enginetest.SkipOnCitus(t, "measures a rate to 5% in wall-clock time: alone on a cluster it starts 500 of 500, but beside the other package's tests on one 2-core machine that also runs the cluster's three servers, 470")
	ctx := testCtx(t)
	db, client := queueWorld(t)
	var ins []queuedIn
	for i := range 1500 {
		ins = append(ins, queuedIn{Key: fmt.Sprint("k", i%7), N: i})
	}
	startQueued(ctx, t, client, ins)
	opts := engine.QueueOpts{RateLimit: engine.Rate{Limit: 50, Period: time.Second}, Workers: 10}
	queueWorker(t, db, 0, opts)
	queueWorker(t, db, 0, opts)
	eventually(t, 30*time.Second, "the first start", func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM queue_calls`).Scan(&n))
		return n > 0
	})
	time.Sleep(12 * time.Second)
	var first time.Time
	var inWindow, pids int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT min(started_at) FROM queue_calls`).Scan(&first))
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT pid) FROM queue_calls
WHERE started_at >= $1::timestamptz + interval '1 second' AND started_at < $1::timestamptz + interval '11 seconds'`, first).Scan(&inWindow, &pids))
	t.Logf("%d starts in the 10 s window, by %d processes", inWindow, pids)
	require.InDelta(t, 500, inWindow, 25, "starts in 10 s at 50/s")
	require.Equal(t, 2, pids, "both processes started runs")
}

// A hot key with 10,000 runs waiting does not hold back 100 cold keys: a
// cold run starts after at most about one run of each other key that has
// runs waiting (the documented bound of start-time fair queuing), not
// after the hot key's backlog.
func TestQueueHotKeyDoesNotStarveColdKeys(t *testing.T) {
	t.Parallel()
	// What is checked is counted (runs started ahead of a cold run), not
	// timed; the context only bounds the test. On a Citus cluster beside
	// the other package's tests, inserting the 10,000 hot runs outlasted
	// the usual minute in CI (the whole test takes 14 s alone), so it
	// gets 3 minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	db, client := queueWorld(t)
	hot := make([]queuedIn, 10_000)
	for i := range hot {
		hot[i] = queuedIn{Key: "hot", N: i, SleepMS: 5}
	}
	startQueued(ctx, t, client, hot)
	queueWorker(t, db, 0, engine.QueueOpts{Concurrency: 10, Workers: 10})
	eventually(t, 30*time.Second, "the hot key's runs start", func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM queue_calls`).Scan(&n))
		return n > 100
	})
	const coldKeys, perKey = 100, 2
	for n := range perKey {
		for k := range coldKeys {
			startQueued(ctx, t, client, []queuedIn{{Key: fmt.Sprint("cold-", k), N: n, SleepMS: 5}})
		}
		time.Sleep(200 * time.Millisecond)
	}
	eventually(t, 60*time.Second, "every cold run completed", func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM queue_calls WHERE key LIKE 'cold-%' AND ended_at IS NOT NULL`).Scan(&n))
		return n == coldKeys*perKey
	})
	// For each cold run: how long it waited, and how many of the queue's
	// runs started between its start call and its own start.
	var p99Wait float64
	var p99Ahead, hotDone int
	require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`
WITH cold AS (
  SELECT c.started_at, r.created_at FROM queue_calls c JOIN pgdurable.workflow_runs r ON r.run_id = c.run_id WHERE c.key LIKE 'cold-%'
), ahead AS (
  SELECT extract(epoch FROM cold.started_at - cold.created_at) AS wait,
         (SELECT count(*) FROM queue_calls o WHERE o.started_at > cold.created_at AND o.started_at < cold.started_at) AS ahead
  FROM cold
)
SELECT percentile_disc(0.99) WITHIN GROUP (ORDER BY wait), percentile_disc(0.99) WITHIN GROUP (ORDER BY ahead),
       (SELECT count(*) FROM queue_calls WHERE key = 'hot')
FROM ahead`)).Scan(&p99Wait, &p99Ahead, &hotDone))
	t.Logf("cold runs: p99 wait %.3f s, p99 runs started ahead %d; hot runs started by then: %d of %d", p99Wait, p99Ahead, hotDone, len(hot))
	// At most one run of each key waiting (101 keys, two at a tie of
	// tags), plus the 10 in flight when it became ready.
	require.LessOrEqual(t, p99Ahead, 2*(coldKeys+1)+10, "runs started ahead of a cold run")
	require.Less(t, hotDone, len(hot), "the hot backlog was still there")
}
