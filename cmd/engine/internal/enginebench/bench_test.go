package enginebench_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgdurable/pgdurable/cmd/engine/internal/enginebench"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A small run produces every row with plausible values; the numbers that
// matter come from `engine bench` on a quiet machine. 300 workflows a row:
// with fewer, the commits of a row are mostly the pool's cold connections
// and the background's (River's leader, autovacuum), not the workflows'.
func TestBenchReportsEveryRow(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	rep, err := enginebench.Run(context.Background(), db.URL, enginebench.Options{Workflows: 300, LatencySamples: 10, WaitingRuns: 200})
	require.NoError(t, err)
	byName := map[string]enginebench.Row{}
	for _, r := range rep.Rows {
		byName[r.Name] = r
	}
	for _, name := range []string{"river no-op jobs", "river 3 rows in 3 transactions per job", "3-step no-op workflow, start included",
		"3-step workflow / hand-written River", "round trips per new step", "start to completion (3 steps), p50",
		"replay 1,000 recorded steps: claim + load", "round trips per replayed step",
		"3 tx steps inserting a row each, start included", "3 tx steps / hand-written River", "3 tx steps: commits",
		"start to completion (3 tx steps), p50", "river 3 rows in 3 transactions: round trips"} {
		require.Contains(t, byName, name)
	}
	require.Positive(t, byName["3-step no-op workflow, start included"].Value)
	require.InDelta(t, 1, byName["round trips per new step"].Value, 0.5)
	// Background sweeps share the pool: allow a stray round trip or two.
	require.Less(t, byName["round trips per replayed step"].Value, 0.01)
	require.Positive(t, byName["RSS with 200 waiting runs"].Value)
	require.Positive(t, byName["3 tx steps inserting a row each, start included"].Value)
	// The 3 tx steps share one transaction, which commits with their
	// records (a step whose first statement is new on its connection
	// commits the ones before it first: a small row starts cold); the
	// start and end share group commits, and a small row carries the
	// engine's own start and stop. Round trips: the first statement with
	// BEGIN, each next one with its savepoint, the records with COMMIT.
	t.Logf("3 tx steps: %.2f commits/workflow, %.1f round trips one at a time",
		byName["3 tx steps: commits"].Value, byName["3 tx steps one at a time: round trips"].Value)
	require.GreaterOrEqual(t, byName["3 tx steps: commits"].Value, 1.0)
	require.Less(t, byName["3 tx steps: commits"].Value, 3.0)
	require.InDelta(t, 6, byName["3 tx steps one at a time: round trips"].Value, 1.5)
	// Linux: where each row's CPU went, this process's and PostgreSQL's.
	for _, name := range []string{"river 3 rows in 3 transactions", "3 tx steps", "3-step no-op workflow, start included"} {
		require.Positive(t, byName[name+": engine CPU"].Value, name)
		require.Contains(t, byName, name+": PostgreSQL CPU")
	}
	require.Positive(t, byName["pinned v2 / plain 3-step workflow"].Value)
	require.Positive(t, byName["patched v2 / plain 3-step workflow"].Value)
	require.Positive(t, byName["3-step workflow as v2 beside v1, patched, start included"].Value)
}
