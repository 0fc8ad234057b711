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

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
)

// declineError is a user's error type, registered so it survives replay.
type declineError struct {
	Reason string `json:"reason"`
	Amount int    `json:"amount"`
}

func (e *declineError) Error() string { return "declined: " + e.Reason }

// unregisteredError is never registered: it degrades, the same way on
// every delivery.
type unregisteredError struct{ msg string }

func (e *unregisteredError) Error() string     { return e.msg }
func (e *unregisteredError) ErrorCode() string { return "unreg_code" }

var errOutOfStock = errors.New("out of stock")

var _ = func() error {
	if err := engine.RegisterError[*declineError]("test.declineError"); err != nil {
		panic(err)
	}
	return engine.RegisterSentinel("test.ErrOutOfStock", errOutOfStock)
}()

// branchOf is what a workflow decides from a step's error: every answer
// errors.As and errors.Is give.
func branchOf(err error) string {
	var de *declineError
	var ue *unregisteredError
	var ae *engine.ApplicationError
	var se *engine.StepError
	b := fmt.Sprintf("step=%v decline=%v", errors.As(err, &se), errors.As(err, &de))
	if de != nil {
		b += fmt.Sprintf("(%s,%d)", de.Reason, de.Amount)
	}
	b += fmt.Sprintf(" oos=%v deadline=%v canceled=%v timeout=%v exhausted=%v unregistered=%v",
		errors.Is(err, errOutOfStock), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.Is(err, engine.ErrTimeout), errors.Is(err, engine.ErrRetriesExhausted), errors.As(err, &ue))
	if errors.As(err, &ae) {
		b += fmt.Sprintf(" app(type=%s code=%s)", ae.Type, ae.Code)
	}
	return b
}

// A workflow that branches on errors.As and errors.Is takes the same branch
// on its first delivery and after a redelivery: each branch is recorded as
// a step named after it, so a different branch would park the run as
// non-deterministic. Before errors were recorded as values, a replayed
// error was errors.New(message) and every branch but the message changed.
func TestRecordedErrorsKeepTheirIdentityOnReplay(t *testing.T) {
	t.Parallel()
	failures := []func() error{
		func() error {
			return engine.Permanent(fmt.Errorf("charging: %w", &declineError{Reason: "insufficient_funds", Amount: 4999}))
		},
		func() error { return engine.Permanent(fmt.Errorf("reserving: %w", errOutOfStock)) },
		func() error { return engine.Permanent(fmt.Errorf("calling: %w", context.DeadlineExceeded)) },
		func() error { return engine.Permanent(&unregisteredError{msg: "mystery"}) },
		func() error {
			return engine.Permanent(errors.Join(context.Canceled, &declineError{Reason: "joined"}))
		},
		func() error {
			return engine.Permanent(engine.NewApplicationError("card_expired", "expired", map[string]int{"year": 2020}, nil))
		},
	}
	var mu sync.Mutex
	branches := map[int][]string{} // delivery → branches taken
	var deliveries, flaky atomic.Int32
	wf := engine.Define("branchy", func(ctx *engine.Context, _ int) ([]string, error) {
		d := int(deliveries.Add(1))
		var taken []string
		for i, fail := range failures {
			_, err := engine.Step(ctx, fmt.Sprintf("s%d", i), func(context.Context) (int, error) { return 0, fail() }, nil)
			b := branchOf(err)
			taken = append(taken, b)
			if _, err := engine.Step(ctx, b, func(context.Context) (int, error) { return i, nil }, nil); err != nil {
				return nil, err
			}
		}
		mu.Lock()
		branches[d] = taken
		mu.Unlock()
		// The first delivery ends here: the retry waits longer than
		// MaxInlineBackoff, so a second delivery replays everything above.
		if _, err := engine.Step(ctx, "flaky", func(context.Context) (int, error) {
			if flaky.Add(1) == 1 {
				return 0, engine.RetryAfter(errors.New("later"), 1100*time.Millisecond)
			}
			return 1, nil
		}, nil); err != nil {
			return nil, err
		}
		return taken, nil
	}, nil)
	b := setup(t, &engine.Config{SweepInterval: 50 * time.Millisecond}, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err, "the run replays without non-determinism")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, branches, 2, "two deliveries ran the workflow")
	require.Equal(t, branches[1], branches[2], "the same branches live and on replay")
	require.Equal(t, branches[1], out)
	require.Equal(t, []string{
		"step=true decline=true(insufficient_funds,4999) oos=false deadline=false canceled=false timeout=false exhausted=false unregistered=false app(type=*fmt.wrapError code=)",
		"step=true decline=false oos=true deadline=false canceled=false timeout=false exhausted=false unregistered=false app(type=*fmt.wrapError code=)",
		"step=true decline=false oos=false deadline=true canceled=false timeout=false exhausted=false unregistered=false app(type=*fmt.wrapError code=)",
		"step=true decline=false oos=false deadline=false canceled=false timeout=false exhausted=false unregistered=false app(type=*engine_test.unregisteredError code=unreg_code)",
		"step=true decline=true(joined,0) oos=false deadline=false canceled=true timeout=false exhausted=false unregistered=false app(type=*errors.joinError code=)",
		"step=true decline=false oos=false deadline=false canceled=false timeout=false exhausted=false unregistered=false app(type= code=card_expired)",
	}, out)

	// The record keeps the unregistered error's type name and message, and
	// an ApplicationError's details.
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, "*engine_test.unregisteredError", run.Steps[6].Error.Type)
	require.Equal(t, "mystery", run.Steps[6].Error.Message)
	var se *engine.StepError
	last := run.Steps[10].Error.Err()
	require.False(t, errors.As(last, &se), "a step's own record is its error, not a StepError")
	var ae *engine.ApplicationError
	require.True(t, errors.As(last, &ae))
	require.JSONEq(t, `{"year": 2020}`, string(ae.Details))
}

