package engine_test

import (
	"fmt"
	"time"

	"github.com/pgdurable/pgdurable/engine"
)

// ExampleEngine_ListRuns labels runs with tags at their start and lists
// them by tag and status, as engine runs list --tag and the web UI do;
// Terminate ends a run at once, without compensations, with who and why
// in its error.
func ExampleEngine_ListRuns() {
	job := engine.Define("example-job", func(ctx *engine.Context, n int) (int, error) {
		if n < 0 {
			return engine.AwaitSignal[int](ctx, "never", 0) // stuck: an operator terminates it
		}
		return n * 2, nil
	}, nil)

	e, _, done := exampleEngine(nil, job)
	if e == nil {
		fmt.Println("completed for c_42: 1\nterminated: terminated by ann: stuck on bug 42")
		return
	}
	defer done()
	ctx, cancel := exampleCtx()
	defer cancel()
	for i, customer := range []string{"c_42", "c_7", "c_42"} {
		n := 1
		if i == 2 {
			n = -1
		}
		res, err := job.Start(ctx, e, n, &engine.StartOpts{Tags: map[string]string{"customer": customer}})
		if err != nil {
			panic(err)
		}
		if n > 0 {
			if _, err := job.Wait(ctx, e, res.RunID, 10*time.Millisecond); err != nil {
				panic(err)
			}
			continue
		}
		waitForStatus(ctx, e, res.RunID.String(), engine.StatusWaiting)
		if err := e.Terminate(ctx, res.RunID, &engine.TerminateOpts{Reason: "stuck on bug 42", By: "ann"}); err != nil {
			panic(err)
		}
	}
	tagged := map[string]string{"customer": "c_42"}
	completed, _, err := e.ListRuns(ctx, engine.ListRunsParams{Workflow: "example-job", Tags: tagged, Status: engine.StatusCompleted})
	if err != nil {
		panic(err)
	}
	fmt.Println("completed for c_42:", len(completed))
	terminated, _, err := e.ListRuns(ctx, engine.ListRunsParams{Workflow: "example-job", Tags: tagged, Status: engine.StatusTerminated})
	if err != nil {
		panic(err)
	}
	fmt.Println("terminated:", terminated[0].Error.Message)
	// Output:
	// completed for c_42: 1
	// terminated: terminated by ann: stuck on bug 42
}
