package engine_test

import (
	"context"
	"fmt"
	"time"

	"github.com/pgdurable/pgdurable/engine"
)

// ExampleGo asks three carriers for a quote at once: each is a step of its
// own, recorded as it finishes, and All returns the results in call order
// whatever order they finished in.
func ExampleGo() {
	type quote struct {
		Carrier string `json:"carrier"`
		Cents   int    `json:"cents"`
	}
	ship := engine.Define("example-ship", func(ctx *engine.Context, parcel string) ([]quote, error) {
		carriers := []string{"ups", "dhl", "fedex"}
		fs := make([]*engine.Future[quote], len(carriers))
		for i, c := range carriers {
			fs[i] = engine.Go(ctx, "quote_"+c, func(context.Context) (quote, error) {
				time.Sleep(time.Duration(len(carriers)-i) * 5 * time.Millisecond) // the last answers first
				return quote{Carrier: c, Cents: 900 + 100*len(c)}, nil
			}, nil)
		}
		return engine.All(ctx, fs)
	}, nil)

	e, _, done := exampleEngine(nil, ship)
	if e == nil {
		fmt.Println("ups: 1200\ndhl: 1200\nfedex: 1400\nbest: ups")
		return
	}
	defer done()
	ctx, cancel := exampleCtx()
	defer cancel()
	res, err := ship.Start(ctx, e, "parcel_1", nil)
	if err != nil {
		panic(err)
	}
	quotes, err := ship.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	if err != nil {
		panic(err)
	}
	best := quotes[0]
	for _, q := range quotes {
		fmt.Printf("%s: %d\n", q.Carrier, q.Cents)
		if q.Cents < best.Cents {
			best = q
		}
	}
	fmt.Println("best:", best.Carrier)
	// Output:
	// ups: 1200
	// dhl: 1200
	// fedex: 1400
	// best: ups
}
