package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
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
	return enginetest.NewEngine(t, db, cfg, start, wfs...)
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
		require.Equal(t, "completed", string(run.Steps[i].Status))
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

func TestConcurrentStartsWithOneWorkflowIDGiveOneRun(t *testing.T) {
	t.Parallel()
	var bodies atomic.Int64
	wf := engine.Define("provision", func(ctx *engine.Context, in order) (int, error) {
		return engine.Step(ctx, "charge", func(context.Context) (int, error) { bodies.Add(1); return in.Amount, nil }, nil)
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)

	const n = 20
	ids := make([]uuid.UUID, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			res, err := wf.Start(ctx, b.engine, order{ID: "42", Amount: 5}, &engine.StartOpts{WorkflowID: "order-42"})
			errs[i] = err
			if err == nil {
				ids[i] = res.RunID
			}
		})
	}
	close(start)
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i])
		require.Equal(t, ids[0], ids[i])
	}
	// The same ID with another input is a conflict, never a second run.
	_, err := wf.Start(ctx, b.engine, order{ID: "42", Amount: 6}, &engine.StartOpts{WorkflowID: "order-42"})
	require.ErrorIs(t, err, engine.ErrWorkflowIDConflict)

	out, err := wf.Wait(ctx, b.engine, ids[0], 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 5, out)
	var runs int
	require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL("SELECT count(*) FROM pgdurable.workflow_runs WHERE workflow_id = 'order-42'")).Scan(&runs))
	require.Equal(t, 1, runs)
	require.EqualValues(t, 1, bodies.Load())
}

func TestStartRejectsBadInput(t *testing.T) {
	t.Parallel()
	wf := engine.Define("typed", func(ctx *engine.Context, in order) (int, error) { return in.Amount, nil }, nil)
	b := setup(t, &engine.Config{MaxPayloadBytes: 1024}, wf)
	ctx := testCtx(t)

	_, err := b.engine.StartJSON(ctx, "nope", []byte(`{}`), nil)
	require.ErrorIs(t, err, engine.ErrUnknownWorkflow)
	_, err = b.engine.StartJSON(ctx, "typed", []byte(`{"amount": "ten"}`), nil)
	require.ErrorIs(t, err, engine.ErrInvalidInput)
	require.ErrorContains(t, err, "amount")
	_, err = b.engine.StartJSON(ctx, "typed", []byte(`{"amount": 1`), nil)
	require.ErrorIs(t, err, engine.ErrInvalidInput)
	big := fmt.Appendf(nil, `{"id": %q}`, strings.Repeat("a", 2000))
	_, err = b.engine.StartJSON(ctx, "typed", big, nil)
	require.ErrorIs(t, err, engine.ErrInvalidInput)
	require.ErrorContains(t, err, "limit")

	res, err := b.engine.StartJSON(ctx, "typed", []byte(`{"id": "x", "amount": 7}`), nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 7, out)
}

