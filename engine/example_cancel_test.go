package engine_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgdurable/pgdurable/engine"
)

// ExampleEngine_Cancel cancels a run that waits for an approval: the run
// wakes at once, runs the undo of the step it completed, and ends
// cancelled, its error holding engine.ErrCancelled.
func ExampleEngine_Cancel() {
	undone := make(chan string, 1)
	hold := engine.Define("example-hold", func(ctx *engine.Context, order string) (string, error) {
		if _, err := engine.Step(ctx, "hold_funds", func(context.Context) (string, error) { return "hold_" + order, nil }, nil); err != nil {
			return "", err
		}
		if err := ctx.Compensate(engine.Undo{Name: "release_funds", Fn: func(context.Context, *engine.ActivityAttempt) error {
			undone <- "released hold_" + order
			return nil
		}}); err != nil {
			return "", err
		}
		return engine.AwaitSignal[string](ctx, "approve", 0) // waits, holding nothing
	}, nil)

	e, _, done := exampleEngine(nil, hold)
	if e == nil {
		fmt.Println("released hold_ord_9\ncancelled: true")
		return
	}
	defer done()
	ctx, cancel := exampleCtx()
	defer cancel()
	res, err := hold.Start(ctx, e, "ord_9", nil)
	if err != nil {
		panic(err)
	}
	waitForStatus(ctx, e, res.RunID.String(), engine.StatusWaiting)
	if err := e.Cancel(ctx, res.RunID); err != nil {
		panic(err)
	}
	_, err = hold.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	fmt.Println(<-undone)
	var runErr *engine.RunError
	if errors.As(err, &runErr) {
		fmt.Printf("%s: %v\n", runErr.Status, errors.Is(err, engine.ErrCancelled))
	}
	// Output:
	// released hold_ord_9
	// cancelled: true
}

// waitForStatus polls a run (by run or workflow ID) until it has status.
func waitForStatus(ctx context.Context, e *engine.Engine, id string, status engine.RunStatus) {
	for {
		runID, err := e.FindRun(ctx, id)
		if err == nil {
			if run, err := e.GetRun(ctx, runID); err == nil && run.Status == status {
				return
			}
		}
		select {
		case <-ctx.Done():
			panic(fmt.Sprintf("run %s never became %s", id, status))
		case <-time.After(5 * time.Millisecond):
		}
	}
}
