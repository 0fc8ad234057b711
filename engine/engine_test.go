package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

type bundle struct {
	db     *enginetest.DB
	engine *engine.Engine
}

// setup returns an engine on a fresh database with wfs registered, started
// unless cfg says otherwise, and stopped when the test ends.
func setup(t *testing.T, cfg *engine.Config, wfs ...engine.Registration) *bundle {
	t.Helper()
	db := enginetest.NewDB(t)
	return &bundle{db: db, engine: newEngine(t, db, cfg, true, wfs...)}
}

func newEngine(t *testing.T, db *enginetest.DB, cfg *engine.Config, start bool, wfs ...engine.Registration) *engine.Engine {
	t.Helper()
	if cfg == nil {
		cfg = &engine.Config{}
	}
	e, err := engine.New(db.Pool, cfg)
	require.NoError(t, err)
	require.NoError(t, e.Register(wfs...))
	if start {
		require.NoError(t, e.Start(context.Background()))
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			require.NoError(t, e.StopAndCancel(ctx))
		})
	}
	return e
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

type order struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

// counters counts step invocations per name, in memory.
type counters struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counters) inc(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[name]++
}

func (c *counters) get(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[name]
}

func TestThreeStepWorkflowCompletes(t *testing.T) {
	t.Parallel()
	var calls counters
	wf := engine.Define("three", func(ctx *engine.Context, in order) (string, error) {
		a, err := engine.Step(ctx, "a", func(context.Context) (int, error) { calls.inc("a"); return in.Amount * 2, nil }, nil)
		if err != nil {
			return "", err
		}
		b, err := engine.Step(ctx, "b", func(context.Context) (string, error) { calls.inc("b"); return fmt.Sprint(a), nil }, nil)
		if err != nil {
			return "", err
		}
		return engine.Step(ctx, "c", func(context.Context) (string, error) { calls.inc("c"); return in.ID + ":" + b, nil }, nil)
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)

	res, err := wf.Start(ctx, b.engine, order{ID: "o1", Amount: 21}, &engine.StartOpts{WorkflowID: "order-o1"})
	require.NoError(t, err)
	require.False(t, res.Existing)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "o1:42", out)

	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, run.Status)
	require.Len(t, run.Steps, 3)
	for i, name := range []string{"a", "b", "c"} {
		require.Equal(t, name, run.Steps[i].Name)
		require.Equal(t, "completed", run.Steps[i].Status)
		require.Equal(t, 1, run.Steps[i].Attempts)
		require.Equal(t, 1, calls.get(name))
	}

	// Same ID, same input: the existing run. Other input: a conflict.
	again, err := wf.Start(ctx, b.engine, order{ID: "o1", Amount: 21}, &engine.StartOpts{WorkflowID: "order-o1"})
	require.NoError(t, err)
	require.True(t, again.Existing)
	require.Equal(t, res.RunID, again.RunID)
	_, err = wf.Start(ctx, b.engine, order{ID: "o1", Amount: 22}, &engine.StartOpts{WorkflowID: "order-o1"})
	require.ErrorIs(t, err, engine.ErrWorkflowIDConflict)
}

var _ = errors.New
var _ = atomic.Int64{}
var _ = uuid.Nil
