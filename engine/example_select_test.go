package engine_test

import (
	"fmt"
	"time"

	"github.com/pgdurable/pgdurable/engine"
)

// ExampleSelect waits for the first of a signal and a timer. The winner is
// recorded, so a replay takes the same branch whatever became ready
// since.
func ExampleSelect() {
	review := engine.Define("example-review", func(ctx *engine.Context, doc string) (string, error) {
		sel, err := engine.Select(ctx, "approval-or-timeout",
			engine.OnSignal("approve"), engine.OnTimer(48*time.Hour))
		if err != nil {
			return "", err
		}
		switch sel.Index {
		case 0:
			return doc + " approved with " + string(sel.Payload), nil
		default:
			return doc + " timed out", nil
		}
	}, nil)

	e, _, done := exampleEngine(nil, review)
	if e == nil {
		fmt.Println(`spec.md approved with {"by": "ann"}`)
		return
	}
	defer done()
	ctx, cancel := exampleCtx()
	defer cancel()
	res, err := review.Start(ctx, e, "spec.md", &engine.StartOpts{WorkflowID: "review-spec.md"})
	if err != nil {
		panic(err)
	}
	if err := e.Signal(ctx, "review-spec.md", "approve", map[string]string{"by": "ann"}, nil); err != nil {
		panic(err)
	}
	out, err := review.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	if err != nil {
		panic(err)
	}
	fmt.Println(out)
	// Output: spec.md approved with {"by": "ann"}
}
