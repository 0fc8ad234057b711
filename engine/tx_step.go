package engine

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// TxStep runs fn in a transaction on the engine's database and records the
// step in that same transaction: fn's writes and the record commit together
// or not at all, so a tx step takes effect exactly once, however often the
// run is delivered. On replay the recorded result returns and fn does not
// run.
//
// The record's write is fenced by the run's lease: if another delivery took
// the run over while fn ran, the transaction rolls back and this delivery
// stops (ErrLeaseLost). fn must use tx for every write that belongs to the
// step and must not commit or roll it back. Errors follow Step's rules:
// fn's error rolls back and is retried unless Permanent; serialization
// failures and deadlocks are transient.
//
// Cost: one transaction (BEGIN, fn's statements, the fenced record, COMMIT).
func TxStep[T any](ctx *Context, name string, fn func(ctx context.Context, tx pgx.Tx) (T, error), opts *StepOpts) (T, error) {
	raw, err := ctx.runStep(&stepCall{name: name, kind: kindTx, opts: opts, tx: true, body: txBody(fn)})
	return decodeOutput[T](name, raw, err)
}

// txBody runs fn and writes the step's record in one transaction, fenced by
// the lease: exactly once.
func txBody[T any](fn func(ctx context.Context, tx pgx.Tx) (T, error)) func(context.Context, *attemptState) ([]byte, error) {
	return func(sctx context.Context, a *attemptState) ([]byte, error) {
		c := a.c
		var out []byte
		sent := time.Now()
		err := pgx.BeginFunc(sctx, c.e.pool, func(tx pgx.Tx) error {
			v, err := fn(sctx, tx)
			if err != nil {
				return err
			}
			if out, err = encodeOutput(v); err != nil {
				return err
			}
			cancel, err := store.WriteSteps(sctx, tx, c.runID, c.token, c.e.cfg.LeaseDuration, "", a.completed(out))
			c.noteCancel(cancel)
			return err
		})
		if err != nil {
			return nil, err // ErrLeaseLost ends the delivery; others follow the retry rules
		}
		a.recorded = true
		c.extendedAt(sent)
		return out, nil
	}
}
