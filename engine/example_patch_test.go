package engine_test

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine"
)

// ExamplePatched deploys a change under a run in flight: the order
// workflow gains a fraud check before its approval. The run that was
// already waiting for the approval passed that point on the old code, and
// replays it; a run started after the deploy takes the new code.
func ExamplePatched() {
	order := func(withFraudCheck bool) *engine.Workflow[string, string] {
		return engine.Define("example-deploy", func(ctx *engine.Context, id string) (string, error) {
			checked := "not checked"
			if withFraudCheck && engine.Patched(ctx, "fraud-check") {
				var err error
				if checked, err = engine.Step(ctx, "fraud_check", func(context.Context) (string, error) { return "checked", nil }, nil); err != nil {
					return "", err
				}
			}
			if _, err := engine.AwaitSignal[string](ctx, "approve", time.Hour); err != nil {
				return "", err
			}
			return id + ": " + checked, nil
		}, nil)
	}
	v1, v2 := order(false), order(true)

	e, _, done := exampleEngine(nil, v1)
	if e == nil {
		fmt.Println("order-1: not checked\norder-2: checked")
		return
	}
	ctx, cancel := exampleCtx()
	defer cancel()
	first, err := v1.Start(ctx, e, "order-1", nil)
	if err != nil {
		panic(err)
	}
	waitFor(ctx, e, first.RunID, engine.StatusWaiting)
	done() // the deploy: the old code's engine stops, the new one starts

	e, _, done = exampleEngine(nil, v2)
	defer done()
	second, err := v2.Start(ctx, e, "order-2", nil)
	if err != nil {
		panic(err)
	}
	for _, r := range []*engine.StartResult{first, second} {
		waitFor(ctx, e, r.RunID, engine.StatusWaiting)
		if err := e.Signal(ctx, r.RunID.String(), "approve", "ann", nil); err != nil {
			panic(err)
		}
		out, err := v2.Wait(ctx, e, r.RunID, 10*time.Millisecond)
		if err != nil {
			panic(err)
		}
		fmt.Println(out)
	}
	// Output:
	// order-1: not checked
	// order-2: checked
}

// waitFor polls run runID until it has status.
func waitFor(ctx context.Context, e *engine.Engine, runID uuid.UUID, status engine.RunStatus) {
	for {
		run, err := e.GetRun(ctx, runID)
		if err != nil {
			panic(err)
		}
		if run.Status == status {
			return
		}
		select {
		case <-ctx.Done():
			panic(ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
