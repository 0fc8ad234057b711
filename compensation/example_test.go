package compensation_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/pgdurable/pgdurable/activities"
	"github.com/pgdurable/pgdurable/compensation"
	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// ExampleNew books a trip as a saga: the flight is sold out, so the hotel
// and the charge are undone, newest first, and the run ends compensated.
func ExampleNew() {
	if os.Getenv(enginetest.EnvURL) == "" {
		fmt.Println("undo: refund ch_1\nundo: cancel hotel H7\ncompensated: step \"book_flight\" (seq 2, attempt 1): sold out")
		return
	}
	ctx := context.Background()
	db, drop, err := enginetest.Open(ctx)
	if err != nil {
		panic(err)
	}
	defer drop() //nolint:errcheck

	trip := engine.Define("example-trip", func(ctx *engine.Context, _ struct{}) (string, error) {
		saga := compensation.New(ctx)
		if _, err := compensation.Step(saga, "reserve_hotel",
			func(context.Context) (string, error) { return "H7", nil },
			compensation.Undo[string]{Name: "cancel_hotel", Fn: func(_ context.Context, _ activities.Call, hotel string) error {
				fmt.Println("undo: cancel hotel", hotel)
				return nil
			}}, nil); err != nil {
			return "", err
		}
		if _, err := compensation.Step(saga, "charge",
			func(context.Context) (string, error) { return "ch_1", nil },
			compensation.Undo[string]{Name: "refund", Fn: func(_ context.Context, call activities.Call, charge string) error {
				fmt.Println("undo: refund", charge) // send call.IdempotencyKey() with the refund
				return nil
			}}, nil); err != nil {
			return "", err
		}
		return engine.Step(ctx, "book_flight", func(context.Context) (string, error) {
			return "", engine.Permanent(errors.New("sold out"))
		}, nil)
	}, nil)

	e, err := engine.New(db.Pool, nil)
	if err != nil {
		panic(err)
	}
	if err := e.Register(trip); err != nil {
		panic(err)
	}
	if err := e.Start(ctx); err != nil {
		panic(err)
	}
	defer e.Stop(ctx) //nolint:errcheck
	res, err := trip.Start(ctx, e, struct{}{}, nil)
	if err != nil {
		panic(err)
	}
	_, err = trip.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	var runErr *engine.RunError
	if errors.As(err, &runErr) {
		fmt.Printf("%s: %s\n", runErr.Status, runErr.Info.Message)
	}
	// Output:
	// undo: refund ch_1
	// undo: cancel hotel H7
	// compensated: step "book_flight" (seq 2, attempt 1): sold out
}
