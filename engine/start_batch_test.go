package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// Concurrent starts share multi-row inserts; an input PostgreSQL refuses
// fails its own start only, with ErrInvalidInput, and leaves no run.
func TestConcurrentStartsShareInsertsAndFailAlone(t *testing.T) {
	t.Parallel()
	wf := engine.Define("batched-start", func(ctx *engine.Context, in json.RawMessage) (int, error) { return 1, nil }, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	const n = 200
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			input := fmt.Sprintf(`{"i": %d}`, i)
			if i == 77 {
				input = `{"i": 1e1000000}` // valid JSON, beyond jsonb's numeric range
			}
			_, errs[i] = b.engine.StartJSON(ctx, "batched-start", []byte(input), &engine.StartOpts{WorkflowID: fmt.Sprint("w", i)})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if i == 77 {
			require.ErrorIs(t, err, engine.ErrInvalidInput)
			require.ErrorContains(t, err, "numeric", "refused by PostgreSQL, in its batch")
			continue
		}
		require.NoError(t, err, "start %d", i)
	}
	var runs int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), b.db.SQL(`SELECT count(*) FROM pgdurable.workflow_runs`)).Scan(&runs))
	require.Equal(t, n-1, runs)
}

// Two processes whose callers start runs with overlapping workflow IDs (a
// client retrying an idempotent request) get every run back: their
// batches take the workflow-ID index in one order, so they never deadlock
// (before, about 290 of these 5,000 starts failed with 40P01).
func TestOverlappingStartBatchesOfTwoProcessesDoNotDeadlock(t *testing.T) {
	t.Parallel()
	wf := engine.Define("overlap", func(ctx *engine.Context, in int) (int, error) { return in, nil }, nil)
	db := enginetest.NewDB(t)
	engines := []*engine.Engine{newEngine(t, db, nil, false, wf), newEngine(t, db, nil, false, wf)}
	ctx := testCtx(t)
	var failed atomic.Int64
	var firstErr sync.Once
	for round := range 10 {
		var wg sync.WaitGroup
		for g := range 100 {
			wg.Go(func() {
				for i := range 5 {
					id := fmt.Sprint(round, "-", (g*7+i*13)%40)
					if _, err := wf.Start(ctx, engines[g%2], 7, &engine.StartOpts{WorkflowID: id}); err != nil {
						failed.Add(1)
						firstErr.Do(func() { t.Log(err) })
					}
				}
			})
		}
		wg.Wait()
	}
	require.Zero(t, failed.Load(), "of 5,000 starts")
	var runs int
	require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT count(*) FROM pgdurable.workflow_runs`)).Scan(&runs))
	require.Equal(t, 400, runs)
}
