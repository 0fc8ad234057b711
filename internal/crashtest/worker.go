// Package crashtest is the module's private crash harness: a test binary
// re-executes itself as an engine worker (RunWorkerIfChild, StartWorker)
// that a test SIGKILLs (Kill) or SIGSTOPs mid-run, and that worker can
// write its spans to a file a kill cannot truncate (EnvWorkerTraceFile,
// ReadSpanFile). It sits in the module's root internal/ so that the tests
// of engine, activities, compensation and the examples can all import it;
// users' own tests get databases, engines and a clock from enginetest.
package crashtest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// Worker processes for crash tests: the test binary re-executes itself as
// an engine worker that a test can SIGKILL or SIGSTOP — a real crash, not a
// cancelled context.
const (
	envWorker      = "PGDURABLE_ENGINETEST_WORKER"
	envWorkerDB    = "PGDURABLE_ENGINETEST_WORKER_DB"
	envWorkerLease = "PGDURABLE_ENGINETEST_WORKER_LEASE_MS"
)

// EnvWorkerStarts, given to StartWorker as EnvWorkerStarts+"=name:n", has
// the worker start n runs of workflow name (input {}) once its engine is
// started, from 20 goroutines: runs that the worker executes itself
// (direct dispatch), with no River ticket, for tests that kill it mid-run.
const EnvWorkerStarts = "PGDURABLE_ENGINETEST_WORKER_STARTS"

// EnvWorkerConns, given to StartWorker as EnvWorkerConns+"=n", sizes the
// worker's pool (default 20): tests that start several workers keep within
// PostgreSQL's connection limit, which the parallel tests share.
const EnvWorkerConns = "PGDURABLE_ENGINETEST_WORKER_CONNS"

// EnvWorkerQueues, given to StartWorker as EnvWorkerQueues+"="+JSON, has
// the worker serve the queues the JSON object names, each with the
// engine.QueueOpts its value holds (durations in nanoseconds).
const EnvWorkerQueues = "PGDURABLE_ENGINETEST_WORKER_QUEUES"

// RunWorkerIfChild turns this process into a worker when StartWorker
// started it: it builds a pool on the test's database (20 connections), an
// engine with the lease StartWorker asked for, registers what register
// returns, works until killed (3 minutes at most) and exits. Otherwise it
// returns at once. Call it first in TestMain.
func RunWorkerIfChild(register func(pool *pgxpool.Pool) []engine.Registration) {
	if os.Getenv(envWorker) == "" {
		return
	}
	if err := runWorker(register); err != nil {
		fmt.Fprintln(os.Stderr, "crashtest worker:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runWorker(register func(pool *pgxpool.Pool) []engine.Registration) error {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv(envWorkerDB))
	if err != nil {
		return err
	}
	cfg.MaxConns = 20
	if n, _ := strconv.Atoi(os.Getenv(EnvWorkerConns)); n > 0 {
		cfg.MaxConns = int32(n)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	ecfg := &engine.Config{SweepInterval: 100 * time.Millisecond}
	if ms, _ := strconv.Atoi(os.Getenv(envWorkerLease)); ms > 0 {
		ecfg.LeaseDuration = time.Duration(ms) * time.Millisecond
	}
	if path := os.Getenv(EnvWorkerTraceFile); path != "" {
		tp, err := NewFileTracerProvider(path)
		if err != nil {
			return err
		}
		ecfg.TracerProvider = tp
	}
	e, err := engine.New(pool, ecfg)
	if err != nil {
		return err
	}
	if err := e.Register(register(pool)...); err != nil {
		return err
	}
	if spec := os.Getenv(EnvWorkerQueues); spec != "" {
		var queues map[string]engine.QueueOpts
		if err := json.Unmarshal([]byte(spec), &queues); err != nil {
			return fmt.Errorf("%s: %w", EnvWorkerQueues, err)
		}
		for name, opts := range queues {
			if err := e.RegisterQueue(name, opts); err != nil {
				return err
			}
		}
	}
	if err := e.Start(ctx); err != nil {
		return err
	}
	if spec := os.Getenv(EnvWorkerStarts); spec != "" {
		name, count, _ := strings.Cut(spec, ":")
		n, err := strconv.Atoi(count)
		if err != nil {
			return fmt.Errorf("%s=%q: want name:count", EnvWorkerStarts, spec)
		}
		var next atomic.Int64
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() {
				for next.Add(1) <= int64(n) {
					if _, err := e.StartJSON(ctx, name, []byte(`{}`), nil); err != nil {
						fmt.Fprintln(os.Stderr, "crashtest worker: starting a run:", err)
					}
				}
			})
		}
		wg.Wait()
	}
	time.Sleep(3 * time.Minute)
	return nil
}

// StartWorker starts a worker process on db with the given lease (0: the
// engine's default) and extra environment ("NAME=value"), which the
// workflows the worker registers may read. The worker dies with the test,
// or with this process.
func StartWorker(t testing.TB, db *enginetest.DB, lease time.Duration, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envWorker+"=1", envWorkerDB+"="+db.URL,
		envWorkerLease+"="+strconv.FormatInt(lease.Milliseconds(), 10))
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting worker process: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
	})
	return cmd
}

// Kill SIGKILLs a worker and waits for it to die.
func Kill(t testing.TB, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("killing worker: %v", err)
	}
	_, _ = cmd.Process.Wait()
}
