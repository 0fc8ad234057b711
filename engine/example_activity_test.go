package engine_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine"
)

// ExampleRunActivity calls an outside service with a request ID that is
// stored before the first attempt and sent on every retry: the service
// (here a map standing for a payment API with idempotency keys) charges
// once, however often the call is tried.
func ExampleRunActivity() {
	charges := map[uuid.UUID]string{} // the payment API's idempotency store
	attempts := 0
	charge := func(ctx context.Context, a *engine.ActivityAttempt) (string, error) {
		attempts++
		if _, seen := charges[a.RequestID]; !seen {
			charges[a.RequestID] = fmt.Sprintf("ch_%d", len(charges)+1)
		}
		if a.Attempt == 1 {
			return "", errors.New("connection reset after the charge") // the answer is lost
		}
		return charges[a.RequestID], nil
	}
	pay := engine.Define("example-pay", func(ctx *engine.Context, amount int) (string, error) {
		return engine.RunActivity(ctx, "charge", charge, &engine.ActivityOpts{RetryPolicy: fastRetries})
	}, nil)

	e, _, done := exampleEngine(nil, pay)
	if e == nil {
		fmt.Println("ch_1 after 2 attempts; 1 charge made")
		return
	}
	defer done()
	ctx, cancel := exampleCtx()
	defer cancel()
	res, err := pay.Start(ctx, e, 4999, nil)
	if err != nil {
		panic(err)
	}
	id, err := pay.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s after %d attempts; %d charge made\n", id, attempts, len(charges))
	// Output: ch_1 after 2 attempts; 1 charge made
}
