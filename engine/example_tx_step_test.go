package engine_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdurable/pgdurable/engine"
)

// ExampleTxStep reserves stock in the step's own transaction, which
// commits with the step's record: the row changes exactly once, and a
// permanent error rolls the transaction back.
func ExampleTxStep() {
	reserve := engine.Define("example-reserve", func(ctx *engine.Context, qty int) (int, error) {
		return engine.TxStep(ctx, "reserve", func(ctx context.Context, tx pgx.Tx) (int, error) {
			tag, err := tx.Exec(ctx, `UPDATE example_stock SET reserved = reserved + $1 WHERE sku = 'sku_mug' AND stock - reserved >= $1`, qty)
			if err != nil {
				return 0, err // rolled back, retried
			}
			if tag.RowsAffected() == 0 {
				return 0, engine.Permanent(errors.New("out of stock")) // rolled back, recorded, not retried
			}
			return qty, nil
		}, nil)
	}, nil)

	e, pool, done := exampleEngine(nil, reserve)
	if e == nil {
		fmt.Println("reserved 2\nreserved 1\nout of stock\nsku_mug: 3 reserved of 3")
		return
	}
	defer done()
	ctx, cancel := exampleCtx()
	defer cancel()
	if _, err := pool.Exec(ctx, `CREATE TABLE example_stock (sku text PRIMARY KEY, stock int, reserved int);
		INSERT INTO example_stock VALUES ('sku_mug', 3, 0)`); err != nil {
		panic(err)
	}
	for _, qty := range []int{2, 1, 1} {
		res, err := reserve.Start(ctx, e, qty, nil)
		if err != nil {
			panic(err)
		}
		n, err := reserve.Wait(ctx, e, res.RunID, 10*time.Millisecond)
		var stepErr *engine.StepError
		switch {
		case errors.As(err, &stepErr):
			fmt.Println(stepErr.Message)
		case err != nil:
			panic(err)
		default:
			fmt.Println("reserved", n)
		}
	}
	var stock, reserved int
	if err := pool.QueryRow(ctx, `SELECT stock, reserved FROM example_stock`).Scan(&stock, &reserved); err != nil {
		panic(err)
	}
	fmt.Printf("sku_mug: %d reserved of %d\n", reserved, stock)
	// Output:
	// reserved 2
	// reserved 1
	// out of stock
	// sku_mug: 3 reserved of 3
}
