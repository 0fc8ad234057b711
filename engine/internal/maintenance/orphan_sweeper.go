package maintenance

import (
	"context"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// OrphanSweeper re-enqueues runs whose ticket River fetched more than a
// lease ago without the run ever being claimed: the process died between
// River's fetch and the claim. River's rescuer would take minutes.
type OrphanSweeper struct {
	// DB is the engine's pool, Queue its River queue (which lists the
	// stale tickets and takes the new ones), Log its Config.Logger.
	DB    DB
	Queue Queue
	Log   *slog.Logger
	// Lease is Config.LeaseDuration: a ticket running for longer than
	// this, whose run no delivery claimed since, is an orphan.
	Lease time.Duration
}

// Next: at the first tick, then once min(Lease/2, 5 s) has passed since
// the last pass began.
func (s *OrphanSweeper) Next(began, _ time.Time) time.Time {
	if began.IsZero() {
		return time.Time{}
	}
	return began.Add(min(s.Lease/2, 5*time.Second))
}

// RunOnce re-enqueues the orphans among the stale tickets.
func (s *OrphanSweeper) RunOnce(ctx context.Context) {
	if err := s.sweep(ctx); err != nil && ctx.Err() == nil {
		s.Log.Warn("orphaned delivery sweep failed", "error", err)
	}
}

func (s *OrphanSweeper) sweep(ctx context.Context) error {
	stale, err := s.Queue.StaleTickets(ctx, s.Lease)
	if err != nil || len(stale) == 0 {
		return err
	}
	var ids []uuid.UUID
	err = store.InTx(ctx, s.DB, func(tx pgx.Tx) error {
		ids, err = store.ReenqueueOrphans(ctx, store.Bind(s.DB, tx), stale, s.Lease)
		if err != nil {
			return err
		}
		return s.Queue.EnqueueMany(ctx, tx, ids)
	})
	for _, id := range ids {
		s.Log.Warn("delivery died before claiming the run; run re-enqueued", "run_id", id)
	}
	return err
}
