package webui_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/internal/crashtest"
)

// envHang makes the courier's activity hang, in the worker process a test
// kills mid-attempt.
const envHang = "PGDURABLE_WEBUI_TEST_HANG"

func TestMain(m *testing.M) {
	crashtest.RunWorkerIfChild(func(*pgxpool.Pool) []engine.Registration { return []engine.Registration{courier()} })
	os.Exit(m.Run())
}

// courier is a workflow whose activity (announced before each attempt)
// hangs in a process started with envHang set, and returns at once
// elsewhere.
func courier() *engine.Workflow[struct{}, string] {
	return engine.Define("courier", func(ctx *engine.Context, _ struct{}) (string, error) {
		return engine.RunActivity(ctx, "pickup", func(context.Context, *engine.ActivityAttempt) (string, error) {
			if os.Getenv(envHang) == "1" {
				select {}
			}
			return "picked up", nil
		}, nil)
	}, nil)
}

// lostWorkerRun has a worker process start a courier run and die
// (SIGKILL) inside the activity's first attempt; the fixture's engine
// takes the run over once the lease expires, records that attempt as
// lost (worker_lost) and completes the run with attempt 2. It returns the
// run's ID.
func (f *fixture) lostWorkerRun(t *testing.T) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	worker := crashtest.StartWorker(t, f.db, time.Second, envHang+"=1", crashtest.EnvWorkerStarts+"=courier:1")
	var id uuid.UUID
	for deadline := time.Now().Add(30 * time.Second); ; {
		runs, _, err := f.e.ListRuns(ctx, engine.ListRunsParams{Workflow: "courier"})
		require.NoError(t, err)
		if len(runs) == 1 {
			run, err := f.e.GetRun(ctx, runs[0].RunID)
			require.NoError(t, err)
			if len(run.Steps) == 1 && run.Steps[0].Status == engine.StepStarted && run.Steps[0].Attempts == 1 {
				id = run.RunID
				break
			}
		}
		require.True(t, time.Now().Before(deadline), "the worker never announced the courier's first attempt")
		time.Sleep(20 * time.Millisecond)
	}
	crashtest.Kill(t, worker)
	waitStatus(t, f.e, id, engine.StatusCompleted)
	return id
}
