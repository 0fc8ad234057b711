package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
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
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM workflow_runs`).Scan(&runs))
	require.Equal(t, n-1, runs)
}
