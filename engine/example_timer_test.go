package engine_test

import (
	"fmt"
	"time"

	"github.com/pgdurable/pgdurable/engine"
)

// ExampleSleepUntil waits for a time on the engine's clock. The wake time
// is recorded, so a crash or a deploy does not restart the wait; a wait
// longer than Config.MaxInlineBackoff ends the delivery and holds nothing
// until it is due. Now is recorded too: a replay sees the same value.
func ExampleSleepUntil() {
	remind := engine.Define("example-remind", func(ctx *engine.Context, at time.Time) (string, error) {
		if err := engine.SleepUntil(ctx, at); err != nil {
			return "", err
		}
		now, err := engine.Now(ctx)
		if err != nil {
			return "", err
		}
		if now.Before(at) {
			return "woke early", nil
		}
		return "reminded on time", nil
	}, nil)

	e, _, done := exampleEngine(nil, remind)
	if e == nil {
		fmt.Println("reminded on time\nsteps: sleep (sleep), now (step)")
		return
	}
	defer done()
	ctx, cancel := exampleCtx()
	defer cancel()
	res, err := remind.Start(ctx, e, time.Now().Add(50*time.Millisecond), nil)
	if err != nil {
		panic(err)
	}
	out, err := remind.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	if err != nil {
		panic(err)
	}
	fmt.Println(out)
	run, err := e.GetRun(ctx, res.RunID)
	if err != nil {
		panic(err)
	}
	fmt.Printf("steps: %s (%s), %s (%s)\n", run.Steps[0].Name, run.Steps[0].Kind, run.Steps[1].Name, run.Steps[1].Kind)
	// Output:
	// reminded on time
	// steps: sleep (sleep), now (step)
}