// An input that is not valid JSON is refused with where it breaks: the
// byte offset encoding/json reports (*json.SyntaxError's Offset, the bytes
// read when it failed), kept in the error chain. Before, the message said
// what broke but not where.
func TestStartSaysWhereAnInputIsNotJSON(t *testing.T) {
	t.Parallel()
	wf := engine.Define("where", func(ctx *engine.Context, in order) (int, error) { return in.Amount, nil }, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	for _, c := range []struct {
		input  string
		offset int64
	}{
		{`{"id": "a", "amount": x}`, 23},
		{`{"id": "a",, "amount": 1}`, 12},
		{`{"amount": 1`, 12}, // unexpected end of JSON input
	} {
		_, err := b.engine.StartJSON(ctx, "where", []byte(c.input), nil)
		require.ErrorIs(t, err, engine.ErrInvalidInput, c.input)
		require.ErrorContains(t, err, fmt.Sprintf("at byte offset %d", c.offset), c.input)
		var syntax *json.SyntaxError
		require.ErrorAs(t, err, &syntax, c.input)
		require.Equal(t, c.offset, syntax.Offset)
		_, err = b.engine.SignalWithStartJSON(ctx, engine.SignalWithStartJSONParams{Workflow: "where", Input: []byte(c.input), Opts: &engine.StartOpts{WorkflowID: "w"}, Signal: "s", Payload: []byte(`1`), SignalOpts: nil})
		require.ErrorIs(t, err, engine.ErrInvalidInput, c.input)
		require.ErrorContains(t, err, fmt.Sprintf("at byte offset %d", c.offset), c.input)
	}
	_, err := b.engine.SignalWithStartJSON(ctx, engine.SignalWithStartJSONParams{Workflow: "where", Input: []byte(`{}`), Opts: &engine.StartOpts{WorkflowID: "w"}, Signal: "s", Payload: []byte(`[1, 2`), SignalOpts: nil})
	require.ErrorIs(t, err, engine.ErrInvalidInput)
	require.ErrorContains(t, err, "signal payload is not valid JSON: unexpected end of JSON input at byte offset 5")
	require.ErrorContains(t, b.engine.SignalJSON(ctx, "w", "s", []byte(`{"a" 1}`), nil),
		`signal payload is not valid JSON: invalid character '1' after object key at byte offset 6`)
}

func TestPermanentErrorFailsRunAfterOneAttempt(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	wf := engine.Define("perm", func(ctx *engine.Context, in order) (int, error) {
		return engine.Step(ctx, "validate", func(context.Context) (int, error) {
			calls.Add(1)
			return 0, engine.Permanent(errors.New("card number is invalid"))
		}, nil)
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)

	res, err := wf.Start(ctx, b.engine, order{ID: "p"}, nil)
	require.NoError(t, err)
	_, err = wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	var runErr *engine.RunError
	require.ErrorAs(t, err, &runErr)
	require.Equal(t, engine.StatusFailed, runErr.Status)
	require.Equal(t, engine.ClassPermanent, runErr.Info.Class)
	require.Contains(t, runErr.Info.Message, "card number is invalid")
	require.EqualValues(t, 1, calls.Load())

	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Len(t, run.Steps, 1)
	require.Equal(t, "failed", string(run.Steps[0].Status))
	require.Equal(t, 1, run.Steps[0].Attempts)
	jobs, _, err := b.engine.ListDeadJobs(ctx, engine.ListDeadJobsParams{})
	require.NoError(t, err)
	require.Empty(t, jobs, "a permanent error with nothing to compensate fails the run; it is not dead")
}

func TestListRunsPaginates(t *testing.T) {
	t.Parallel()
	wf := engine.Define("noop", func(ctx *engine.Context, in int) (int, error) { return in, nil }, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	var started []uuid.UUID
	for i := range 5 {
		res, err := wf.Start(ctx, b.engine, i, nil)
		require.NoError(t, err)
		started = append(started, res.RunID)
	}
	var seen []uuid.UUID
	cursor := ""
	for {
		runs, next, err := b.engine.ListRuns(ctx, engine.ListRunsParams{Workflow: "noop", Limit: 2, Cursor: cursor})
		require.NoError(t, err)
		for _, r := range runs {
			seen = append(seen, r.RunID)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	require.Len(t, seen, 5)
	for i := range started {
		require.Equal(t, started[len(started)-1-i], seen[i], "newest first")
	}
	_, _, err := b.engine.ListRuns(ctx, engine.ListRunsParams{Cursor: "garbage"})
	require.ErrorContains(t, err, "invalid cursor")
	_, _, err = b.engine.ListRuns(ctx, engine.ListRunsParams{Status: "bogus"})
	require.ErrorContains(t, err, `unknown run status "bogus"`)
	done, _, err := b.engine.ListRuns(ctx, engine.ListRunsParams{Status: engine.StatusPending, Limit: 1000})
	require.NoError(t, err)
	require.LessOrEqual(t, len(done), 5)
}
