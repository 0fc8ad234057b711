package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// twoPhaseSQL is the statement that makes Citus commit the transaction it
// runs in with two phases when the transaction wrote the coordinator
// (migration 33's two_phase_commit()): without it, Citus commits a
// transaction that wrote one worker node and the coordinator's own tables
// (River's tickets, a tx step's tables) in one phase, the worker node's
// part first, and a crash or a failed commit (a serialization failure)
// between the two keeps the worker node's part alone: a step's record
// without the step's writes, a run without its ticket.
func (s *Schema) twoPhaseSQL() string {
	base := s
	if s.base != nil {
		base = s.base
	}
	return "SELECT " + pgx.Identifier{base.name, "two_phase_commit"}.Sanitize() + "()"
}

// TwoPhase, on a Citus coordinator, makes the transaction open on db
// commit in two phases if it wrote the coordinator (one round trip); on
// plain PostgreSQL it does nothing. Run it last before COMMIT.
func TwoPhase(ctx context.Context, db DBTX) error {
	citus, err := onCitus(ctx, db)
	if err != nil || !citus {
		return err
	}
	if _, err := db.Exec(ctx, db.schema().twoPhaseSQL()); err != nil {
		return fmt.Errorf("asking Citus for a two-phase commit: %w", translate(err))
	}
	return nil
}

// TwoPhaseCaller, on a Citus coordinator, makes the caller's transaction
// open on db, into which the engine has written (a StartTx, SignalTx,
// CancelTx, ...), commit in two phases whatever the caller writes before
// or after the engine's call (one round trip); on plain PostgreSQL it does
// nothing. TwoPhase asks whether the transaction wrote the coordinator
// when it runs, which is right for the engine's own transactions but not
// for a caller's, whose rows may come after: then Citus would commit the
// engine's writes on the worker node in one phase, first, and a failed or
// crashed coordinator commit would keep them without the caller's rows (a
// delayed run for an order that was never written). So this updates the
// coordinator's Citus table unconditionally (no row), which Citus counts
// as a write of the coordinator. A transaction that then writes no
// coordinator table of the caller's pays a two-phase commit it did not
// need.
func TwoPhaseCaller(ctx context.Context, db DBTX) error {
	citus, err := onCitus(ctx, db)
	if err != nil || !citus {
		return err
	}
	base := db.schema().root()
	if _, err := db.Exec(ctx, `UPDATE `+pgx.Identifier{base.name, "two_phase_commits"}.Sanitize()+` SET id = id WHERE id = -1`); err != nil {
		return fmt.Errorf("asking Citus for a two-phase commit: %w", translate(err))
	}
	return nil
}

// OnCitus reports whether db's server is a Citus coordinator, learning it
// once per handle (a query the first time): the engine learns it when it
// starts, so that a tx step's commit, which needs it, never asks inside
// the step's transaction.
func OnCitus(ctx context.Context, db DBTX) (bool, error) { return onCitus(ctx, db) }

// InTx runs fn in a transaction begun on db and commits it (on Citus in
// two phases when it wrote the coordinator: see TwoPhase), or rolls it
// back when fn or the commit fails, as pgx.BeginFunc does.
func InTx(ctx context.Context, db DBTX, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := fn(tx); err != nil {
			return err
		}
		return TwoPhase(ctx, Bind(db, tx))
	})
}
