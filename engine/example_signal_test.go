package engine_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/pgdurable/pgdurable/engine"
)

// ExampleEngine_Signal sends a signal, by workflow ID, to a run waiting
// for it. With an idempotency key, a retried send (a lost response) is
// accepted and not delivered twice.
func ExampleEngine_Signal() {
	type approval struct {
		By string `json:"by"`
	}
	expense := engine.Define("example-expense", func(ctx *engine.Context, amount int) (string, error) {
		a, err := engine.AwaitSignal[approval](ctx, "approve", 72*time.Hour)
		if errors.Is(err, engine.ErrTimeout) {
			return "expired", nil
		}
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%d approved by %s", amount, a.By), nil
	}, nil)

	e, _, done := exampleEngine(nil, expense)
	if e == nil {
		fmt.Println("120 approved by ann\nsignals stored: 1")
		return
	}
	defer done()
	ctx, cancel := exampleCtx()
	defer cancel()
	res, err := expense.Start(ctx, e, 120, &engine.StartOpts{WorkflowID: "expense-120"})
	if err != nil {
		panic(err)
	}
	for range 2 { // the second send is a client's retry
		if err := e.Signal(ctx, "expense-120", "approve", approval{By: "ann"}, &engine.SignalOpts{Key: "approve-1"}); err != nil {
			panic(err)
		}
	}
	out, err := expense.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	if err != nil {
		panic(err)
	}
	fmt.Println(out)
	run, err := e.GetRun(ctx, res.RunID)
	if err != nil {
		panic(err)
	}
	fmt.Println("signals stored:", len(run.Signals))
	// Output:
	// 120 approved by ann
	// signals stored: 1
}