// Wait returns a *RunError that wraps the run's error as the workflow saw
// it: errors.As finds the StepError and the registered type in its chain.
func TestRunErrorWrapsTheRecordedError(t *testing.T) {
	t.Parallel()
	wf := engine.Define("declined", func(ctx *engine.Context, _ int) (int, error) {
		return engine.Step(ctx, "charge", func(context.Context) (int, error) {
			return 0, engine.Permanent(&declineError{Reason: "stolen_card", Amount: 12})
		}, nil)
	}, nil)
	panics := engine.Define("panics", func(ctx *engine.Context, _ int) (int, error) {
		var m map[string]int
		return m["boom"], errors.New(string(rune(1 / len(m)))) // divides by zero
	}, nil)
	b := setup(t, nil, wf, panics)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	_, err = wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	var runErr *engine.RunError
	require.ErrorAs(t, err, &runErr)
	require.Equal(t, engine.StatusFailed, runErr.Status)
	var se *engine.StepError
	require.ErrorAs(t, err, &se)
	require.Equal(t, "charge", se.Step)
	var de *declineError
	require.ErrorAs(t, err, &de)
	require.Equal(t, declineError{Reason: "stolen_card", Amount: 12}, *de)

	res, err = panics.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	_, err = panics.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	var pe *engine.PanicError
	require.ErrorAs(t, err, &pe)
	require.Contains(t, pe.Value, "divide by zero")
}

// A recorded error that cannot all be stored (details over the limit, a
// chain deeper than 16) is kept short, never refused.
func TestRecordedErrorsAreBounded(t *testing.T) {
	t.Parallel()
	wf := engine.Define("bounded", func(ctx *engine.Context, _ int) (string, error) {
		_, err := engine.Step(ctx, "deep", func(context.Context) (int, error) {
			var err error = &declineError{Reason: strings.Repeat("x", 40<<10)}
			for i := range 100 {
				err = fmt.Errorf("layer %d: %w", i, err)
			}
			return 0, engine.Permanent(err)
		}, nil)
		return "", err
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	waitStatus(t, b.engine, res.RunID, engine.StatusFailed, 10*time.Second)
	var size int
	require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT octet_length(error::text) FROM pgdurable.workflow_steps WHERE run_id = $1`), res.RunID).Scan(&size))
	require.Less(t, size, 64<<10)
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	depth := 0
	for n := run.Steps[0].Error; n != nil; n = n.Cause {
		depth++
	}
	require.Equal(t, 16, depth)
	raw, err := json.Marshal(run.Steps[0].Error)
	require.NoError(t, err)
	require.Less(t, len(raw), 64<<10)
}
