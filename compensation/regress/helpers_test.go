package regress_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/internal/crashtest"
)

func TestMain(m *testing.M) {
	crashtest.RunWorkerIfChild(childWorkflows)
	os.Exit(m.Run())
}

func newEngine(t *testing.T, db *enginetest.DB, cfg *engine.Config, regs ...engine.Registration) *engine.Engine {
	t.Helper()
	return newEngineOn(t, db.Pool, cfg, regs...)
}

func newEngineOn(t *testing.T, pool *pgxpool.Pool, cfg *engine.Config, regs ...engine.Registration) *engine.Engine {
	t.Helper()
	e, err := engine.New(pool, cfg)
	require.NoError(t, err)
	require.NoError(t, e.Register(regs...))
	require.NoError(t, e.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.StopAndCancel(ctx)
	})
	return e
}

func waitStatus(t *testing.T, e *engine.Engine, runID uuid.UUID, d time.Duration, statuses ...engine.RunStatus) *engine.Run {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		run, err := e.GetRun(context.Background(), runID)
		require.NoError(t, err)
		for _, s := range statuses {
			if run.Status == s {
				return run
			}
		}
		if time.Now().After(deadline) {
			return run
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func createEvents(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
		CREATE TABLE IF NOT EXISTS events (id bigserial PRIMARY KEY, run_id uuid, name text NOT NULL, key text);
		CREATE TABLE IF NOT EXISTS biz (id bigserial PRIMARY KEY, run_id uuid, name text NOT NULL)`)
	require.NoError(t, err)
}

func logEvent(ctx context.Context, pool *pgxpool.Pool, runID uuid.UUID, name, key string) error {
	_, err := pool.Exec(context.WithoutCancel(ctx), `INSERT INTO events (run_id, name, key) VALUES ($1, $2, $3)`, runID, name, key)
	return err
}

func events(t *testing.T, pool *pgxpool.Pool, runID uuid.UUID) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT name FROM events WHERE run_id = $1 ORDER BY id`, runID)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

func dumpRun(t *testing.T, run *engine.Run) {
	t.Helper()
	t.Logf("run status=%s error=%+v", run.Status, run.Error)
	for _, s := range run.Steps {
		t.Logf("  seq=%d %s:%s status=%s attempts=%d comp=%v compOf=%v err=%+v", s.Seq, s.Kind, s.Name, s.Status, s.Attempts, deref(s.Compensation), s.CompensationOf, s.Error)
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
