package engine_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgdurable/pgdurable/engine"
)

// ExampleStep runs a step that fails twice: the engine retries it with
// backoff, records its result once it succeeds, and a replay returns that
// record without calling the function again.
func ExampleStep() {
	calls := 0
	quote := engine.Define("example-quote", func(ctx *engine.Context, sku string) (int, error) {
		return engine.Step(ctx, "price", func(context.Context) (int, error) {
			calls++
			if calls < 3 {
				return 0, errors.New("pricing service unavailable") // retried
			}
			return 1250, nil
		}, &engine.StepOpts{RetryPolicy: fastRetries})
	}, nil)

	e, _, done := exampleEngine(nil, quote)
	if e == nil {
		fmt.Println("price 1250 after 3 calls")
		return
	}
	defer done()
	ctx, cancel := exampleCtx()
	defer cancel()
	res, err := quote.Start(ctx, e, "sku_tee", nil)
	if err != nil {
		panic(err)
	}
	price, err := quote.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	if err != nil {
		panic(err)
	}
	fmt.Printf("price %d after %d calls\n", price, calls)
	// Output: price 1250 after 3 calls
}

// ExamplePermanent ends a step at once: a permanent error is recorded and
// returned to the workflow without another attempt, and the run's caller
// finds the step's error in the run's error chain.
func ExamplePermanent() {
	validate := engine.Define("example-validate", func(ctx *engine.Context, amount int) (int, error) {
		return engine.Step(ctx, "validate", func(context.Context) (int, error) {
			if amount <= 0 {
				return 0, engine.Permanent(fmt.Errorf("amount %d must be positive", amount))
			}
			return amount, nil
		}, nil)
	}, nil)

	e, _, done := exampleEngine(nil, validate)
	if e == nil {
		fmt.Println("run failed in step validate after 1 attempt: amount -5 must be positive")
		return
	}
	defer done()
	ctx, cancel := exampleCtx()
	defer cancel()
	res, err := validate.Start(ctx, e, -5, nil)
	if err != nil {
		panic(err)
	}
	_, err = validate.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	var runErr *engine.RunError
	var stepErr *engine.StepError
	if errors.As(err, &runErr) && errors.As(err, &stepErr) {
		fmt.Printf("run %s in step %s after %d attempt: %s\n", runErr.Status, stepErr.Step, stepErr.Attempt, stepErr.Message)
	}
	// Output: run failed in step validate after 1 attempt: amount -5 must be positive
}
