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
	stop := make(chan struct{})
	sampled := sampleMax(stop, func() int { return runningOf(t, db, "crash-q") })
	workers := []*exec.Cmd{queueWorker(t, db, lease, opts), queueWorker(t, db, lease, opts), queueWorker(t, db, lease, opts)}
	victim := workers[0]
	// Kill a process while it executes some of the queue's runs.
	var held int
	eventually(t, 30*time.Second, "the first worker runs the queue's runs", func() bool {
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM queue_calls WHERE pid = $1 AND ended_at IS NULL`,
			victim.Process.Pid).Scan(&held))
		return held > 0
	})
	crashtest.Kill(t, victim)
	killed := time.Now()
	// Its slots stay taken until its leases expire, then come back: the
	// queue runs 5 again, its killed runs among them, within one lease
	// duration (and a poll).
	eventually(t, lease+time.Second+500*time.Millisecond, "the dead process's runs running again elsewhere", func() bool {
		var redelivered int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM queue_calls c WHERE c.pid <> $1 AND c.run_id IN
(SELECT run_id FROM queue_calls WHERE pid = $1 AND ended_at IS NULL)`, victim.Process.Pid).Scan(&redelivered))
		return redelivered == held
	})
	t.Logf("%d slots of the killed process back after %s (lease %s)", held, time.Since(killed).Round(time.Millisecond), lease)
	eventually(t, 60*time.Second, "every run completed", func() bool {
		return countRuns(t, db, engine.StatusCompleted) == len(ins)
	})
	close(stop)
	require.LessOrEqual(t, <-sampled, 5, "runs of the queue holding a live lease at once")
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
