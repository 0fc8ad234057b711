package engine

import (
	"context"
	"errors"
	"fmt"
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
// The record of a plain Step just before it, if not yet written, commits
// in the same transaction (nothing shows that step started: a crash before
// the commit runs it again, as Step promises). Any other record, an
// activity's outcome among them, is written before fn starts, so a slow
// transaction never holds it back.
//
// Cost: one transaction (BEGIN, fn's statements, the fenced record, COMMIT).
func TxStep[T any](ctx *Context, name string, fn func(ctx context.Context, tx pgx.Tx) (T, error), opts *StepOpts) (T, error) {
	raw, err := ctx.d.runStep(&stepCall{name: name, kind: KindTx, opts: opts, tx: true, body: txBody(fn),
		returnExhausted: opts != nil && opts.ReturnExhausted})
	return decodeOutput[T](name, raw, err)
}

// txBody runs fn and writes the step's record in one transaction, fenced by
// the lease: exactly once. It is the body of TxStep and GoTx alike; a
// TxStep's transaction also commits the previous step's buffered record
// (a.prev). fn runs in ctx (the attempt's context, which a cancellation
// cancels); BEGIN and COMMIT run in the delivery's, so a cancellation
// never cuts a commit short.
//
// When the commit's outcome is unknown (its reply was lost with the
// connection), the record decides: a completed record is never
// overwritten, so a retry whose own record write finds it rolls back and
// returns the recorded result. A transaction of an earlier attempt still
// committing holds the record's row lock; the retry waits for it.
func txBody[T any](fn func(ctx context.Context, tx pgx.Tx) (T, error)) func(context.Context, *attemptState) ([]byte, error) {
	return func(sctx context.Context, a *attemptState) ([]byte, error) {
		d := a.d
		var out []byte
		var fnDone, already bool
		prev := a.prev
		sent := time.Now()
		err := pgx.BeginFunc(d.ctx, d.e.pool, func(tx pgx.Tx) error {
			v, err := fn(sctx, tx)
			if err != nil {
				return err
			}
			var late *timeoutError
			if errors.As(context.Cause(sctx), &late) {
				// The attempt passed its timeout before fn returned: it
				// failed, and what fn wrote rolls back.
				return late
			}
			if out, err = encodeOutput(v, d.e.cfg.MaxPayloadBytes); err != nil {
				return err
			}
			rec, err := a.completed(out)
			if err != nil {
				return Permanent(err)
			}
			recs := []*store.StepRecord{rec}
			if prev != nil {
				recs = []*store.StepRecord{prev, rec}
			}
			w, err := store.WriteSteps(d.ctx, tx, d.fence(), "", recs...)
			written := w.Written
			d.noteCancel(w.CancelRequested)
			if err != nil {
				return err
			}
			if written < len(recs) { // the previous record always writes: this one is recorded already
				already = true
				return errAlreadyRecorded // roll this attempt's writes back
			}
			fnDone = true
			return nil
		})
		if err != nil && prev != nil {
			prev.Fresh = false // its insert may have committed: upsert it from now on
		}
		switch {
		case err == nil:
			a.recorded = true
			d.extendedAt(sent)
			d.progressed.Store(true)
			return out, nil
		case errors.Is(err, store.ErrLeaseLost):
			return nil, err
		case already || fnDone:
			rec, gerr := store.GetStep(d.ctx, d.e.pool, d.runID, a.seq)
			switch {
			case gerr == nil && rec.Status == store.StepCompleted:
				// The commit that recorded it (this attempt's or an
				// earlier one's) wrote prev too.
				a.recorded = true
				return rec.Output, nil
			case gerr != nil && !errors.Is(gerr, store.ErrNotFound):
				// Cannot tell whether the commit landed: end this delivery
				// like a crash; the next one reads the records.
				return nil, &outcomeUnknownError{err: fmt.Errorf("commit of tx step: %w; reading its record: %v", err, gerr)}
			}
		}
		return nil, err
	}
}

var errAlreadyRecorded = errors.New("step already recorded")

// outcomeUnknownError ends a delivery that cannot learn whether its last
// write committed.
type outcomeUnknownError struct{ err error }

func (e *outcomeUnknownError) Error() string { return e.err.Error() }
func (e *outcomeUnknownError) Unwrap() error { return e.err }
